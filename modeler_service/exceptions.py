"""Errors of the modeler's use cases; ``main.py`` maps them to HTTP in one place."""

from __future__ import annotations

from shared.errors import PoboError


class ModelerError(PoboError):
    """Base class; ``status_code`` is the HTTP status the API answers with."""

    status_code = 500

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


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
