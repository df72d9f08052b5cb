"""Every database query of the modeler service. Nothing here commits: the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, case, func, insert, null, select, update
from sqlalchemy.orm import Session

from modeler_service.models import AuditEntry, Study, utcnow

#: Statuses in which a runner (thread) owns the study.
#: A runner owns the study (a second run is a 409; a restart makes it ``ready`` again).
ACTIVE_STATUSES = ("running", "awaiting_measurement", "waiting_for_curator")


# ------------------------------------------------------------------------------------------------ studies


def add_study(session: Session, study: Study) -> Study:
    session.add(study)
    session.flush()
    return study


def get_study(session: Session, study_id: str, *, for_update: bool = False) -> Study | None:
    """The study by id; ``for_update`` takes its row lock (PostgreSQL) until the transaction ends."""
    return session.get(Study, study_id, with_for_update=for_update or None)


def list_studies(session: Session) -> list[Study]:
    return list(session.scalars(select(Study).order_by(Study.created_at, Study.id)))


def claim_study(
    session: Session,
    study_id: str,
    *,
    from_statuses: Iterable[str],
    to_status: str,
    run_target: int | None,
    not_updated_after: datetime | None = None,
) -> bool:
    """Atomically move a study to ``to_status`` if (and only if) it is in one of ``from_statuses`` (and,
    with ``not_updated_after``, has not been written since that time).

    One conditional UPDATE: of two concurrent callers, in one process or two, exactly one sees rowcount 1
    (this is what makes a second ``run`` on a running study a 409 rather than a second runner).
    """
    stmt = update(Study).where(Study.id == study_id, Study.status.in_(tuple(from_statuses)))
    if not_updated_after is not None:
        stmt = stmt.where(Study.updated_at <= not_updated_after)
    result = session.execute(
        stmt.values(
            status=to_status, run_target=run_target, error=None, updated_at=utcnow()
        ).execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def set_status(
    session: Session,
    study_id: str,
    status: str,
    *,
    only_if: Iterable[str] | None = None,
    error: str | None = None,
    clear_run_target: bool = False,
) -> bool:
    values: dict[str, Any] = {
        "status": status,
        "error": error,
        "retry_at": None,
        "retry_attempts": 0,
        "updated_at": utcnow(),
    }
    if clear_run_target:
        values["run_target"] = None
    stmt = update(Study).where(Study.id == study_id)
    if only_if is not None:
        stmt = stmt.where(Study.status.in_(tuple(only_if)))
    result = session.execute(stmt.values(**values).execution_options(synchronize_session=False))
    return bool(getattr(result, "rowcount", 0) == 1)


def set_waiting(session: Session, study_id: str, *, error: str, retry_at: datetime, attempts: int) -> bool:
    """The runner waits for the curator: status, the last error and when it tries again (one UPDATE)."""
    result = session.execute(
        update(Study)
        .where(Study.id == study_id, Study.status.in_(ACTIVE_STATUSES))
        .values(
            status="waiting_for_curator",
            error=error,
            retry_at=retry_at,
            retry_attempts=attempts,
            updated_at=utcnow(),
        )
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def resume_after_wait(session: Session, study_id: str, *, attempts: int) -> bool:
    """Back to ``running`` for the next attempt (``attempts`` keeps counting until one succeeds)."""
    result = session.execute(
        update(Study)
        .where(Study.id == study_id, Study.status == "waiting_for_curator")
        .values(status="running", error=None, retry_at=None, retry_attempts=attempts, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def clear_retry_attempts(session: Session, study_id: str) -> None:
    session.execute(
        update(Study)
        .where(Study.id == study_id)
        .values(retry_attempts=0)
        .execution_options(synchronize_session=False)
    )


def stale_study_ids(session: Session) -> list[str]:
    """Studies a previous process left in a runner-owned state (it was killed)."""
    return list(session.scalars(select(Study.id).where(Study.status.in_(ACTIVE_STATUSES)).order_by(Study.id)))


def set_intent(
    session: Session, study_id: str, *, iteration: int, index: int, suggestion: dict[str, Any]
) -> bool:
    """Write-ahead: record the row about to be queried, unless an intent exists or the count moved."""
    result = session.execute(
        update(Study)
        .where(
            Study.id == study_id,
            Study.pending_iteration.is_(None),
            Study.iterations_done == iteration - 1,
        )
        .values(
            pending_iteration=iteration,
            pending_index=index,
            pending_suggestion=suggestion,
            pending_query_id=None,
            updated_at=utcnow(),
        )
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def set_pending_query(session: Session, study_id: str, query_id: int, *, awaiting: bool) -> None:
    values: dict[str, Any] = {"pending_query_id": query_id, "updated_at": utcnow()}
    stmt = update(Study).where(Study.id == study_id)
    session.execute(stmt.values(**values).execution_options(synchronize_session=False))
    if awaiting:
        set_status(session, study_id, "awaiting_measurement", only_if=("running",))


# ------------------------------------------------------------------------------------------------- audit


def observations(session: Session, study_id: str, *, after_seq: int = 0) -> list[tuple[int, float]]:
    """(index, y) of every recorded query (with ``seq > after_seq``), in order: the state the GP is
    rebuilt from."""
    rows = session.execute(
        select(AuditEntry.row_index, AuditEntry.y)
        .where(AuditEntry.study_id == study_id, AuditEntry.seq > after_seq)
        .order_by(AuditEntry.seq)
    )
    return [(int(i), float(y)) for i, y in rows]


def audit_entries(session: Session, study_id: str) -> list[AuditEntry]:
    return list(
        session.scalars(select(AuditEntry).where(AuditEntry.study_id == study_id).order_by(AuditEntry.seq))
    )


def count_audit_entries(session: Session, study_id: str) -> int:
    return int(session.scalar(select(func.count()).where(AuditEntry.study_id == study_id)) or 0)


_AUDIT = AuditEntry.__table__
_STUDIES = Study.__table__
#: Prebuilt hot-path statements (compiled once and cached; parameters bound per call).
_INSERT_AUDIT = insert(_AUDIT)
_ADVANCE_WHERE = (
    (_STUDIES.c.id == bindparam("b_id"))
    & (_STUDIES.c.pending_iteration == bindparam("b_iteration"))
    & (_STUDIES.c.iterations_done == bindparam("b_prev_done"))
    & (_STUDIES.c.audit_head == bindparam("b_prev_head"))
)
_ADVANCE_VALUES: dict[str, Any] = {
    "iterations_done": bindparam("b_iteration"),
    "audit_head": bindparam("b_head"),
    "best_index": bindparam("b_best_index"),
    "best_y": bindparam("b_best_y"),
    "pending_iteration": None,
    "pending_index": None,
    "pending_suggestion": null(),
    "pending_query_id": None,
    "updated_at": bindparam("b_now", type_=_STUDIES.c.updated_at.type),
}
_ACTIVE = _STUDIES.c.status.in_(ACTIVE_STATUSES)
_ADVANCE = update(_STUDIES).where(_ADVANCE_WHERE).values(**_ADVANCE_VALUES)
_ADVANCE_AND_SETTLE = (
    update(_STUDIES)
    .where(_ADVANCE_WHERE)
    .values(
        **_ADVANCE_VALUES,
        status=case((_ACTIVE, bindparam("b_status")), else_=_STUDIES.c.status),
        run_target=case((_ACTIVE, null()), else_=_STUDIES.c.run_target),
    )
)


def insert_audit_entry(session: Session, entry: AuditEntry) -> None:
    """The only write to the audit table: an insert (entries are never updated or deleted)."""
    values = {key: getattr(entry, key) for key in _AUDIT.columns.keys() if key != "id"}
    session.execute(_INSERT_AUDIT, values)


def advance_study(
    session: Session,
    study_id: str,
    *,
    iteration: int,
    prev_head: str,
    head: str,
    best_index: int | None,
    best_y: float | None,
    settle_status: str | None,
) -> bool:
    """Record iteration ``iteration`` on the study row, iff it is still the one in flight (one UPDATE).

    With ``settle_status`` the run also ends (status ``done``/``ready``, unless no runner owned the study).
    """
    params: dict[str, Any] = {
        "b_id": study_id,
        "b_iteration": iteration,
        "b_prev_done": iteration - 1,
        "b_prev_head": prev_head,
        "b_head": head,
        "b_best_index": best_index,
        "b_best_y": best_y,
        "b_now": utcnow(),
    }
    stmt = _ADVANCE
    if settle_status is not None:
        stmt, params["b_status"] = _ADVANCE_AND_SETTLE, settle_status
    result = session.execute(stmt, params)
    return bool(getattr(result, "rowcount", 0) == 1)
