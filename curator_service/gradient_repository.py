"""Database queries of the gradient oracles (DP-GIBO): oracles, their steps, partner grants."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from curator_service.models import GradientOracle, GradientStep, LedgerEntry, OracleGrant


def get_oracle(session: Session, oracle_id: int) -> GradientOracle | None:
    return session.get(GradientOracle, oracle_id)


def lock_oracle(session: Session, oracle_id: int) -> GradientOracle | None:
    """The oracle row, locked for the rest of the transaction (PostgreSQL ``FOR UPDATE``; on SQLite the
    write session's ``BEGIN IMMEDIATE`` already serialises), so steps of one oracle run one at a time."""
    stmt = select(GradientOracle).where(GradientOracle.id == oracle_id).with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def list_oracles(
    session: Session, *, ids: Sequence[int] | None = None, dataset_id: int | None = None
) -> Sequence[GradientOracle]:
    stmt = select(GradientOracle).order_by(GradientOracle.id)
    if ids is not None:
        stmt = stmt.where(GradientOracle.id.in_(list(ids)))
    if dataset_id is not None:
        stmt = stmt.where(GradientOracle.dataset_id == dataset_id)
    return session.scalars(stmt).all()


def existing_oracle_ids(session: Session, ids: Sequence[int]) -> set[int]:
    if not ids:
        return set()
    stmt = select(GradientOracle.id).where(GradientOracle.id.in_(list(set(ids))))
    return {int(i) for i in session.scalars(stmt)}


def take_step(session: Session, oracle_id: int) -> int | None:
    """Atomically count one step; the new ``steps_used`` (the step's number), or None when all are used."""
    result = session.execute(
        update(GradientOracle)
        .where(GradientOracle.id == oracle_id, GradientOracle.steps_used < GradientOracle.steps)
        .values(steps_used=GradientOracle.steps_used + 1)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    used = session.scalar(select(GradientOracle.steps_used).where(GradientOracle.id == oracle_id))
    return int(used) if used is not None else None


def steps(session: Session, oracle_id: int, partner_id: int | None = None) -> Sequence[GradientStep]:
    stmt = select(GradientStep).where(GradientStep.oracle_id == oracle_id).order_by(GradientStep.step)
    if partner_id is not None:
        stmt = stmt.where(GradientStep.partner_id == partner_id)
    return session.scalars(stmt).all()


def design_points(session: Session, oracle_id: int) -> list[list[list[float]]]:
    """The ``points`` of every answered step, in step order (the design so far, batch by batch)."""
    stmt = select(GradientStep.points).where(GradientStep.oracle_id == oracle_id).order_by(GradientStep.step)
    return [list(p) for p in session.scalars(stmt)]


def step_by_key(session: Session, oracle_id: int, partner_id: int, key: str) -> GradientStep | None:
    stmt = select(GradientStep).where(
        GradientStep.oracle_id == oracle_id,
        GradientStep.partner_id == partner_id,
        GradientStep.idempotency_key == key,
    )
    return session.execute(stmt).scalar_one_or_none()


def ledger_entry_of(session: Session, oracle_id: int) -> LedgerEntry | None:
    stmt = select(LedgerEntry).where(LedgerEntry.gradient_oracle_id == oracle_id)
    return session.execute(stmt).scalar_one_or_none()


# ------------------------------------------------------------------------------------------------ grants


def granted_oracle_ids(session: Session, partner_id: int) -> list[int]:
    stmt = (
        select(OracleGrant.oracle_id)
        .where(OracleGrant.partner_id == partner_id)
        .order_by(OracleGrant.oracle_id)
    )
    return [int(i) for i in session.scalars(stmt)]


def oracle_grants_by_partner(session: Session) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    stmt = select(OracleGrant.partner_id, OracleGrant.oracle_id).order_by(OracleGrant.oracle_id)
    for pid, oid in session.execute(stmt):
        out.setdefault(int(pid), []).append(int(oid))
    return out


def oracle_holders(session: Session, oracle_id: int) -> list[int]:
    """The partners an oracle is granted to."""
    stmt = select(OracleGrant.partner_id).where(OracleGrant.oracle_id == oracle_id)
    return [int(p) for p in session.scalars(stmt)]


def has_oracle_grant(session: Session, partner_id: int, oracle_id: int) -> bool:
    stmt = select(OracleGrant.id).where(
        OracleGrant.partner_id == partner_id, OracleGrant.oracle_id == oracle_id
    )
    return session.execute(stmt).first() is not None


def add_oracle_grants(session: Session, partner_id: int, oracle_ids: Sequence[int]) -> None:
    have = set(granted_oracle_ids(session, partner_id))
    for oid in dict.fromkeys(oracle_ids):
        if oid not in have:
            session.add(OracleGrant(partner_id=partner_id, oracle_id=oid))
    session.flush()
