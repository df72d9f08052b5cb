"""Errors of the curator's use cases; ``shared.servicekit.handlers`` answers each with its HTTP
status.

Messages are for a person to act on. They never contain a raw data value of a dataset, and what a partner
can trigger never mentions curator-private diagnostics such as sigma_min.
"""

from __future__ import annotations

from shared.servicekit.exceptions import ServiceError


class CuratorError(ServiceError):
    """Base class of the curator's errors; ``status_code`` is the HTTP status it maps to."""


class InvalidInput(CuratorError):
    """The request is well-formed but its content is unusable (a bad CSV cell, an unknown column, ...)."""

    status_code = 422


class BadRequest(CuratorError):
    status_code = 400


class Unauthorized(CuratorError):
    status_code = 401


class Forbidden(CuratorError):
    status_code = 403


class NotFound(CuratorError):
    status_code = 404


class Conflict(CuratorError):
    """The request conflicts with the current state (budget exhausted, query already answered, ...)."""

    status_code = 409


class PayloadTooLarge(CuratorError):
    status_code = 413


class QuotaExceeded(CuratorError):
    status_code = 429


class StorageCorrupted(CuratorError):
    """A stored array no longer matches its recorded sha256 (the file was altered or damaged)."""

    status_code = 500
