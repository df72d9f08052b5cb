"""The statements of the answered-query hot path (``services/answers.py``): SQLAlchemy Core on the columns
the path reads and writes, built once at import with bind parameters, compiled once per database and run
on the driver's cursor (``shared.servicekit.driver_sql``). No ORM entity is loaded or tracked, and no
SQLAlchemy execution context is built, so each statement costs its SQL and little Python around it.

Columns that the ORM fills from Python defaults (``created_at``, ``at``) are bound explicitly here, with
the same ``utcnow()``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Engine, Table, bindparam, insert, select

from curator_service import querylog
from curator_service.models import (
    AccessLog,
    Dataset,
    Grant,
    OutputCharge,
    Partner,
    PartnerToken,
    Query,
    Release,
    utcnow,
)
from curator_service.repository import CHARGE_QUOTA
from shared.servicekit.driver_sql import DriverStatement, PerEngine

__all__ = ["AnswerStatements", "statements"]

_P, _R, _D = (cast(Table, m.__table__) for m in (Partner, Release, Dataset))
_G, _Q = cast(Table, Grant.__table__), cast(Table, Query.__table__)
_C, _A = cast(Table, OutputCharge.__table__), cast(Table, AccessLog.__table__)
_T = cast(Table, PartnerToken.__table__)

#: The partner holding a token with this digest (and the token's revocation), the release if granted to
#: it, its chain head and what answering from its dataset's outcome column needs: one row, or none (no such
#: token, release or grant).
PARTNER_AND_GRANTED_RELEASE = (
    select(
        _P.c.id.label("partner_id"),
        _T.c.token_hash,
        _T.c.revoked_at.label("token_revoked_at"),
        _P.c.revoked_at,
        _P.c.output_privacy,
        _R.c.n,
        _R.c.dataset_id,
        _R.c.chain_count,
        _R.c.chain_head,
        _R.c.erased_at,
        _D.c.population_id,
        _D.c.objective_mode,
        _D.c.noise_std,
        _D.c.outcomes_path,
        _D.c.outcomes_sha256,
    )
    .select_from(
        _T.join(_P, _P.c.id == _T.c.partner_id)
        .join(_G, (_G.c.partner_id == _P.c.id) & (_G.c.release_id == bindparam("release_id")))
        .join(_R, _R.c.id == _G.c.release_id)
        .join(_D, _D.c.id == _R.c.dataset_id)
    )
    .where(_T.c.token_hash == bindparam("token_hash"))
)
INSERT_PENDING = (
    insert(_Q)
    .values(
        release_id=bindparam("release_id"),
        partner_id=bindparam("partner_id"),
        row_index=bindparam("row_index"),
        status="pending",
        idempotency_key=bindparam("key"),
        created_at=bindparam("created_at"),
    )
    .returning(_Q.c.id)
)
INSERT_OUTPUT_CHARGE = insert(_C).values(
    {name: bindparam(name) for name in _C.columns.keys() if name != "id"}  # noqa: SIM118
)
INSERT_ACCESS_LOG = insert(_A).values(
    {name: bindparam(name) for name in _A.columns.keys() if name != "id"}  # noqa: SIM118
)


class AnswerStatements:
    """The path's statements compiled for one engine, each a function of a driver cursor."""

    def __init__(self, engine: Engine) -> None:
        self.is_sqlite = engine.dialect.name == "sqlite"
        compiled = {
            name: DriverStatement(statement, engine)
            for name, statement in {
                "select": PARTNER_AND_GRANTED_RELEASE,
                "quota": CHARGE_QUOTA,
                "head": querylog.CHAIN_HEAD,
                "insert": INSERT_PENDING,
                "charge": INSERT_OUTPUT_CHARGE,
                "link": querylog.COMPLETE_AND_LINK,
                "move": querylog.MOVE_HEAD,
                "log": INSERT_ACCESS_LOG,
            }.items()
        }
        self._s = compiled

    def partner_and_granted_release(
        self, cur: Any, token_hash: str, release_id: int
    ) -> dict[str, Any] | None:
        """The row of ``PARTNER_AND_GRANTED_RELEASE``, or None."""
        return self._s["select"].one_or_none(cur, {"token_hash": token_hash, "release_id": release_id})

    def charge_quota(self, cur: Any, partner_id: int) -> bool:
        """One query off the partner's quota, iff any is left."""
        return bool(self._s["quota"].run(cur, {"partner_id": partner_id}).rowcount == 1)

    def lock_head(self, cur: Any, release_id: int) -> tuple[int, str]:
        """Lock the release row (PostgreSQL ``FOR UPDATE``) and read its chain head: (count, last hash)."""
        row = self._s["head"].one_or_none(cur, {"release_id": release_id})
        assert row is not None
        return int(row["chain_count"]), str(row["chain_head"])

    def insert_pending(
        self,
        cur: Any,
        *,
        release_id: int,
        partner_id: int,
        row_index: int,
        key: str | None,
        created_at: datetime,
    ) -> int:
        """Insert the question as a pending query; its id."""
        params = {
            "release_id": release_id,
            "partner_id": partner_id,
            "row_index": row_index,
            "key": key,
            "created_at": created_at,
        }
        row = self._s["insert"].one_or_none(cur, params)
        assert row is not None
        return int(row["id"])

    def add_output_charge(self, cur: Any, **columns: Any) -> None:
        """Charge one answer to its person (``repository.add_output_charge``'s row; the query's own answer,
        ``answer_no`` 0)."""
        self._s["charge"].run(cur, {"created_at": utcnow(), "answer_no": 0, **columns})

    def link(self, cur: Any, query: Any, y: float, head: tuple[int, str]) -> dict[str, Any]:
        """``querylog.link_inserted`` on the cursor: answer and link the pending query, move the head."""
        values = querylog.link_values(query, y, None, head)
        link, move = querylog.link_params(query, values)
        if self._s["link"].run(cur, link).rowcount != 1:
            raise RuntimeError(f"query {query.id} was not pending in the transaction that inserted it")
        self._s["move"].run(cur, move)
        return values

    def add_access_log(self, cur: Any, columns: dict[str, Any]) -> None:
        """One access-log row (``repository.add_access_log``'s)."""
        self._s["log"].run(cur, {"at": utcnow(), **columns})


#: The statements for an engine, compiled on first use.
statements = PerEngine(AnswerStatements)
