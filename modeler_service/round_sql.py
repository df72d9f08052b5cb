"""The statements of a round's two write transactions (``runner.Stepper``): the write-ahead intent (with
the step's claim) and the round's record (audit entries and the study's counters).

Core statements, built once at import, compiled once per database and run on the driver's cursor
(``shared.servicekit.driver_sql``) inside ``db.driver_transaction``: they run every iteration, and a Core
execution's own work was most of their cost. :class:`RoundWriter` binds them to one transaction's cursor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnElement, Engine, Table, bindparam, case, insert, null, or_, update

from modeler_service.models import AuditEntry, Study, utcnow
from modeler_service.repository import ACTIVE_STATUSES
from shared.servicekit.driver_sql import DriverStatement, PerEngine

__all__ = ["RoundStatements", "RoundWriter", "statements"]

_AUDIT = cast(Table, AuditEntry.__table__)
_STUDIES = cast(Table, Study.__table__)
_AUDIT_COLUMNS = tuple(key for key in _AUDIT.columns.keys() if key != "id")  # noqa: SIM118
INSERT_AUDIT = insert(_AUDIT).values({key: bindparam(key) for key in _AUDIT_COLUMNS})
_ADVANCE_WHERE = (
    (_STUDIES.c.id == bindparam("b_id"))
    & (_STUDIES.c.rounds_done == bindparam("b_prev_round"))
    & (_STUDIES.c.iterations_done == bindparam("b_prev_done"))
    & (_STUDIES.c.audit_head == bindparam("b_prev_head"))
    & _STUDIES.c.pending_round.is_not(None)
)
_ADVANCE_VALUES: dict[str, Any] = {
    "iterations_done": bindparam("b_done"),
    "rounds_done": bindparam("b_round"),
    "audit_head": bindparam("b_head"),
    "best_index": bindparam("b_best_index"),
    "best_y": bindparam("b_best_y"),
    "theta": bindparam("b_theta", type_=_STUDIES.c.theta.type),
    "pending_round": null(),
    "updated_at": bindparam("b_now", type_=_STUDIES.c.updated_at.type),
}
_ACTIVE = or_(*(_STUDIES.c.status == status for status in ACTIVE_STATUSES))  # (a driver takes no IN list)
ADVANCE = update(_STUDIES).where(_ADVANCE_WHERE).values(**_ADVANCE_VALUES)
ADVANCE_AND_SETTLE = (
    update(_STUDIES)
    .where(_ADVANCE_WHERE)
    .values(
        **_ADVANCE_VALUES,
        status=case((_ACTIVE, bindparam("b_status")), else_=_STUDIES.c.status),
        run_target=case((_ACTIVE, null()), else_=_STUDIES.c.run_target),
    )
)
_PLANNED_WHERE = (
    (_STUDIES.c.id == bindparam("b_id"))
    & _STUDIES.c.pending_round.is_(None)
    & (_STUDIES.c.rounds_done == bindparam("b_rounds_done"))
    & (_STUDIES.c.iterations_done == bindparam("b_done"))
    & (_STUDIES.c.iterations_total == bindparam("b_total"))
    & (_STUDIES.c.supersessions_done == bindparam("b_superseded"))
)
_PLANNED_VALUES: dict[str, Any] = {"pending_round": bindparam("b_intent"), "updated_at": bindparam("b_now")}
WRITE_PLANNED = update(_STUDIES).where(_PLANNED_WHERE).values(**_PLANNED_VALUES).returning(*_STUDIES.c)


def claim_planned(statuses: Sequence[str]) -> Any:
    """``WRITE_PLANNED`` that also claims the study from one of ``statuses`` (it becomes ``running`` with
    the run target ``b_target``). The statuses are bound one by one (a driver takes no list)."""
    among: ColumnElement[bool] = or_(*(_STUDIES.c.status == status for status in statuses))
    return (
        update(_STUDIES)
        .where(_PLANNED_WHERE & among)
        .values(**_PLANNED_VALUES, status="running", run_target=bindparam("b_target"), error=null())
        .returning(*_STUDIES.c)
    )


class RoundStatements:
    """The statements compiled for one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.insert_audit = DriverStatement(INSERT_AUDIT, engine)
        self.advance = DriverStatement(ADVANCE, engine)
        self.advance_and_settle = DriverStatement(ADVANCE_AND_SETTLE, engine)
        self.write_planned = DriverStatement(WRITE_PLANNED, engine)
        self._claims: dict[tuple[str, ...], DriverStatement] = {}

    def claim(self, statuses: Sequence[str]) -> DriverStatement:
        key = tuple(statuses)
        found = self._claims.get(key)
        if found is None:
            found = self._claims[key] = DriverStatement(claim_planned(key), self.engine)
        return found


