"""The base class of the errors a service's use cases raise for the API to answer (no FastAPI import).

A subclass names one HTTP status in ``status_code``; ``detail`` is the message the client reads, so it is
written for a person to act on and never quotes a raw data value. ``servicekit.handlers`` turns any of
them into ``{"detail": ...}`` with that status.
"""

from __future__ import annotations

__all__ = ["ServiceError"]


class ServiceError(Exception):
    """Base class; ``status_code`` is the HTTP status the API answers with."""

    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
