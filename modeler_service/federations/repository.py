"""Every database query of the federations (DP-FTS-DE coordinator). Nothing here commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from modeler_service.models import (
    Federation,
    FederationAgent,
    FederationReceipt,
    FederationRound,
    FederationSubmission,
    utcnow,
)


def add(session: Session, row: Any) -> None:
    session.add(row)
    session.flush()


def get_federation(session: Session, federation_id: str, *, for_update: bool = False) -> Federation | None:
    return session.get(Federation, federation_id, with_for_update=for_update or None)


def list_federations(session: Session) -> list[Federation]:
    return list(session.scalars(select(Federation).order_by(Federation.created_at, Federation.id)))


def agent_by_token_hash(session: Session, token_hash: str) -> FederationAgent | None:
    return session.scalars(
        select(FederationAgent).where(FederationAgent.token_hash == token_hash)
    ).one_or_none()


def agents(session: Session, federation_id: str) -> list[FederationAgent]:
    """The federation's agents in registration order (the order of the frozen list)."""
    stmt = select(FederationAgent).where(FederationAgent.federation_id == federation_id)
    return list(session.scalars(stmt.order_by(FederationAgent.seq)))


def agent_named(session: Session, federation_id: str, name: str) -> FederationAgent | None:
    stmt = select(FederationAgent).where(
        FederationAgent.federation_id == federation_id, FederationAgent.name == name
    )
    return session.scalars(stmt).one_or_none()


def next_agent_seq(session: Session, federation_id: str) -> int:
    stmt = select(func.coalesce(func.max(FederationAgent.seq), 0)).where(
        FederationAgent.federation_id == federation_id
    )
    return int(session.scalar(stmt) or 0) + 1


def get_round(
    session: Session, federation_id: str, number: int, *, for_update: bool = False
) -> FederationRound | None:
    stmt = select(FederationRound).where(
        FederationRound.federation_id == federation_id, FederationRound.number == number
    )
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).one_or_none()


def overdue_rounds(session: Session, now: datetime) -> list[tuple[str, int]]:
    """(federation id, round number) of every open round whose deadline has passed, oldest first."""
    stmt = (
        select(FederationRound.federation_id, FederationRound.number)
        .where(FederationRound.status == "open", FederationRound.deadline <= now)
        .order_by(FederationRound.deadline)
    )
    return [(str(f), int(n)) for f, n in session.execute(stmt)]


def open_rounds(session: Session) -> list[tuple[str, int]]:
    stmt = select(FederationRound.federation_id, FederationRound.number).where(
        FederationRound.status == "open"
    )
    return [(str(f), int(n)) for f, n in session.execute(stmt)]


def claim_round_for_close(session: Session, round_id: int, now: datetime) -> bool:
    """One conditional UPDATE open -> closed: of two closers (threads, workers, a restarted process) exactly
    one sees rowcount 1, so a round is aggregated at most once."""
    result = session.execute(
        update(FederationRound)
        .where(FederationRound.id == round_id, FederationRound.status == "open")
        .values(status="closed", closed_at=now)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def submission(session: Session, round_id: int, agent_id: str) -> FederationSubmission | None:
    stmt = select(FederationSubmission).where(
        FederationSubmission.round_id == round_id, FederationSubmission.agent_id == agent_id
    )
    return session.scalars(stmt).one_or_none()


def submissions(session: Session, round_id: int) -> Sequence[FederationSubmission]:
    stmt = select(FederationSubmission).where(FederationSubmission.round_id == round_id)
    return list(session.scalars(stmt))


def purge_submissions(session: Session, round_id: int) -> None:
    """Delete a round's raw submissions (at its close); their receipts stay."""
    session.execute(delete(FederationSubmission).where(FederationSubmission.round_id == round_id))


def receipt(session: Session, round_id: int, agent_id: str) -> FederationReceipt | None:
    """The agent's receipt in one round (its submission there was accepted), if any."""
    stmt = select(FederationReceipt).where(
        FederationReceipt.round_id == round_id, FederationReceipt.agent_id == agent_id
    )
    return session.scalars(stmt).one_or_none()


def receipt_by_key(session: Session, agent_id: str, key: str) -> tuple[FederationReceipt, int] | None:
    """The agent's receipt under one Idempotency-Key, with the number of its round."""
    stmt = (
        select(FederationReceipt, FederationRound.number)
        .join(FederationRound, FederationRound.id == FederationReceipt.round_id)
        .where(FederationReceipt.agent_id == agent_id, FederationReceipt.idempotency_key == key)
    )
    row = session.execute(stmt).one_or_none()
    return None if row is None else (row[0], int(row[1]))


def touch(federation: Federation) -> None:
    federation.updated_at = utcnow()


def rounds(session: Session, federation_id: str) -> list[FederationRound]:
    """The federation's rounds, in order."""
    stmt = select(FederationRound).where(FederationRound.federation_id == federation_id)
    return list(session.scalars(stmt.order_by(FederationRound.number)))


def receipts_per_round(session: Session, federation_id: str) -> dict[int, int]:
    """round number -> the submissions accepted in it (receipts; none for a round closed before 0007)."""
    stmt = (
        select(FederationRound.number, func.count(FederationReceipt.id))
        .join(FederationReceipt, FederationReceipt.round_id == FederationRound.id)
        .where(FederationRound.federation_id == federation_id)
        .group_by(FederationRound.number)
    )
    return {int(n): int(c) for n, c in session.execute(stmt)}


def agents_last_round(session: Session, federation_id: str) -> dict[str, tuple[int, int]]:
    """agent id -> (the last round with an accepted submission of it, how many rounds accepted one)."""
    stmt = (
        select(FederationReceipt.agent_id, func.max(FederationRound.number), func.count(FederationReceipt.id))
        .join(FederationRound, FederationRound.id == FederationReceipt.round_id)
        .where(FederationRound.federation_id == federation_id)
        .group_by(FederationReceipt.agent_id)
    )
    return {str(a): (int(last), int(n)) for a, last, n in session.execute(stmt)}


def federation_rounds_closed(session: Session) -> int:
    """Rounds closed by every federation (metrics)."""
    return int(session.scalar(select(func.coalesce(func.sum(Federation.rounds_closed), 0))) or 0)