#: The statements for an engine, compiled on first use.
statements = PerEngine(RoundStatements)


@dataclass(frozen=True)
class RoundWriter:
    """The round statements on the cursor of one write transaction (``db.driver_transaction``)."""

    sql: RoundStatements
    cur: Any

    def write_planned_round(
        self,
        study_id: str,
        *,
        intent: dict[str, Any],
        rounds_done: int,
        iterations_done: int,
        iterations_total: int,
        supersessions_done: int,
        claim_from: Sequence[str] | None = None,
        run_target: int | None = None,
    ) -> Study | None:
        """Write the intent of a round planned without reading the study, iff the study is what the plan
        assumed: no round in flight, ``rounds_done`` rounds and ``iterations_done`` of ``iterations_total``
        queries recorded, ``supersessions_done`` of its values superseded (a later one changes what the
        strategy observes: ``modeler_service.supersessions``) (and, with ``claim_from``, a status among
        those, which becomes ``running`` with ``run_target``). One conditional ``UPDATE ... RETURNING``:
        the study as written, as a detached ``Study`` nobody tracks, or None when it is not what the plan
        assumed (nothing written; the caller plans from a read)."""
        params: dict[str, Any] = {
            "b_id": study_id,
            "b_rounds_done": rounds_done,
            "b_done": iterations_done,
            "b_total": iterations_total,
            "b_superseded": supersessions_done,
            "b_intent": intent,
            "b_now": utcnow(),
        }
        statement = self.sql.write_planned
        if claim_from is not None:
            statement = self.sql.claim(claim_from)
            params["b_target"] = run_target
        row = statement.one_or_none(self.cur, params)
        return None if row is None else Study(**row)

    def insert_audit_entries(self, entries: Sequence[AuditEntry]) -> None:
        """The only write to the audit table: inserts (entries are never updated or deleted)."""
        rows = [{key: getattr(entry, key) for key in _AUDIT_COLUMNS} for entry in entries]
        self.sql.insert_audit.run_many(self.cur, rows)

    def advance_study(
        self,
        study_id: str,
        *,
        round_no: int,
        prev_done: int,
        done: int,
        prev_head: str,
        head: str,
        best_index: int | None,
        best_y: float | None,
        settle_status: str | None,
        theta: list[float] | None = None,
    ) -> bool:
        """Record round ``round_no`` on the study row, iff it is still the one in flight (one UPDATE).

        ``theta``: the strategy's point after the round (gradient studies; None for row studies).
        With ``settle_status`` the run also ends (status ``done``/``ready``, unless no runner owned it).
        """
        params: dict[str, Any] = {
            "b_id": study_id,
            "b_prev_round": round_no - 1,
            "b_round": round_no,
            "b_prev_done": prev_done,
            "b_done": done,
            "b_prev_head": prev_head,
            "b_head": head,
            "b_best_index": best_index,
            "b_best_y": best_y,
            "b_theta": theta,
            "b_now": utcnow(),
        }
        statement = self.sql.advance
        if settle_status is not None:
            statement, params["b_status"] = self.sql.advance_and_settle, settle_status
        return bool(statement.run(self.cur, params).rowcount == 1)
