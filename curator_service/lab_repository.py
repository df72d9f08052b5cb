"""The database queries of the lab workflow (``services/lab.py``, ``services/corrections.py``): the queries
waiting for a measurement, deliveries of answers to partners, and the corrections of measured outcomes.
Nothing here commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Select, func, or_, select, update
from sqlalchemy.orm import Session

from curator_service.models import Dataset, Partner, Query, QueryCorrection, Release, utcnow

#: The corrections a partner is shown: the values it had been sent and what replaced them.
PARTNER_KINDS = ("supersession",)


# ------------------------------------------------------------------------------------ lab's query list


def lab_queries(
    session: Session,
    *,
    status: str,
    release_id: int | None = None,
    dataset_id: int | None = None,
    after_id: int | None = None,
    limit: int,
) -> list[tuple[Query, Release, Dataset, Partner]]:
    """Queries of ``manual`` datasets with ``status``, oldest first, with their release, dataset and partner.

    Pending: the ones waiting for the lab's measurement; cached repeats (answered with the measurement of
    the query they repeat) are left out, and so are the queries of erased datasets."""
    stmt = (
        select(Query, Release, Dataset, Partner)
        .join(Release, Release.id == Query.release_id)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .join(Partner, Partner.id == Query.partner_id)
        .where(Query.status == status, Dataset.objective_mode == "manual", Dataset.erased_at.is_(None))
    )
    if status == "pending":
        stmt = stmt.where(Query.source_query_id.is_(None))
    if release_id is not None:
        stmt = stmt.where(Query.release_id == release_id)
    if dataset_id is not None:
        stmt = stmt.where(Release.dataset_id == dataset_id)
    if after_id is not None:
        stmt = stmt.where(Query.id > after_id)
    rows = session.execute(stmt.order_by(Query.id).limit(limit)).all()
    return [(q, r, d, p) for q, r, d, p in rows]


def pending_for_rows(
    session: Session, dataset_id: int, rows: Sequence[int], release_id: int | None = None
) -> list[Query]:
    """Pending queries (not cached repeats) about these rows of a dataset, of one release or of all its
    releases, in id order."""
    if not rows:
        return []
    stmt = (
        select(Query)
        .join(Release, Release.id == Query.release_id)
        .where(
            Release.dataset_id == dataset_id,
            Query.row_index.in_(list(rows)),
            Query.status == "pending",
            Query.source_query_id.is_(None),
        )
    )
    if release_id is not None:
        stmt = stmt.where(Query.release_id == release_id)
    return list(session.scalars(stmt.order_by(Query.id)))


def get_queries(session: Session, ids: Sequence[int]) -> dict[int, Query]:
    if not ids:
        return {}
    return {q.id: q for q in session.scalars(select(Query).where(Query.id.in_(list(ids))))}


def datasets_with_ids(session: Session, dataset_ids: Sequence[int] | None = None) -> list[Dataset]:
    """``manual`` datasets that keep sample ids (of ``dataset_ids`` only, when given)."""
    stmt = select(Dataset).where(Dataset.ids_path.is_not(None), Dataset.objective_mode == "manual")
    if dataset_ids is not None:
        stmt = stmt.where(Dataset.id.in_(list(dataset_ids)))
    return list(session.scalars(stmt.order_by(Dataset.id)))


# ------------------------------------------------------------------------------------------- delivery


def mark_delivered(
    session: Session, *, partner_id: int, query_id: int | None = None, release_id: int | None = None
) -> int:
    """Record that ``partner_id`` is being sent its complete queries (one, or all of a release) now; only
    the first sending counts. Returns how many were marked."""
    stmt = update(Query).where(
        Query.partner_id == partner_id, Query.status == "complete", Query.delivered_at.is_(None)
    )
    if query_id is not None:
        stmt = stmt.where(Query.id == query_id)
    if release_id is not None:
        stmt = stmt.where(Query.release_id == release_id)
    result = session.execute(stmt.values(delivered_at=utcnow()).execution_options(synchronize_session=False))
    return int(result.rowcount)  # type: ignore[attr-defined]


def undelivered(session: Session, partner_id: int, release_id: int) -> bool:
    """Whether the partner has complete queries of the release it was never sent."""
    stmt = select(Query.id).where(
        Query.partner_id == partner_id,
        Query.release_id == release_id,
        Query.status == "complete",
        Query.delivered_at.is_(None),
    )
    return session.scalar(stmt.limit(1)) is not None


# ---------------------------------------------------------------------------------------- corrections


def lock_answer_group(session: Session, query_id: int) -> list[Query]:
    """The query and its cached repeats (queries answered with its value), locked for the rest of the
    transaction (PostgreSQL ``FOR UPDATE``; SQLite's write transaction is exclusive already), query first."""
    stmt = (
        select(Query)
        .where((Query.id == query_id) | (Query.source_query_id == query_id))
        .order_by(Query.id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return list(session.scalars(stmt))


def set_value(session: Session, query_id: int, y: float, y_raw: float | None) -> None:
    session.execute(
        update(Query)
        .where(Query.id == query_id, Query.status == "complete")
        .values(y=y, y_raw=y_raw)
        .execution_options(synchronize_session=False)
    )


def supersessions_charged(session: Session, query_id: int) -> int:
    """How many supersessions of the query are on record (the next one's charge is ``answer_no`` + 1)."""
    stmt = select(func.count()).where(
        QueryCorrection.query_id == query_id, QueryCorrection.kind == "supersession"
    )
    return int(session.scalar(stmt) or 0)


def _corrections(kinds: Sequence[str] | None) -> Select[QueryCorrection]:
    stmt = select(QueryCorrection)
    if kinds is not None:
        stmt = stmt.where(QueryCorrection.kind.in_(list(kinds)))
    return stmt


def corrections_of(
    session: Session, query_ids: Sequence[int], kinds: Sequence[str] | None = None
) -> dict[int, list[QueryCorrection]]:
    """Per query: its corrections (of ``kinds`` only, when given) in chain order."""
    if not query_ids:
        return {}
    out: dict[int, list[QueryCorrection]] = {}
    stmt = _corrections(kinds).where(QueryCorrection.query_id.in_(list(query_ids)))
    for c in session.scalars(stmt.order_by(QueryCorrection.chain_seq)):
        out.setdefault(c.query_id, []).append(c)
    return out


def list_corrections(
    session: Session,
    release_id: int,
    *,
    partner_id: int | None = None,
    kinds: Sequence[str] | None = None,
    after_id: int | None = None,
    limit: int,
) -> Sequence[QueryCorrection]:
    stmt = _corrections(kinds).where(QueryCorrection.release_id == release_id)
    if partner_id is not None:
        stmt = stmt.where(QueryCorrection.partner_id == partner_id)
    if after_id is not None:
        stmt = stmt.where(QueryCorrection.id > after_id)
    return session.scalars(stmt.order_by(QueryCorrection.id).limit(limit)).all()


def partner_links(session: Session, release_id: int, partner_id: int) -> list[tuple[int, str]]:
    """(chain position, hash) of the release chain's links a partner is shown, in chain order: those of its
    queries whose value it was sent (a ``manual`` query's once delivered, and none whose value was replaced
    before delivery). A link's hash covers every field of its payload, and the partner knows all of them
    but the secret, so any secret of low entropy in a link it is shown could be confirmed by guessing: a lab
    value not sent (yet, or ever: a correction's discarded value) has few digits, and a correction's link
    covers the curator's reason (which may name a sample). So no correction's link is shown, not even a
    supersession's: its values are in ``corrections``, the reason stays with the curator.
    """
    replaced = select(QueryCorrection.query_id).where(
        QueryCorrection.release_id == release_id, QueryCorrection.kind == "correction"
    )
    queries = (
        select(Query.chain_seq, Query.hash)
        .join(Release, Release.id == Query.release_id)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(
            Query.release_id == release_id,
            Query.partner_id == partner_id,
            Query.chain_seq.is_not(None),
            or_(Query.delivered_at.is_not(None), Dataset.objective_mode != "manual"),
            Query.id.not_in(replaced),
        )
    )
    return sorted((int(s), str(h)) for s, h in session.execute(queries) if s is not None and h is not None)


def first_delivery(queries: Sequence[Query]) -> datetime | None:
    """The earliest delivery of a group of queries that share one answer (None: never sent)."""
    times = [q.delivered_at for q in queries if q.delivered_at is not None]
    return min(times) if times else None
