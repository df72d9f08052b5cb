"""ORM rows to the curator API's bodies. The bodies themselves are the wire schemas in
``shared.protocol.schemas`` (clients import them too); import them from there."""

from __future__ import annotations

from collections.abc import Sequence

from curator_service.models import (
    AccessLog,
    Dataset,
    LedgerEntry,
    Partner,
    Population,
    Query,
    QueryCorrection,
    Release,
)
from curator_service.services.answers import AnsweredQuery
from curator_service.services.outputs import public_of
from curator_service.services.scaling import scaling_public
from shared.protocol.schemas import (
    AccessLogEntry,
    DatasetPublic,
    LedgerEntryPublic,
    PartnerPublic,
    PopulationPublic,
    QueryCorrectionPublic,
    QueryPublic,
    ReferenceColumn,
    ReleaseDetail,
    ReleasePublic,
    ScalingInfo,
)

__all__ = [
    "access_entry",
    "correction_public",
    "dataset_public",
    "ledger_entry_public",
    "partner_public",
    "population_public",
    "query_public",
    "release_detail",
    "release_public",
]


def dataset_public(ds: Dataset, population: Population, spent: tuple[float, float]) -> DatasetPublic:
    return DatasetPublic(
        id=ds.id,
        name=ds.name,
        population_id=population.id,
        population_name=population.name,
        population_reason=ds.population_reason,
        n=ds.n,
        d=ds.d,
        features=list(ds.features),
        objective=ds.objective,
        objective_mode=ds.objective_mode,  # type: ignore[arg-type]
        noise_std=ds.noise_std,
        scaling=ScalingInfo(**scaling_public(ds.scaling)),
        sha256=ds.csv_sha256,
        features_sha256=ds.features_sha256,
        epsilon_budget=population.epsilon_budget,
        delta_budget=population.delta_budget,
        epsilon_spent=spent[0],
        delta_spent=spent[1],
        rows_per_person=ds.rows_per_person,
        reference_factor=ds.reference_factor,
        acknowledged_distinct_people=ds.acknowledged_distinct_people,
        id_column=ds.id_column,
        created_at=ds.created_at,
        erased_at=ds.erased_at,
    )


def population_public(
    p: Population,
    dataset_ids: list[int],
    spent: tuple[float, float],
    epsilon_pld: float | None = None,
    *,
    formal: bool = True,
    smallest_n: int | None = None,
) -> PopulationPublic:
    return PopulationPublic(
        id=p.id,
        name=p.name,
        dataset_ids=dataset_ids,
        epsilon_budget=p.epsilon_budget,
        delta_budget=p.delta_budget,
        epsilon_spent=spent[0],
        delta_spent=spent[1],
        epsilon_pld=epsilon_pld if formal else None,
        formal_guarantee=formal,
        smallest_n=smallest_n,
        reference=[
            ReferenceColumn(feature=r["name"], scale=float(r["scale"]), dataset_id=int(r["dataset_id"]))
            for r in (p.reference or [])
        ],
        created_at=p.created_at,
    )


def release_public(rel: Release) -> ReleasePublic:
    """The partner's view: public parameters only (no sigma_min, no lifted, no scaling)."""
    return ReleasePublic(
        id=rel.id,
        dataset_id=rel.dataset_id,
        mechanism=rel.mechanism,  # type: ignore[arg-type]
        formal_guarantee=rel.formal_guarantee,
        n=rel.n,
        r=rel.r,
        epsilon=rel.epsilon,
        delta=rel.delta,
        noise_std=rel.noise_std,
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
        allow_large_delta=rel.allow_large_delta,
        acknowledged_no_guarantee=rel.acknowledged_no_guarantee,
    )


def partner_public(p: Partner, grants: tuple[list[int], list[int]]) -> PartnerPublic:
    """``grants``: (release ids, gradient oracle ids)."""
    release_ids, oracle_ids = grants
    return PartnerPublic(
        id=p.id,
        name=p.name,
        release_ids=release_ids,
        max_queries=p.max_queries,
        queries_used=p.queries_used,
        revoked=p.revoked_at is not None,
        created_at=p.created_at,
        output_privacy=public_of(p),
        gradient_oracle_ids=oracle_ids,
    )


def correction_public(c: QueryCorrection, *, admin: bool = False) -> QueryCorrectionPublic:
    """A correction as the admin sees it (with its reason), or as the query's partner does."""
    return QueryCorrectionPublic(
        id=c.id,
        query_id=c.query_id,
        release_id=c.release_id,
        kind=c.kind,  # type: ignore[arg-type]
        previous_y=c.previous_y,
        y=c.y,
        charged_epsilon=c.charged_epsilon,
        created_at=c.created_at,
        chain_seq=c.chain_seq,
        reason=c.reason if admin else None,
    )


def query_public(
    q: Query | AnsweredQuery, *, admin: bool = False, corrections: Sequence[QueryCorrection] = ()
) -> QueryPublic:
    """A query as its partner sees it, or, with ``admin``, as the curator does (``cached`` and
    ``delivered_at`` set). ``corrections``: the ones the viewer may see (a partner: its supersessions)."""
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
        charged_epsilon=q.charged_epsilon,
        cached=(q.source_query_id is not None) if admin else None,
        corrections=[correction_public(c, admin=admin) for c in corrections],
        delivered_at=getattr(q, "delivered_at", None) if admin else None,
    )


def ledger_entry_public(e: LedgerEntry) -> LedgerEntryPublic:
    return LedgerEntryPublic(
        id=e.id,
        dataset_id=e.dataset_id,
        release_id=e.release_id,
        gradient_oracle_id=e.gradient_oracle_id,
        mechanism=e.mechanism,
        epsilon=e.epsilon,
        delta=e.delta,
        nominal_epsilon=e.nominal_epsilon if e.nominal_epsilon is not None else e.epsilon,
        formal_guarantee=e.formal_guarantee,
        native=e.native,
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
