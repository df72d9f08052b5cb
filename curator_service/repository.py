"""Every database query of the curator service but those of output privacy (``output_repository.py``) and
the answers' hot path (``answer_repository.py``): services call these; nothing else builds SQL.

The statements of the query hot path (authentication, the granted release, the idempotency lookup, the
quota charge, the access log; the output charge in ``output_repository``) are built once, with bind
parameters, at import: SQLAlchemy then neither rebuilds them nor recomputes their cache keys per request
(half their Python cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, delete, func, insert, select, text, update
from sqlalchemy.orm import Session

from curator_service.models import (
    AccessLog,
    Dataset,
    Grant,
    LedgerEntry,
    Partner,
    PartnerToken,
    Population,
    Query,
    Release,
    utcnow,
)

# ---------------------------------------------------------------------------------------------- datasets


def add(session: Session, obj: object) -> None:
    session.add(obj)
    session.flush()


def get_dataset(session: Session, dataset_id: int) -> Dataset | None:
    return session.get(Dataset, dataset_id)


def list_datasets(session: Session) -> Sequence[Dataset]:
    return session.scalars(select(Dataset).order_by(Dataset.id)).all()


def set_sigma_min(session: Session, dataset_id: int, sigma_min: float) -> None:
    session.execute(
        update(Dataset)
        .where(Dataset.id == dataset_id, Dataset.sigma_min.is_(None))
        .values(sigma_min=sigma_min)
    )


def all_array_paths(session: Session) -> set[str]:
    paths: set[str] = set()
    for feat, out, ids in session.execute(
        select(Dataset.features_path, Dataset.outcomes_path, Dataset.ids_path).where(
            Dataset.erased_at.is_(None)
        )
    ):
        paths.add(feat)
        paths.update(p for p in (out, ids) if p)
    paths.update(session.scalars(select(Release.z_path).where(Release.erased_at.is_(None))))
    return paths


def datasets_with_rows(session: Session, n: int) -> Sequence[Dataset]:
    """Datasets of exactly n rows (candidates for "the same people" at upload)."""
    return session.scalars(select(Dataset).where(Dataset.n == n).order_by(Dataset.id)).all()


# ------------------------------------------------------------------------------------------- populations

#: Serialises "find or create the population" across concurrent uploads on PostgreSQL ("pobopopu").
_POPULATION_LOCK_KEY = 0x706F626F_706F7075


def lock_population_lookup(session: Session) -> None:
    """Hold, until the transaction ends, the right to look a population up and create it if missing.

    PostgreSQL: a transaction-scoped advisory lock. SQLite: the upload's write session already holds the
    database write lock (``BEGIN IMMEDIATE``), which serialises the same way.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _POPULATION_LOCK_KEY})


def get_population(session: Session, population_id: int) -> Population | None:
    return session.get(Population, population_id)


def get_population_by_name(session: Session, name: str) -> Population | None:
    return session.scalars(select(Population).where(Population.name == name)).one_or_none()


def lock_population(session: Session, population_id: int) -> Population | None:
    """The population row, locked for the rest of the transaction.

    PostgreSQL: ``SELECT ... FOR UPDATE`` (concurrent ledger transactions on one population queue here, even
    when they release different datasets of it). SQLite: the clause is ignored; the caller's write session
    (``BEGIN IMMEDIATE``) holds the database write lock for the whole transaction, which serialises the same
    way.
    """
    stmt = select(Population).where(Population.id == population_id).with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def list_populations(session: Session) -> Sequence[Population]:
    return session.scalars(select(Population).order_by(Population.id)).all()


def datasets_of_population(session: Session, population_id: int) -> Sequence[Dataset]:
    return session.scalars(
        select(Dataset).where(Dataset.population_id == population_id).order_by(Dataset.id)
    ).all()


def smallest_n(session: Session, population_id: int) -> int:
    """The fewest rows of any dataset of the population (1/n of it bounds the population's total delta)."""
    value = session.scalar(select(func.min(Dataset.n)).where(Dataset.population_id == population_id))
    return int(value or 0)


