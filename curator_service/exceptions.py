"""Errors of the curator's use cases; ``shared.servicekit.handlers`` answers each with its HTTP
status.

The errors both services raise (``NotFound``, ``Conflict``, ``Unauthorized``, ``Forbidden``,
``QuotaExceeded``) are ``shared.servicekit.exceptions``'s, re-exported here; the curator's own follow.
Every one is a :class:`~shared.servicekit.exceptions.ServiceError`.

Messages are for a person to act on. They never contain a raw data value of a dataset, and what a partner
can trigger never mentions curator-private diagnostics such as sigma_min.
"""

from __future__ import annotations

from shared.errors import ROW_UNAFFORDABLE
from shared.servicekit.exceptions import (
    Conflict,
    Forbidden,
    NotFound,
    QuotaExceeded,
    ServiceError,
    Unauthorized,
)

__all__ = [
    "BadRequest",
    "Conflict",
    "Forbidden",
    "Gone",
    "InvalidInput",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RowUnaffordable",
    "StorageCorrupted",
    "Unauthorized",
]


class InvalidInput(ServiceError):
    """The request is well-formed but its content is unusable (a bad CSV cell, an unknown column, ...)."""

    status_code = 422


class BadRequest(ServiceError):
    status_code = 400


class Gone(ServiceError):
    """The dataset behind the request was erased (``DELETE /v1/datasets/{id}``): its data will not return."""

    status_code = 410


class PayloadTooLarge(ServiceError):
    status_code = 413


class StorageCorrupted(ServiceError):
    """A stored array no longer matches its recorded sha256 (the file was altered or damaged)."""

    status_code = 500


class RowUnaffordable(Conflict):
    """A grant's per-person output allotment leaves no room for one more answer about a row's person
    (``services.outputs.admit``): 409, nothing charged, with ``Pobo-Error-Code: row-unaffordable``, so that
    the modeler excludes the row and goes on (``GET /v1/releases/{id}/exclusions`` lists every such row)."""

    code = ROW_UNAFFORDABLE
