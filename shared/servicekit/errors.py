"""The error bodies both services send: ``{"detail": "<message for a person>"}``, and for a request that fails
validation also ``errors``, one entry per invalid field. Written once here so that the two services' 422s
have one documented shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from shared.servicekit.openapi import override_component_schema

__all__ = ["API_VERSION", "document_validation_errors", "validation_error_response"]

#: The version string of both services' OpenAPI documents (the HTTP API, not the package).
API_VERSION = "1.0.0"


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    """422 ``{"detail": "invalid request: <section> field '<name>': <what is wrong>; ...", "errors": [...]}``.

    Each error keeps ``loc``, ``msg`` and ``type`` only: the rejected input is never echoed (it may be a
    token).
    """
    errors: list[dict[str, Any]] = []
    parts: list[str] = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        section = loc[0] if loc else "request"
        message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if len(loc) > 1:
            parts.append(f"{section} field '{'.'.join(loc[1:])}': {message}")
        else:  # a check across fields (a model validator): no single field to name
            parts.append(f"{section}: {message}")
        errors.append({"loc": loc, "msg": message, "type": err.get("type")})
    return JSONResponse({"detail": "invalid request: " + "; ".join(parts), "errors": errors}, status_code=422)


def document_validation_errors(app: FastAPI) -> None:
    """Make the OpenAPI 422 body the one ``validation_error_response`` sends (also used, with ``detail``
    only, for a well-formed request refused on meaning)."""
    override_component_schema(
        app,
        "HTTPValidationError",
        {
            "title": "HTTPValidationError",
            "type": "object",
            "required": ["detail"],
            "properties": {
                "detail": {"type": "string", "description": "What is wrong, for a person to act on."},
                "errors": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": "Each invalid field: loc, msg, type (the input is never echoed).",
                },
            },
        },
    )