def smallest_n_by_population(session: Session) -> dict[int, int]:
    rows = session.execute(select(Dataset.population_id, func.min(Dataset.n)).group_by(Dataset.population_id))
    return {int(pid): int(n) for pid, n in rows}


def dataset_ids_by_population(session: Session) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid, did in session.execute(select(Dataset.population_id, Dataset.id).order_by(Dataset.id)):
        out.setdefault(int(pid), []).append(int(did))
    return out


# ------------------------------------------------------------------------------------------------ ledger


def ledger_totals(session: Session, population_id: int) -> tuple[float, float]:
    """(sum of epsilons, sum of deltas) of every reserved or spent entry: basic composition."""
    eps, delta = session.execute(
        select(
            func.coalesce(func.sum(LedgerEntry.epsilon), 0.0), func.coalesce(func.sum(LedgerEntry.delta), 0.0)
        ).where(LedgerEntry.population_id == population_id)
    ).one()
    return float(eps), float(delta)


def ledger_totals_by_population(session: Session) -> dict[int, tuple[float, float]]:
    rows = session.execute(
        select(
            LedgerEntry.population_id, func.sum(LedgerEntry.epsilon), func.sum(LedgerEntry.delta)
        ).group_by(LedgerEntry.population_id)
    ).all()
    return {int(pid): (float(e), float(d)) for pid, e, d in rows}


def population_has_unproven_charge(session: Session, population_id: int) -> bool:
    """Whether any charge of the population carried no proven guarantee (Algorithm 1, large delta, ...)."""
    found = session.scalar(
        select(LedgerEntry.id)
        .where(LedgerEntry.population_id == population_id, LedgerEntry.formal_guarantee.is_(False))
        .limit(1)
    )
    return found is not None


def populations_with_unproven_charges(session: Session) -> set[int]:
    rows = session.scalars(
        select(LedgerEntry.population_id).where(LedgerEntry.formal_guarantee.is_(False)).distinct()
    )
    return {int(pid) for pid in rows}


def get_ledger_entry(session: Session, entry_id: int) -> LedgerEntry | None:
    return session.get(LedgerEntry, entry_id)


def delete_ledger_entry(session: Session, entry_id: int) -> None:
    session.execute(delete(LedgerEntry).where(LedgerEntry.id == entry_id, LedgerEntry.status == "reserved"))


def list_ledger(session: Session, population_id: int) -> Sequence[LedgerEntry]:
    return session.scalars(
        select(LedgerEntry).where(LedgerEntry.population_id == population_id).order_by(LedgerEntry.id)
    ).all()


# ---------------------------------------------------------------------------------------------- releases


def get_release(session: Session, release_id: int) -> Release | None:
    return session.get(Release, release_id)


_GRANTED_RELEASE = select(Release).where(
    Release.id == bindparam("release_id"),
    select(Grant.id)
    .where(Grant.partner_id == bindparam("partner_id"), Grant.release_id == bindparam("release_id"))
    .exists(),
)


def get_granted_release(session: Session, release_id: int, partner_id: int) -> Release | None:
    """The release if it exists and is granted to the partner (one statement), else None."""
    params = {"release_id": release_id, "partner_id": partner_id}
    return session.scalars(_GRANTED_RELEASE, params).one_or_none()


def list_releases(
    session: Session, *, dataset_id: int | None = None, ids: Sequence[int] | None = None
) -> Sequence[Release]:
    stmt = select(Release).order_by(Release.id)
    if dataset_id is not None:
        stmt = stmt.where(Release.dataset_id == dataset_id)
    if ids is not None:
        stmt = stmt.where(Release.id.in_(list(ids)))
    return session.scalars(stmt).all()


def existing_release_ids(session: Session, ids: Sequence[int]) -> set[int]:
    if not ids:
        return set()
    return set(session.scalars(select(Release.id).where(Release.id.in_(list(ids)))))


# ---------------------------------------------------------------------------------------------- partners


def get_partner(session: Session, partner_id: int) -> Partner | None:
    return session.get(Partner, partner_id)


_PARTNER_BY_TOKEN_HASH = (
    select(Partner, PartnerToken)
    .join(PartnerToken, PartnerToken.partner_id == Partner.id)
    .where(PartnerToken.token_hash == bindparam("token_hash"))
)


