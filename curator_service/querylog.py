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

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Connection, Table, bindparam, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from curator_service.models import Query, QueryCorrection, Release, utcnow
from shared.servicekit.hashchain import ChainLink, Verification, link_hash, verify_links

__all__ = [
    "CHAIN_HEAD",
    "COMPLETE_AND_LINK",
    "MOVE_HEAD",
    "append_to_chain",
    "complete_and_link",
    "correction_payload",
    "link_corrections",
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


def correction_payload(correction: Any, seq: int) -> dict[str, Any]:
    """Every field a correction's link covers (a ``QueryCorrection`` or a row with its attribute names):
    both values, so the log keeps what was answered before and what replaced it."""
    return {
        "seq": int(seq),
        "entry": "correction",
        "query_id": int(correction.query_id),
        "release_id": int(correction.release_id),
        "partner_id": int(correction.partner_id),
        "kind": str(correction.kind),
        "previous_y": float(correction.previous_y),
        "y": float(correction.y),
        "reason": str(correction.reason),
        "created_at": correction.created_at,
    }


def link_corrections(session: Session, corrections: Sequence[QueryCorrection]) -> None:
    """Link new corrections (not added yet) into their releases' chains, add them and move the heads.

    Each release row is locked (PostgreSQL ``FOR UPDATE``, in release order) before its corrections are
    inserted, as :func:`lock_release` explains; the links follow the head in the order given."""
    conn = session.connection()
    for release_id in sorted({c.release_id for c in corrections}):
        count, prev = lock_head(conn, release_id)
        for c in (c for c in corrections if c.release_id == release_id):
            count += 1
            c.chain_seq, c.prev_hash = count, prev
            c.hash = prev = link_hash(prev, correction_payload(c, count))
            session.add(c)
        session.flush()
        conn.execute(MOVE_HEAD, {"release_id": release_id, "new_count": count, "new_head": prev})


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
    """Check a release's query chain; returns the verification and the stored head hash.

    The chain interleaves the queries' links and their corrections' links by position. A corrected query's
    own link covered the value it was first completed with: its first correction's ``previous_y``. Each
    correction's ``previous_y`` is checked as the value before it (the previous correction's ``y``) and the
    last one's ``y`` as the query's current value, so neither the query row nor a correction can be edited
    without a link failing.
    """
    release = session.execute(
        select(Release).where(Release.id == release_id).execution_options(populate_existing=True)
    ).scalar_one()
    rows = session.scalars(
        select(Query)
        .where(Query.release_id == release_id, (Query.chain_seq.is_not(None)) | (Query.status == "complete"))
        .order_by(Query.chain_seq.is_(None), Query.chain_seq, Query.id)
        .execution_options(populate_existing=True)
    ).all()
    corrections = session.scalars(
        select(QueryCorrection)
        .where(QueryCorrection.release_id == release_id)
        .order_by(QueryCorrection.chain_seq, QueryCorrection.id)
        .execution_options(populate_existing=True)
    ).all()
    by_query: dict[int, list[QueryCorrection]] = {}
    for c in corrections:
        by_query.setdefault(c.query_id, []).append(c)
    current = {q.id: q.y for q in rows}
    entries: list[tuple[int, ChainLink]] = []
    for q in rows:
        payload = query_payload(q, q.chain_seq if q.chain_seq is not None else 0)
        chain = by_query.get(q.id)
        if chain:
            payload["y"] = float(chain[0].previous_y)
        entries.append((q.chain_seq if q.chain_seq is not None else 0, _link(q, payload)))
    for query_id, chain in by_query.items():
        for k, c in enumerate(chain):
            payload = correction_payload(c, c.chain_seq)
            if k > 0:
                payload["previous_y"] = float(chain[k - 1].y)
            if k == len(chain) - 1:
                value = current.get(query_id)
                payload["y"] = None if value is None else float(value)
            entries.append((c.chain_seq, _link(c, payload)))
    # unlinked complete queries (seq None, sorted first by 0) stay where verify_links reports them
    links = [link for _, link in sorted(entries, key=lambda e: (e[0] == 0, e[0]))]
    result = verify_links(links, expected_count=int(release.chain_count), expected_head=release.chain_head)
    return result, release.chain_head


def _link(row: Query | QueryCorrection, payload: dict[str, Any]) -> ChainLink:
    return ChainLink(seq=row.chain_seq, prev_hash=row.prev_hash, hash=row.hash, payload=payload)
