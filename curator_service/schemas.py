"""Pydantic bodies of the curator API: the public ones live in ``shared.schemas`` (clients import them);
this module re-exports them, adds the curator-only ones and converts ORM rows to bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from curator_service.models import AccessLog, Dataset, LedgerEntry, Partner, Query, Release
from curator_service.service import scaling_public
from shared.schemas import (
    AccessLogEntry,
    AccessLogPublic,
    DatasetPublic,
    DatasetsPublic,
    GrantCreate,
    Health,
    PartnerCreate,
    PartnerCreated,
    PartnerPublic,
    PartnersPublic,
    PrivacyReport,
    PrivacyRow,
    QueriesPublic,
    QueryCreate,
    QueryPublic,
    QueryResult,
    ReleaseCreate,
    ReleaseDetail,
    ReleasePublic,
    ReleaseRows,
    ReleasesPublic,
    ScalingInfo,
)

__all__ = [
    "AccessLogEntry",
    "AccessLogPublic",
    "DatasetPublic",
    "DatasetsPublic",
    "GrantCreate",
    "Health",
    "LedgerEntryPublic",
    "LedgerPublic",
    "PartnerCreate",
    "PartnerCreated",
    "PartnerPublic",
    "PartnersPublic",
    "PrivacyReport",
    "PrivacyRow",
    "QueriesPublic",
    "QueryCreate",
    "QueryPublic",
    "QueryResult",
    "ReleaseCreate",
    "ReleaseDetail",
    "ReleasePublic",
    "ReleaseRows",
    "ReleasesPublic",
    "ScalingInfo",
]


class LedgerEntryPublic(BaseModel):
    id: int
    release_id: int | None
    epsilon: float
    delta: float
    status: Literal["reserved", "spent"]
    created_at: datetime


class LedgerPublic(BaseModel):
    dataset_id: int
    epsilon_budget: float
    delta_budget: float
    epsilon_spent: float
    delta_spent: float
    entries: list[LedgerEntryPublic]


def dataset_public(ds: Dataset, spent: tuple[float, float]) -> DatasetPublic:
    return DatasetPublic(
        id=ds.id,
        name=ds.name,
        n=ds.n,
        d=ds.d,
        features=list(ds.features),
        objective=ds.objective,
        objective_mode=ds.objective_mode,  # type: ignore[arg-type]
        noise_std=ds.noise_std,
        scaling=ScalingInfo(**scaling_public(ds.scaling)),
        sha256=ds.csv_sha256,
        features_sha256=ds.features_sha256,
        epsilon_budget=ds.epsilon_budget,
        delta_budget=ds.delta_budget,
        epsilon_spent=spent[0],
        delta_spent=spent[1],
        created_at=ds.created_at,
    )


def release_public(rel: Release) -> ReleasePublic:
    """The partner's view: public parameters only (no sigma_min, no lifted, no scaling)."""
    return ReleasePublic(
        id=rel.id,
        dataset_id=rel.dataset_id,
        n=rel.n,
        r=rel.r,
        epsilon=rel.epsilon,
        delta=rel.delta,
        lift=rel.lift,  # type: ignore[arg-type]
        omega=rel.omega,
        sha256=rel.sha256,
        created_at=rel.created_at,
    )


def release_detail(rel: Release) -> ReleaseDetail:
    return ReleaseDetail(
        **release_public(rel).model_dump(),
        lifted=rel.lifted,
        sigma_min=rel.sigma_min,
        scaling=ScalingInfo(**scaling_public(rel.scaling)),
        formal_guarantee=rel.formal_guarantee,
    )


def partner_public(p: Partner, release_ids: list[int]) -> PartnerPublic:
    return PartnerPublic(
        id=p.id,
        name=p.name,
        release_ids=release_ids,
        max_queries=p.max_queries,
        queries_used=p.queries_used,
        revoked=p.revoked_at is not None,
        created_at=p.created_at,
    )


def query_public(q: Query) -> QueryPublic:
    return QueryPublic(
        id=q.id,
        release_id=q.release_id,
        partner_id=q.partner_id,
        index=q.row_index,
        status=q.status,  # type: ignore[arg-type]
        y=q.y,
        idempotency_key=q.idempotency_key,
        created_at=q.created_at,
        completed_at=q.completed_at,
    )


def ledger_entry_public(e: LedgerEntry) -> LedgerEntryPublic:
    return LedgerEntryPublic(
        id=e.id,
        release_id=e.release_id,
        epsilon=e.epsilon,
        delta=e.delta,
        status=e.status,  # type: ignore[arg-type]
        created_at=e.created_at,
    )


def access_entry(a: AccessLog) -> AccessLogEntry:
    return AccessLogEntry(
        id=a.id,
        at=a.at,
        actor=a.actor,
        partner_id=a.partner_id,
        method=a.method,
        path=a.path,
        status_code=a.status_code,
        duration_ms=a.duration_ms,
    )