def get_partner_by_token_hash(session: Session, token_hash: str) -> tuple[Partner, PartnerToken] | None:
    """The partner holding the token with this digest, and the token's row (revoked or not)."""
    row = session.execute(_PARTNER_BY_TOKEN_HASH, {"token_hash": token_hash}).one_or_none()
    return None if row is None else (row[0], row[1])


def partner_tokens(session: Session, partner_id: int) -> list[PartnerToken]:
    return list(
        session.scalars(
            select(PartnerToken).where(PartnerToken.partner_id == partner_id).order_by(PartnerToken.id)
        )
    )


def list_partners(session: Session) -> Sequence[Partner]:
    return session.scalars(select(Partner).order_by(Partner.id)).all()


def revoke_partner(session: Session, partner_id: int, at: datetime) -> None:
    session.execute(update(Partner).where(Partner.id == partner_id).values(revoked_at=at))


def granted_release_ids(session: Session, partner_id: int) -> list[int]:
    return list(
        session.scalars(
            select(Grant.release_id).where(Grant.partner_id == partner_id).order_by(Grant.release_id)
        )
    )


def granted_populations(session: Session, partner_id: int) -> dict[int, int]:
    """{population id: the first dataset id} of the releases the partner was granted, by population id."""
    rows = session.execute(
        select(Dataset.population_id, func.min(Dataset.id))
        .join(Release, Release.dataset_id == Dataset.id)
        .join(Grant, Grant.release_id == Release.id)
        .where(Grant.partner_id == partner_id)
        .group_by(Dataset.population_id)
        .order_by(Dataset.population_id)
    ).all()
    return {int(pid): int(did) for pid, did in rows}


def grants_by_partner(session: Session) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid, rid in session.execute(select(Grant.partner_id, Grant.release_id).order_by(Grant.release_id)):
        out.setdefault(int(pid), []).append(int(rid))
    return out


def add_grants(session: Session, partner_id: int, release_ids: Sequence[int]) -> None:
    have = set(granted_release_ids(session, partner_id))
    for rid in dict.fromkeys(release_ids):
        if rid not in have:
            session.add(Grant(partner_id=partner_id, release_id=rid))
    session.flush()


def charge_quota(session: Session, partner_id: int) -> bool:
    """Atomically take one query from the partner's quota; False when it is used up.

    A single conditional UPDATE: on PostgreSQL concurrent chargers queue on the row lock and re-check the
    condition; on SQLite the write session's BEGIN IMMEDIATE serialises them. (The same statement runs on
    the driver's cursor in the Core answer path, ``answer_repository``.)
    """
    result = session.connection().execute(CHARGE_QUOTA, {"partner_id": partner_id})
    return bool(result.rowcount == 1)


_PARTNERS = cast(Table, Partner.__table__)
CHARGE_QUOTA = (
    update(_PARTNERS)
    .where(_PARTNERS.c.id == bindparam("partner_id"), _PARTNERS.c.queries_used < _PARTNERS.c.max_queries)
    .values(queries_used=_PARTNERS.c.queries_used + 1)
)


# ----------------------------------------------------------------------------------------------- queries


def get_query(session: Session, query_id: int) -> Query | None:
    return session.get(Query, query_id)


def refresh_query(session: Session, query_id: int) -> Query | None:
    """Re-read a query from the database (bypassing the session's identity map)."""
    return session.execute(
        select(Query).where(Query.id == query_id).execution_options(populate_existing=True)
    ).scalar_one_or_none()


_QUERY_BY_KEY = (
    select(Query)
    .where(Query.partner_id == bindparam("partner_id"), Query.idempotency_key == bindparam("key"))
    .execution_options(populate_existing=True)
)


def get_query_by_key(session: Session, partner_id: int, key: str) -> Query | None:
    return session.execute(_QUERY_BY_KEY, {"partner_id": partner_id, "key": key}).scalar_one_or_none()


