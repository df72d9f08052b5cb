"""The statements of the answered-query hot path (``services/answers.py``): SQLAlchemy Core on the columns
the path reads, built once at import with bind parameters, run on the session's connection. No ORM
entity is loaded or tracked, so each statement costs its SQL and little Python around it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, Table, bindparam, insert, select

from curator_service.models import Dataset, Grant, Partner, Query, Release

#: A result row of any width.
AnyRow = Row[*tuple[Any, ...]]

_P, _R, _D = (cast(Table, m.__table__) for m in (Partner, Release, Dataset))
_G, _Q = cast(Table, Grant.__table__), cast(Table, Query.__table__)

#: The partner with this token digest, the release if granted to it, its chain head and what answering
#: from its dataset's outcome column needs: one row, or none (no such partner, release or grant).
_PARTNER_AND_GRANTED_RELEASE = (
    select(
        _P.c.id.label("partner_id"),
        _P.c.token_hash,
        _P.c.revoked_at,
        _P.c.output_privacy,
        _R.c.n,
        _R.c.dataset_id,
        _R.c.chain_count,
        _R.c.chain_head,
        _D.c.population_id,
        _D.c.objective_mode,
        _D.c.noise_std,
        _D.c.outcomes_path,
        _D.c.outcomes_sha256,
    )
    .select_from(
        _P.join(_G, (_G.c.partner_id == _P.c.id) & (_G.c.release_id == bindparam("release_id")))
        .join(_R, _R.c.id == _G.c.release_id)
        .join(_D, _D.c.id == _R.c.dataset_id)
    )
    .where(_P.c.token_hash == bindparam("token_hash"))
)
_INSERT_PENDING = insert(_Q).values(
    release_id=bindparam("release_id"),
    partner_id=bindparam("partner_id"),
    row_index=bindparam("row_index"),
    status="pending",
    idempotency_key=bindparam("key"),
    created_at=bindparam("created_at"),
)


def partner_and_granted_release(conn: Connection, token_hash: str, release_id: int) -> AnyRow | None:
    """The row of ``_PARTNER_AND_GRANTED_RELEASE``, or None."""
    params = {"token_hash": token_hash, "release_id": release_id}
    return conn.execute(_PARTNER_AND_GRANTED_RELEASE, params).one_or_none()


def insert_pending(
    conn: Connection,
    *,
    release_id: int,
    partner_id: int,
    row_index: int,
    key: str | None,
    created_at: datetime,
) -> int:
    """Insert the question as a pending query; its id."""
    result = conn.execute(
        _INSERT_PENDING,
        {
            "release_id": release_id,
            "partner_id": partner_id,
            "row_index": row_index,
            "key": key,
            "created_at": created_at,
        },
    )
    key_values = result.inserted_primary_key
    assert key_values is not None
    return int(key_values[0])
