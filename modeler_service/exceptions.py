"""Errors of the modeler's use cases; ``shared.servicekit.handlers`` answers each with its HTTP status.

The errors both services raise (``NotFound``, ``Conflict``, ``Unauthorized``, ``Forbidden``,
``QuotaExceeded``) are ``shared.servicekit.exceptions``'s, re-exported here; the modeler's own follow.
"""

from __future__ import annotations

from shared.servicekit.exceptions import (
    Conflict,
    Forbidden,
    NotFound,
    QuotaExceeded,
    ServiceError,
    Unauthorized,
)

__all__ = [
    "Conflict",
    "Forbidden",
    "ModelerError",
    "NotFound",
    "QuotaExceeded",
    "StorageError",
    "Unauthorized",
    "Unprocessable",
    "UpstreamError",
]

#: Any error of the modeler's use cases, the shared ones included: the modeler's name for servicekit's
#: base class (``except ModelerError`` catches every error the API answers with its own status).
ModelerError = ServiceError


class Unprocessable(ServiceError):
    status_code = 422


class UpstreamError(ServiceError):
    """The curator failed or answered something inconsistent (sha256 mismatch, wrong row)."""

    status_code = 502


class StorageError(ServiceError):
    status_code = 503
