"""``GET /healthz`` of both services: open (no token), 200 when the database answers, 503 when it does not.

A load balancer or an orchestrator's probe reads the status code; the body says which part failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from shared.servicekit.db import Database
from shared.servicekit.health_schema import Health

__all__ = ["health_router"]


def health_router(
    database: Callable[[Request], Database], *, tag: str, service: Literal["curator", "modeler"]
) -> APIRouter:
    """A router with ``GET /healthz`` (under ``tag`` in the OpenAPI document); ``database(request)`` is the
    service's :class:`~shared.servicekit.db.Database`; the body names the ``service``."""
    router = APIRouter(tags=[tag])

    @router.get(
        "/healthz",
        response_model=Health,
        summary="Liveness and database reachability",
        responses={503: {"model": Health, "description": "The database does not answer."}},
    )
    def healthz(request: Request) -> Health | JSONResponse:
        if database(request).ping():
            return Health(status="ok", database="ok", service=service)
        body = Health(status="unavailable", database="unreachable", service=service)
        return JSONResponse(body.model_dump(), status_code=503)

    return router
