"""The errors a service's use cases raise for the API to answer (no FastAPI import).

A subclass names one HTTP status in ``status_code``; ``detail`` is the message the client reads, so it is
written for a person to act on and never quotes a raw data value. ``servicekit.handlers`` turns any of
them into ``{"detail": ...}`` with that status.

The errors both services raise are defined here once (``NotFound``, ``Conflict``, ``Unauthorized``,
``Forbidden``, ``QuotaExceeded``); each service's ``exceptions`` module re-exports them next to its own.
"""

from __future__ import annotations

from shared.errors import PoboError

__all__ = ["Conflict", "Forbidden", "NotFound", "QuotaExceeded", "ServiceError", "Unauthorized"]


class ServiceError(PoboError):
    """Base class; ``status_code`` is the HTTP status the API answers with; ``code``, when set, is sent in
    the ``Pobo-Error-Code`` header (``shared.errors.ERROR_CODE_HEADER``) for clients that act on it."""

    status_code = 500
    code: str | None = None

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Unauthorized(ServiceError):
    """No bearer token, or one the service does not know (answered with ``WWW-Authenticate: Bearer``)."""

    status_code = 401


class Forbidden(ServiceError):
    """The token is valid but may not do this."""

    status_code = 403


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    """The request conflicts with the current state (budget exhausted, query already answered, a study
    running, done or awaiting a measurement, ...)."""

    status_code = 409


class QuotaExceeded(ServiceError):
    """A quota is used up (the curator refuses further queries of a partner token)."""

    status_code = 429
