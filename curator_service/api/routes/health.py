"""GET /healthz: open, reports whether the database answers."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from curator_service.api.deps import ComponentsDep
from curator_service.schemas import Health

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=Health,
    summary="Liveness and database reachability",
    responses={503: {"model": Health, "description": "The database does not answer."}},
)
def healthz(components: ComponentsDep) -> Health | JSONResponse:
    if components.db.ping():
        return Health(status="ok", database="ok")
    body = Health(status="unavailable", database="unreachable")
    return JSONResponse(body.model_dump(), status_code=503)
