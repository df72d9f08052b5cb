"""The database queries of output privacy (``services/outputs.py``): the per-person output charges, the
cache of noisy answers and the ledger's per-person totals. Nothing here commits."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Select, func, insert, select
from sqlalchemy.orm import Session

from curator_service.models import Dataset, Grant, OutputCharge, Partner, Query, Release

_INSERT_OUTPUT_CHARGE = insert(OutputCharge.__table__)  # type: ignore[arg-type]


def add_output_charge(
    session: Session,
    *,
    population_id: int,
    dataset_id: int,
    row_index: int,
    query_id: int,
    partner_id: int,
    epsilon: float | None,
    answer_no: int = 0,
) -> None:
    """Charge one answer to its person (a Core insert, sent at once: the query it names is flushed).
    ``answer_no``: 0 for the query's answer, k for its k-th supersession (``services.corrections``)."""
    session.connection().execute(
        _INSERT_OUTPUT_CHARGE,
        {
            "population_id": population_id,
            "dataset_id": dataset_id,
            "row_index": row_index,
            "query_id": query_id,
            "partner_id": partner_id,
            "epsilon": epsilon,
            "answer_no": answer_no,
        },
    )


def first_output_answer(session: Session, output_key: str, *, exclude_id: int) -> Query | None:
    """The query that drew the noisy answer named ``output_key`` (the first one, not a cached repeat)."""
    stmt = (
        select(Query)
        .where(Query.output_key == output_key, Query.source_query_id.is_(None), Query.id != exclude_id)
        .order_by(Query.id)
        .limit(1)
        .execution_options(populate_existing=True)
    )
    return session.scalars(stmt).first()


def pending_repeats(session: Session, source_id: int) -> list[int]:
    """Cached repeats still waiting for the answer of query ``source_id``."""
    stmt = select(Query.id).where(Query.source_query_id == source_id, Query.status == "pending")
    return list(session.scalars(stmt.order_by(Query.id)))


def _row_totals(
    population_id: int, partner_id: int | None = None
) -> Select[int, int, int, float | None, int]:
    """Per (dataset, row): answers, the sum of charged epsilons, and how many were raw (epsilon NULL); of
    one partner's answers only, when ``partner_id`` is given."""
    stmt = select(
        OutputCharge.dataset_id.label("dataset_id"),
        OutputCharge.row_index.label("row_index"),
        func.count().label("answers"),
        func.coalesce(func.sum(OutputCharge.epsilon), 0.0).label("epsilon"),
        (func.count() - func.count(OutputCharge.epsilon)).label("raw"),
    ).where(OutputCharge.population_id == population_id)
    if partner_id is not None:
        stmt = stmt.where(OutputCharge.partner_id == partner_id)
    return stmt.group_by(OutputCharge.dataset_id, OutputCharge.row_index)


def row_output_total(
    session: Session, dataset_id: int, index: int, partner_id: int | None = None
) -> tuple[float, bool]:
    """(sum of charged epsilons, any raw answer) over the answers about row ``index`` of a dataset (of one
    partner's answers only, when ``partner_id`` is given)."""
    stmt = select(
        func.coalesce(func.sum(OutputCharge.epsilon), 0.0),
        func.count() - func.count(OutputCharge.epsilon),
    ).where(OutputCharge.dataset_id == dataset_id, OutputCharge.row_index == index)
    if partner_id is not None:
        stmt = stmt.where(OutputCharge.partner_id == partner_id)
    row = session.execute(stmt).one()
    return float(row[0] or 0.0), int(row[1]) > 0


def dataset_output_maxima(
    session: Session, population_id: int, partner_id: int | None = None
) -> dict[int, tuple[float, bool]]:
    """Per dataset of the population: (largest row total, any row answered raw); of one partner's answers
    only, when ``partner_id`` is given."""
    rows = _row_totals(population_id, partner_id).subquery()
    stmt = select(rows.c.dataset_id, func.max(rows.c.epsilon), func.max(rows.c.raw)).group_by(
        rows.c.dataset_id
    )
    return {int(d): (float(m), int(r) > 0) for d, m, r in session.execute(stmt)}


def output_rows(
    session: Session, population_id: int, *, limit: int
) -> list[tuple[int, int, int, float, bool]]:
    """(dataset, row, answers, epsilon total, raw) per answered row: raw rows first, then largest totals."""
    rows = _row_totals(population_id).subquery()
    stmt = (
        select(rows.c.dataset_id, rows.c.row_index, rows.c.answers, rows.c.epsilon, rows.c.raw)
        .order_by((rows.c.raw > 0).desc(), rows.c.epsilon.desc(), rows.c.dataset_id, rows.c.row_index)
        .limit(limit)
    )
    return [(int(d), int(i), int(a), float(e), int(r) > 0) for d, i, a, e, r in session.execute(stmt)]


def rows_per_person_by_dataset(session: Session, population_id: int) -> dict[int, int]:
    stmt = select(Dataset.id, Dataset.rows_per_person).where(Dataset.population_id == population_id)
    return {int(d): int(k or 1) for d, k in session.execute(stmt)}


def output_counts(session: Session, population_id: int) -> dict[str, int]:
    privatised, raw = session.execute(
        select(func.count(OutputCharge.epsilon), func.count() - func.count(OutputCharge.epsilon)).where(
            OutputCharge.population_id == population_id
        )
    ).one()
    cached = session.scalar(
        select(func.count())
        .select_from(Query)
        .join(Release, Release.id == Query.release_id)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(Dataset.population_id == population_id, Query.source_query_id.is_not(None))
    )
    return {"privatised": int(privatised), "raw": int(raw), "cached": int(cached or 0)}


def output_epsilons(session: Session, population_id: int) -> list[float]:
    stmt = (
        select(OutputCharge.epsilon)
        .where(OutputCharge.population_id == population_id, OutputCharge.epsilon.is_not(None))
        .distinct()
    )
    return sorted(float(e) for e in session.scalars(stmt) if e is not None)


def partners_answering(session: Session, population_id: int) -> Sequence[Partner]:
    """Partners granted a release of one of the population's datasets."""
    granted = (
        select(Grant.partner_id)
        .join(Release, Release.id == Grant.release_id)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .where(Dataset.population_id == population_id)
    )
    return session.scalars(select(Partner).where(Partner.id.in_(granted)).order_by(Partner.id)).all()


def partner_row_totals(session: Session, dataset_id: int, partner_id: int) -> list[tuple[int, float, bool]]:
    """(row, sum of charged epsilons, any raw answer) per row of a dataset that one partner was answered
    about."""
    stmt = (
        select(
            OutputCharge.row_index,
            func.coalesce(func.sum(OutputCharge.epsilon), 0.0),
            func.count() - func.count(OutputCharge.epsilon),
        )
        .where(OutputCharge.dataset_id == dataset_id, OutputCharge.partner_id == partner_id)
        .group_by(OutputCharge.row_index)
    )
    return [(int(i), float(e or 0.0), int(r) > 0) for i, e, r in session.execute(stmt)]


def cached_answer_keys(session: Session, partner_id: int, dataset_id: int) -> list[tuple[int, str]]:
    """(row, output key) of a partner's first noisy answers about a dataset's rows (what its repeats
    return, when its grant caches them)."""
    stmt = (
        select(Query.row_index, Query.output_key)
        .join(Release, Release.id == Query.release_id)
        .where(
            Query.partner_id == partner_id,
            Release.dataset_id == dataset_id,
            Query.output_key.is_not(None),
            Query.source_query_id.is_(None),
        )
    )
    return [(int(i), str(k)) for i, k in session.execute(stmt)]
