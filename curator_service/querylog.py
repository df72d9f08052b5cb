"""The curator's query log as a hash chain (one chain per release), mirroring the modeler's audit log.

A query joins its release's chain when its outcome is recorded (``column`` outcomes at once, ``manual`` ones
when the operator posts the value), in that same transaction: the release row is locked (PostgreSQL
``SELECT ... FOR UPDATE``; SQLite's write transaction is exclusive already), the link is
``hash = sha256(prev_hash + canonical_json(payload))`` and the release keeps the head
(count and last hash), so edited, deleted, reordered or truncated entries are all detected by
:func:`verify_release_chain`. Pending queries are not in the chain yet; their existence is on record in the
queries table (committed before evaluation) and in the access log.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Connection, Table, bindparam, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from curator_service.models import Query, Release, utcnow
from shared.servicekit.hashchain import ChainLink, Verification, link_hash, verify_links

__all__ = [
    "CHAIN_HEAD",
    "COMPLETE_AND_LINK",
    "MOVE_HEAD",
    "append_to_chain",
    "complete_and_link",
    "link_inserted",
    "link_params",
    "link_values",
    "lock_head",
    "lock_release",
    "query_payload",
    "verify_release_chain",
]


def query_payload(query: Any, seq: int) -> dict[str, Any]:
    """Every field a link covers (a ``Query`` or a row with the same attribute names)."""
    return {
        "seq": int(seq),
        "query_id": int(query.id),
        "release_id": int(query.release_id),
        "partner_id": int(query.partner_id),
        "index": int(query.row_index),
        "status": str(query.status),
        "y": None if query.y is None else float(query.y),
        "idempotency_key": query.idempotency_key,
        "created_at": query.created_at,
        "completed_at": query.completed_at,
    }


def append_to_chain(session: Session, query_id: int) -> None:
    """Link a just-completed query into its release's chain (call inside the completing transaction)."""
    query = session.execute(
        select(Query).where(Query.id == query_id).execution_options(populate_existing=True)
    ).scalar_one()
    release = session.execute(
        select(Release)
        .where(Release.id == query.release_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one()
    seq = int(release.chain_count) + 1
    prev = release.chain_head
    digest = link_hash(prev, query_payload(query, seq))
    session.execute(
        update(Query)
        .where(Query.id == query_id)
        .values(chain_seq=seq, prev_hash=prev, hash=digest)
        .execution_options(synchronize_session=False)
    )
    session.execute(
        update(Release)
        .where(Release.id == release.id)
        .values(chain_count=seq, chain_head=digest)
        .execution_options(synchronize_session=False)
    )


def lock_release(session: Session, release_id: int) -> None:
    """Lock the release row for the rest of the transaction *before* a query of it is inserted.

    PostgreSQL: ``SELECT ... FOR UPDATE``. A transaction that inserts a query holds a key-share lock on its
    release (the foreign key) until it commits; two of them both waiting to append to the chain
    (``FOR UPDATE``) would deadlock, so a transaction that inserts *and* answers takes the release lock
    first (after the population lock, the order ``outputs.record_answer`` uses). SQLite: nothing to do,
    the write transaction (``BEGIN IMMEDIATE``) is exclusive already.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(Release.id).where(Release.id == release_id).with_for_update())


_RELEASES, _QUERIES = cast(Table, Release.__table__), cast(Table, Query.__table__)
#: :func:`complete_and_link`'s three statements, built once (bind parameters named ``new_*`` where a
#: column's own name is reserved for its SET clause).
CHAIN_HEAD = (
    select(_RELEASES.c.chain_count, _RELEASES.c.chain_head)
    .where(_RELEASES.c.id == bindparam("release_id"))
    .with_for_update()
)
COMPLETE_AND_LINK = (
    update(_QUERIES)
    .where(_QUERIES.c.id == bindparam("query_id"), _QUERIES.c.status == "pending")
    .values(
        {
            name: bindparam(f"new_{name}")
            for name in ("status", "y", "y_raw", "completed_at", "chain_seq", "prev_hash", "hash")
        }
    )
)
MOVE_HEAD = (
    update(_RELEASES)
    .where(_RELEASES.c.id == bindparam("release_id"))
    .values(chain_count=bindparam("new_count"), chain_head=bindparam("new_head"))
)


def complete_and_link(session: Session, query: Query, y: float, y_raw: float | None) -> None:
    """Complete a query inserted (and flushed) by this very transaction and link it into its release's
    chain: the same lock, order and payload as :func:`append_to_chain` after ``repository.complete_query``,
    in three statements (lock and read the head, write answer and link, move the head).

    The query is still pending (no other transaction can see it), so no first-writer check can fail. The
    written values are set on ``query`` as committed state: the caller answers from it without a re-read.
    """
    session.flush()  # anything ``admit`` left pending goes first, as an autoflush would send it
    conn = session.connection()  # Core statements on the session's transaction: no ORM round trip
    values = link_inserted(conn, query, y, y_raw, lock_head(conn, query.release_id))
    for key, value in values.items():
        set_committed_value(query, key, value)


def lock_head(conn: Connection, release_id: int) -> tuple[int, str]:
    """Lock the release row (PostgreSQL ``FOR UPDATE``) and read its chain head: (count, last hash)."""
    count, prev = conn.execute(CHAIN_HEAD, {"release_id": release_id}).one()
    return int(count), str(prev)


def link_values(query: Any, y: float, y_raw: float | None, head: tuple[int, str]) -> dict[str, Any]:
    """The columns that answer a pending query and link it after ``head`` (count, last hash) of its
    release's chain: status, y, y_raw, completed_at (now), chain_seq, prev_hash, hash."""
    count, prev = head
    seq = count + 1
    values: dict[str, Any] = {"status": "complete", "y": y, "y_raw": y_raw, "completed_at": utcnow()}
    payload = query_payload(query, seq) | {
        "status": "complete",
        "y": float(y),
        "completed_at": values["completed_at"],
    }
    return values | {"chain_seq": seq, "prev_hash": prev, "hash": link_hash(prev, payload)}


def link_params(query: Any, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parameters of ``COMPLETE_AND_LINK`` and ``MOVE_HEAD`` that write ``values`` (``link_values``)."""
    return (
        {"query_id": query.id} | {f"new_{k}": v for k, v in values.items()},
        {"release_id": query.release_id, "new_count": values["chain_seq"], "new_head": values["hash"]},
    )


def link_inserted(
    conn: Connection, query: Any, y: float, y_raw: float | None, head: tuple[int, str]
) -> dict[str, Any]:
    """Write the answer and the chain link of a pending query this transaction inserted, and move the head
    (the release row locked by :func:`lock_head`, whose ``head`` this is). Returns the columns written."""
    values = link_values(query, y, y_raw, head)
    link, move = link_params(query, values)
    if conn.execute(COMPLETE_AND_LINK, link).rowcount != 1:
        raise RuntimeError(f"query {query.id} was not pending in the transaction that inserted it")
    conn.execute(MOVE_HEAD, move)
    return values


def verify_release_chain(session: Session, release_id: int) -> tuple[Verification, str]:
    """Check a release's query chain; returns the verification and the stored head hash."""
    release = session.execute(
        select(Release).where(Release.id == release_id).execution_options(populate_existing=True)
    ).scalar_one()
    rows = session.scalars(
        select(Query)
        .where(Query.release_id == release_id, (Query.chain_seq.is_not(None)) | (Query.status == "complete"))
        .order_by(Query.chain_seq.is_(None), Query.chain_seq, Query.id)
        .execution_options(populate_existing=True)
    ).all()
    links = [
        ChainLink(
            seq=q.chain_seq,
            prev_hash=q.prev_hash,
            hash=q.hash,
            payload=query_payload(q, q.chain_seq if q.chain_seq is not None else 0),
        )
        for q in rows
    ]
    result = verify_links(links, expected_count=int(release.chain_count), expected_head=release.chain_head)
    return result, release.chain_head
