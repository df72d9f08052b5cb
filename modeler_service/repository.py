"""Every database query of the modeler service. Nothing here commits: the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from modeler_service.models import AuditEntry, AuditSupersession, Study, StudyTag, utcnow

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


def list_studies(session: Session, *, name: str | None = None, tags: Iterable[str] = ()) -> list[Study]:
    """Every study, oldest first; ``name``: whose name contains it, ignoring case; ``tags``: that have every
    one of them (compared in lower case, on ``modeler_study_tags``)."""
    stmt = select(Study)
    if name:
        stmt = stmt.where(Study.name.icontains(name, autoescape=True))
    for tag in sorted({t.lower() for t in tags}):
        stmt = stmt.where(Study.id.in_(select(StudyTag.study_id).where(StudyTag.tag == tag)))
    return list(session.scalars(stmt.order_by(Study.created_at, Study.id)))


def set_tags(session: Session, study: Study, tags: list[str]) -> None:
    """The study's tags: as written on the study, folded to lower case in ``modeler_study_tags``."""
    study.tags = list(tags)
    session.flush()
    session.execute(delete(StudyTag).where(StudyTag.study_id == study.id))
    session.add_all(StudyTag(study_id=study.id, tag=tag) for tag in sorted({t.lower() for t in tags}))
    session.flush()


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


def set_pending_round(session: Session, study_id: str, pending: dict[str, Any], *, awaiting: bool) -> None:
    """The round in flight with its curator query ids (and ``awaiting_measurement`` if one is pending)."""
    values: dict[str, Any] = {"pending_round": pending, "updated_at": utcnow()}
    if awaiting:  # from now on the runner picks up the curator's supersessions after the study's rounds
        values["awaits_measurements"] = True
    stmt = update(Study).where(Study.id == study_id).values(**values)
    session.execute(stmt.execution_options(synchronize_session=False))
    if awaiting:
        set_status(session, study_id, "awaiting_measurement", only_if=("running",))


def drop_pending_round(session: Session, study_id: str, round_no: int) -> bool:
    """Forget the round in flight ``round_no`` (none of its requests was answered: the curator refused the
    first for good, charging nothing), so that the next round is planned again; False if it moved."""
    result = session.execute(
        update(Study)
        .where(Study.id == study_id, Study.rounds_done == round_no - 1, Study.pending_round.is_not(None))
        .values(pending_round=None, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


# ------------------------------------------------------------------------------------------------- audit


def audit_rounds(
    session: Session, study_id: str, *, after_round: int = 0, superseded: bool = False
) -> list[list[tuple[str, int | None, float | None, dict[str, Any] | None]]]:
    """Every recorded round (with ``round > after_round``), in order: each audit entry's kind, row index,
    y and details (what the entry's request kind rebuilds the strategy's observation from).

    ``superseded`` (the study has supersessions): an entry's y is its latest value (``latest_values``)."""
    rows = session.execute(
        select(
            AuditEntry.round,
            AuditEntry.seq,
            AuditEntry.kind,
            AuditEntry.row_index,
            AuditEntry.y,
            AuditEntry.details,
        )
        .where(AuditEntry.study_id == study_id, AuditEntry.round > after_round)
        .order_by(AuditEntry.seq)
    )
    latest = latest_values(session, study_id) if superseded else {}
    out: list[list[tuple[str, int | None, float | None, dict[str, Any] | None]]] = []
    current = None
    for round_no, seq, kind, index, y, details in rows:
        if round_no != current:
            out.append([])
            current = round_no
        out[-1].append((kind, index, latest.get(seq, y), details))
    return out


def outcomes(session: Session, study_id: str) -> list[float]:
    """Every recorded outcome y, in query order (for the progress plot)."""
    rows = session.scalars(
        select(AuditEntry.y)
        .where(AuditEntry.study_id == study_id, AuditEntry.y.is_not(None))
        .order_by(AuditEntry.seq)
    )
    return [float(y) for y in rows if y is not None]


def audit_entries(session: Session, study_id: str) -> list[AuditEntry]:
    return list(
        session.scalars(select(AuditEntry).where(AuditEntry.study_id == study_id).order_by(AuditEntry.seq))
    )


def count_audit_entries(session: Session, study_id: str) -> int:
    return int(session.scalar(select(func.count()).where(AuditEntry.study_id == study_id)) or 0)


# ---------------------------------------------------------------------------------------- supersessions


def supersessions(session: Session, study_id: str) -> list[AuditSupersession]:
    """The study's supersessions in chain order."""
    return list(
        session.scalars(
            select(AuditSupersession)
            .where(AuditSupersession.study_id == study_id)
            .order_by(AuditSupersession.seq)
        )
    )


def latest_values(session: Session, study_id: str) -> dict[int, float]:
    """Per superseded audit entry (its ``seq``): its latest value (the last supersession's y)."""
    rows = session.execute(
        select(AuditSupersession.audit_seq, AuditSupersession.y)
        .where(AuditSupersession.study_id == study_id)
        .order_by(AuditSupersession.seq)
    )
    return {int(seq): float(y) for seq, y in rows}


def answered_values(session: Session, study_id: str) -> dict[int, tuple[int, float | None]]:
    """Per curator query id of the study's audit entries: the entry's ``seq`` and the y it records."""
    rows = session.execute(
        select(AuditEntry.curator_query_id, AuditEntry.seq, AuditEntry.y).where(
            AuditEntry.study_id == study_id, AuditEntry.row_index.is_not(None)
        )
    )
    return {int(qid): (int(seq), None if y is None else float(y)) for qid, seq, y in rows}


def entries_at(session: Session, study_id: str, seqs: Iterable[int]) -> dict[int, AuditEntry]:
    """The study's audit entries of the given ``seq`` numbers, by seq."""
    wanted = sorted(set(seqs))
    if not wanted:
        return {}
    found = session.scalars(
        select(AuditEntry).where(AuditEntry.study_id == study_id, AuditEntry.seq.in_(wanted))
    )
    return {e.seq: e for e in found}


def add_supersessions(session: Session, study_id: str, records: list[AuditSupersession], head: str) -> None:
    """Append ``records`` to the study's supersession chain and store its new length and head."""
    session.add_all(records)
    session.flush()
    session.execute(
        update(Study)
        .where(Study.id == study_id)
        .values(supersessions_done=Study.supersessions_done + len(records), supersessions_head=head)
        .execution_options(synchronize_session=False)
    )


# ----------------------------------------------------------------------------------------------- metrics


def studies_by_status(session: Session) -> dict[str, int]:
    return {
        str(s): int(n) for s, n in session.execute(select(Study.status, func.count()).group_by(Study.status))
    }


def study_rounds_done(session: Session) -> int:
    """Rounds recorded by every study (each round's answers are in its audit chain)."""
    return int(session.scalar(select(func.coalesce(func.sum(Study.rounds_done), 0))) or 0)