def complete_query(session: Session, query_id: int, y: float, *, y_raw: float | None = None) -> bool:
    """Set the outcome of a pending query; False if it was already complete (first writer wins)."""
    result = session.execute(
        update(Query)
        .where(Query.id == query_id, Query.status == "pending")
        .values(status="complete", y=y, y_raw=y_raw, completed_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def chained_queries(session: Session, release_id: int, partner_id: int) -> Sequence[Query]:
    """One partner's queries that are links of the release's chain, in chain order."""
    stmt = select(Query).where(
        Query.release_id == release_id, Query.partner_id == partner_id, Query.chain_seq.is_not(None)
    )
    return session.scalars(stmt.order_by(Query.chain_seq)).all()


def list_queries(session: Session, release_id: int, partner_id: int | None = None) -> Sequence[Query]:
    stmt = select(Query).where(Query.release_id == release_id)
    if partner_id is not None:
        stmt = stmt.where(Query.partner_id == partner_id)
    return session.scalars(stmt.order_by(Query.id)).all()


# -------------------------------------------------------------------------------------------- access log


_INSERT_ACCESS_LOG = insert(AccessLog.__table__)  # type: ignore[arg-type]


def add_access_log(
    session: Session,
    *,
    actor: str,
    partner_id: int | None,
    method: str,
    path: str,
    status_code: int,
    duration_ms: float,
) -> None:
    """One access-log row (a Core insert on the session's transaction: nothing for the ORM to track)."""
    session.connection().execute(
        _INSERT_ACCESS_LOG,
        {
            "actor": actor,
            "partner_id": partner_id,
            "method": method,
            "path": path,
            "status_code": status_code,
            "duration_ms": duration_ms,
        },
    )


def list_access_log(
    session: Session, *, limit: int, partner_id: int | None = None, after_id: int | None = None
) -> Sequence[AccessLog]:
    stmt = select(AccessLog)
    if partner_id is not None:
        stmt = stmt.where(AccessLog.partner_id == partner_id)
    if after_id is not None:
        stmt = stmt.where(AccessLog.id > after_id)
    return session.scalars(stmt.order_by(AccessLog.id).limit(limit)).all()


#: Ids per DELETE statement (SQLite's limit of bound parameters is 32766; PostgreSQL's 65535).
_DELETE_CHUNK = 1000


def access_log_before(session: Session, before: datetime, limit: int) -> Sequence[AccessLog]:
    """The oldest ``limit`` entries written before ``before``, by id (retention's next batch)."""
    stmt = select(AccessLog).where(AccessLog.at < before).order_by(AccessLog.id).limit(limit)
    return session.scalars(stmt).all()


def access_log_ids_up_to(session: Session, last_id: int) -> list[int]:
    """The ids of the entries still in the table with an id up to ``last_id``."""
    stmt = select(AccessLog.id).where(AccessLog.id <= last_id).order_by(AccessLog.id)
    return list(session.scalars(stmt).all())


def delete_access_log(session: Session, ids: Sequence[int]) -> int:
    """Delete exactly these entries (in the session's transaction); the number deleted."""
    deleted = 0
    for start in range(0, len(ids), _DELETE_CHUNK):
        chunk = list(ids[start : start + _DELETE_CHUNK])
        stmt = delete(AccessLog).where(AccessLog.id.in_(chunk)).execution_options(synchronize_session=False)
        result = session.execute(stmt)
        deleted += int(getattr(result, "rowcount", 0) or 0)
    return deleted


# ------------------------------------------------------------------------------------------------ health


def ping(session: Session) -> None:
    session.execute(select(1))


def pending_column_query_ids(session: Session) -> list[int]:
    """Pending queries of ``column`` datasets (left pending by a crash between commit and evaluation)."""
    stmt = (
        select(Query.id)
        .join(Release, Release.id == Query.release_id)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(Query.status == "pending", Dataset.objective_mode == "column", Dataset.erased_at.is_(None))
        .order_by(Query.id)
    )
    return list(session.scalars(stmt))


# ----------------------------------------------------------------------------------------------- metrics


def count_answered_queries(session: Session) -> int:
    """Queries answered so far (complete), of every release."""
    return int(session.scalar(select(func.count()).select_from(Query).where(Query.status == "complete")) or 0)
