"""Populations: the people behind the datasets, their one budget and its ledger (admin only)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from curator_service.api.deps import AdminDep, RowId, SessionDep
from curator_service.services import populations as population_service
from shared.protocol.schemas import LedgerPublic, PopulationPublic, PopulationsPublic

router = APIRouter(tags=["populations"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid token."},
    403: {"description": "A partner token (this endpoint is admin-only)."},
}


@router.get(
    "/v1/populations",
    response_model=PopulationsPublic,
    summary="Populations: the people behind the datasets, and their budgets (admin)",
    responses=_ERRORS,
)
def list_populations(_admin: AdminDep, session: SessionDep) -> PopulationsPublic:
    data = population_service.views(session, population_service.list_populations(session))
    return PopulationsPublic(data=data, count=len(data))


@router.get(
    "/v1/populations/{population_id}",
    response_model=PopulationPublic,
    summary="One population: its datasets, budget, spent (and the PLD-composed epsilon)",
    responses={**_ERRORS, 404: {"description": "No such population."}},
)
def get_population(population_id: RowId, _admin: AdminDep, session: SessionDep) -> PopulationPublic:
    return population_service.public(session, population_id)


@router.get(
    "/v1/populations/{population_id}/ledger",
    response_model=LedgerPublic,
    summary="A population's ledger",
    responses={**_ERRORS, 404: {"description": "No such population."}},
)
def population_ledger(population_id: RowId, _admin: AdminDep, session: SessionDep) -> LedgerPublic:
    return population_service.ledger_public(session, population_id)
