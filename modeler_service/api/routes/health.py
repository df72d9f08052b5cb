"""``GET /healthz``: open, reports database reachability (503 when the database is unreachable)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from modeler_service.api.deps import ContextDep
from modeler_service.schemas import Health

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, summary="Liveness and database reachability")
def healthz(ctx: ContextDep, response: Response) -> Health:
    if ctx.db.ping():
        return Health(status="ok", database="ok")
    response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return Health(status="unavailable", database="unreachable")
