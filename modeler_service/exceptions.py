"""Errors of the modeler's use cases; ``shared.servicekit.handlers`` answers each with its HTTP status."""

from __future__ import annotations

from shared.errors import PoboError
from shared.servicekit.exceptions import ServiceError


class ModelerError(ServiceError, PoboError):
    """Base class of the modeler's errors; ``status_code`` is the HTTP status the API answers with."""


class NotFound(ModelerError):
    status_code = 404


class Conflict(ModelerError):
    """The study is not in a state that allows the request (running, done, awaiting a measurement)."""

    status_code = 409


class QuotaExceeded(ModelerError):
    """The curator refuses further queries: the partner's quota is used up."""

    status_code = 429


class Unprocessable(ModelerError):
    status_code = 422


class UpstreamError(ModelerError):
    """The curator failed or answered something inconsistent (sha256 mismatch, wrong row)."""

    status_code = 502


class StorageError(ModelerError):
    status_code = 503


class Unauthorized(ModelerError):
    status_code = 401


class Forbidden(ModelerError):
    status_code = 403
