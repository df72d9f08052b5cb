"""The hot path of every study iteration: a ``column`` query of a partner without output privacy, answered in
one transaction of Core statements run on the driver's cursor (``answer_repository``) instead of the ORM.

It writes exactly what ``queries.create_query`` writes for such a query, in the same order and under the
same locks: the quota charge, the pending question, its person's (unbounded) output charge, the answer
and its link in the release's hash chain, the moved head, the request's access-log entry, all committed
(fsync'd) together before the answer is returned. Anything else (the admin token, a bad or revoked token,
output privacy, an ungranted release, an index out of range, a used Idempotency-Key, a used-up quota, a
``manual`` dataset, an Idempotency-Key used before: its insert fails the unique constraint) makes it step
aside with nothing committed, and the request takes ``queries.create_query``, which answers, replays or
refuses it as always.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy.exc import IntegrityError

from curator_service import answer_repository as arepo
from curator_service import faults
from curator_service.db import Database
from curator_service.models import utcnow
from curator_service.services.access_log import PendingEntry
from curator_service.services.auth import Principal
from curator_service.storage import ArrayStore
from shared.privacy.rng import os_entropy_rng
from shared.servicekit.tokens import hash_token

__all__ = ["AnsweredQuery", "answer_at_once", "column_outcome"]


@dataclass(frozen=True)
class AnsweredQuery:
    """A query as written by this path (the attribute names of ``models.Query`` that a response and a chain
    link read)."""

    id: int
    release_id: int
    partner_id: int
    row_index: int
    status: str
    y: float | None
    idempotency_key: str | None
    created_at: datetime
    completed_at: datetime | None
    charged_epsilon: float | None = None
    source_query_id: int | None = None


def column_outcome(
    store: ArrayStore, outcomes_path: str, outcomes_sha256: str, noise_std: float, index: int
) -> float:
    """Stored outcome of row ``index`` plus fresh N(0, noise_std^2) noise (a new OS-entropy draw)."""
    value = float(store.load(outcomes_path, outcomes_sha256)[index])
    if noise_std > 0:
        value += float(noise_std * os_entropy_rng().standard_normal())
    return value


class _StepAside(Exception):
    """Raised inside the transaction to roll it back and leave the request to ``queries.create_query``: a
    case this path does not answer, or an Idempotency-Key used before (its insert failed the unique
    constraint; the full path replays the query under that key, or refuses a different one)."""


def answer_at_once(
    db: Database,
    store: ArrayStore,
    admin_token_hash: str,
    token: str,
    release_id: int,
    index: int,
    idempotency_key: str | None,
    access_entry: PendingEntry | None,
    authenticated: Callable[[Principal], None],
) -> AnsweredQuery | None:
    """Answer the query here, committed, or return None (nothing written) for ``queries.create_query``.
    ``authenticated(principal)`` is called as soon as the token is known to be a partner's (the request's
    access-log entry names it, even if what follows fails)."""
    digest = hash_token(token)
    if hmac.compare_digest(digest, admin_token_hash):
        return None
    sql = arepo.statements(db.engine)
    try:
        with db.driver_transaction() as cur:
            row = sql.partner_and_granted_release(cur, digest, release_id)
            if (
                row is None
                or not hmac.compare_digest(row["token_hash"], digest)
                or row["revoked_at"] is not None
                or row["output_privacy"] is not None
            ):
                raise _StepAside
            partner_id = int(row["partner_id"])
            principal = Principal("partner", partner_id)
            authenticated(principal)
            if (
                index >= row["n"]
                or row["objective_mode"] != "column"
                or not sql.charge_quota(cur, partner_id)
            ):
                raise _StepAside
            # SQLite: the write transaction is exclusive since its first statement, so the head read with the
            # release is current. PostgreSQL: the release row is locked (and its head read) after the quota
            # charge's partner lock and before the insert, as ``queries.create_query`` does.
            head = (
                (int(row["chain_count"]), str(row["chain_head"]))
                if sql.is_sqlite
                else sql.lock_head(cur, release_id)
            )
            created = utcnow()
            try:
                query_id = sql.insert_pending(
                    cur,
                    release_id=release_id,
                    partner_id=partner_id,
                    row_index=index,
                    key=idempotency_key,
                    created_at=created,
                )
            except IntegrityError as exc:  # the Idempotency-Key was used before (a replay, or a twin)
                raise _StepAside from exc
            query = AnsweredQuery(
                query_id, release_id, partner_id, index, "pending", None, idempotency_key, created, None
            )
            sql.add_output_charge(  # a raw answer: its person's output epsilon is unbounded
                cur,
                population_id=row["population_id"],
                dataset_id=row["dataset_id"],
                row_index=index,
                query_id=query_id,
                partner_id=partner_id,
                epsilon=None,
            )
            y = column_outcome(store, row["outcomes_path"], row["outcomes_sha256"], row["noise_std"], index)
            written = sql.link(cur, query, y, head)
            if access_entry is not None:
                access_entry.add_with(lambda fields: sql.add_access_log(cur, fields), principal, 201)
            faults.pause_point("query.before_commit")  # crash tests: answered in memory, nothing on record
        # committed (fsync'd) as the block ended: question, charges and answer are on record before it leaves
        if access_entry is not None:
            access_entry.committed()
        return replace(query, status="complete", y=y, completed_at=written["completed_at"])
    except _StepAside:
        return None
