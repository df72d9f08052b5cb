"""The exception handlers both services install: one place maps an error to its HTTP answer.

* a service's own errors (:class:`~shared.servicekit.exceptions.ServiceError` subclasses): their
  ``status_code`` and ``detail``; 401 adds ``WWW-Authenticate: Bearer``, 503 adds ``Retry-After``;
* errors of the pure library (``shared.errors``) at the status each service chooses for them;
* a request that fails validation: the shared 422 body (``servicekit.errors``);
* the database down, a dropped connection or a busy SQLite file (``OperationalError``, ``InterfaceError``):
  503 with ``Retry-After: 5``; the pool's pre-ping reconnects by itself once the database is back;
* anything else: 500 with a fixed message, and the exception's type and stack in the log -- never its
  message, which may quote data.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

from shared.errors import ERROR_CODE_HEADER
from shared.servicekit.errors import validation_error_response
from shared.servicekit.exceptions import ServiceError

__all__ = ["RETRY_AFTER_SECONDS", "install_error_handlers"]

#: ``Retry-After`` of a 503 (the database or an upstream service is unavailable).
RETRY_AFTER_SECONDS = "5"


def _log_unexpected(logger: logging.Logger, request: Request, exc: BaseException) -> None:
    frames = "".join(traceback.format_tb(exc.__traceback__))
    logger.error("unhandled %s on %s %s\n%s", type(exc).__name__, request.method, request.url.path, frames)


def install_error_handlers(
    app: FastAPI,
    *,
    logger: logging.Logger,
    library_errors: Mapping[type[Exception], int] | None = None,
    unavailable_detail: str,
    unexpected_detail: str,
    database_error_detail: str | None = None,
) -> None:
    """Register the handlers of the module docstring on ``app``.

    ``library_errors``: other exception classes answered with ``str(exc)`` at the given status (the most
    specific class of an exception wins). ``unavailable_detail`` / ``unexpected_detail``: the bodies of the
    503 and the 500. ``database_error_detail``: a separate 500 body for any other database error (else it
    is an unexpected error like any other).
    """

    async def on_service_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        headers: dict[str, str] = {}
        if exc.status_code == 401:
            headers["WWW-Authenticate"] = "Bearer"
        elif exc.status_code == 503:  # the database (or the curator) is unavailable: retry shortly
            headers["Retry-After"] = RETRY_AFTER_SECONDS
        if exc.code is not None:
            headers[ERROR_CODE_HEADER] = exc.code
        if exc.status_code == 500:
            logger.error("%s: %s", type(exc).__name__, exc.detail)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers or None)

    app.add_exception_handler(ServiceError, on_service_error)

    for error_class, status_code in (library_errors or {}).items():

        async def on_library_error(
            _request: Request, exc: Exception, status_code: int = status_code
        ) -> JSONResponse:
            return JSONResponse({"detail": str(exc)}, status_code=status_code)

        app.add_exception_handler(error_class, on_library_error)

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_error_response(exc)

    app.add_exception_handler(RequestValidationError, on_validation_error)

    async def on_database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        logger.warning(
            "database unavailable on %s %s: %s %s",
            request.method,
            request.url.path,
            type(exc).__name__,
            getattr(getattr(exc, "orig", None), "sqlstate", ""),
        )
        return JSONResponse(
            {"detail": unavailable_detail}, status_code=503, headers={"Retry-After": RETRY_AFTER_SECONDS}
        )

    app.add_exception_handler(OperationalError, on_database_unavailable)
    app.add_exception_handler(InterfaceError, on_database_unavailable)

    if database_error_detail is not None:

        async def on_database_error(request: Request, exc: Exception) -> JSONResponse:
            _log_unexpected(logger, request, exc)
            return JSONResponse({"detail": database_error_detail}, status_code=500)

        app.add_exception_handler(SQLAlchemyError, on_database_error)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        _log_unexpected(logger, request, exc)
        return JSONResponse({"detail": unexpected_detail}, status_code=500)

    app.add_exception_handler(Exception, on_unexpected)
