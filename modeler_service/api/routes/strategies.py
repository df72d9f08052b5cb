"""``GET /v1/strategies``: the registry of optimisation strategies a study can run."""

from __future__ import annotations

from fastapi import APIRouter

from modeler_service import service
from modeler_service.schemas import StrategiesPublic

router = APIRouter(prefix="/v1/strategies", tags=["strategies"])


@router.get("", summary="The strategies a study can run, with their parameters")
def list_strategies() -> StrategiesPublic:
    """Each strategy's name, description and the JSON schema of its ``strategy_params`` (what
    ``POST /v1/studies`` validates them against)."""
    return service.strategies()
