"""The hot path of every study iteration: a ``column`` query of a partner without output privacy, answered in
one transaction of Core statements run on the driver's cursor (``answer_repository``) instead of the ORM.

What such a query writes is ``write_answer``, used by ``queries.create_query`` as well (one write path):
the quota charge before it, then the pending question, its person's (unbounded) output charge, the answer
and its link in the release's hash chain, the moved head, the request's access-log entry, all committed
(fsync'd) together before the answer is returned. The fast lane only adds the authentication and checks in
one statement, past FastAPI's routing and validation. Anything else (the admin token, a bad or revoked token,
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
from typing import Any

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

__all__ = ["AnswerSource", "AnsweredQuery", "answer_at_once", "column_outcome", "write_answer"]


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
                or row["token_revoked_at"] is not None
                or row["output_privacy"] is not None
                or row["erased_at"] is not None  # the general path answers 410
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
            # release is current (PostgreSQL: ``write_answer`` locks the release row and reads its head).
            head = (int(row["chain_count"]), str(row["chain_head"])) if sql.is_sqlite else None
            try:
                query = write_answer(
                    sql,
                    cur,
                    store,
                    AnswerSource.of(row),
                    release_id=release_id,
                    partner_id=partner_id,
                    index=index,
                    idempotency_key=idempotency_key,
                    head=head,
                    access_entry=access_entry,
                    principal=principal,
                )
            except IntegrityError as exc:  # the Idempotency-Key was used before (a replay, or a twin)
                raise _StepAside from exc
            faults.pause_point("query.before_commit")  # crash tests: answered in memory, nothing on record
        # committed (fsync'd) as the block ended: question, charges and answer are on record before it leaves
        if access_entry is not None:
            access_entry.committed()
        return query
    except _StepAside:
        return None


@dataclass(frozen=True)
class AnswerSource:
    """Where a raw ``column`` answer comes from: the release's dataset, its population and outcome column."""

    population_id: int
    dataset_id: int
    outcomes_path: str
    outcomes_sha256: str
    noise_std: float

    @classmethod
    def of(cls, row: Any) -> AnswerSource:
        """From a row or an object with these names (``PARTNER_AND_GRANTED_RELEASE``, a ``Dataset``)."""
        get = row.__getitem__ if isinstance(row, dict) else lambda k: getattr(row, k)
        return cls(
            int(get("population_id")),
            int(get("dataset_id")),
            str(get("outcomes_path")),
            str(get("outcomes_sha256")),
            float(get("noise_std")),
        )


def write_answer(
    sql: arepo.AnswerStatements,
    cur: Any,
    store: ArrayStore,
    source: AnswerSource,
    *,
    release_id: int,
    partner_id: int,
    index: int,
    idempotency_key: str | None,
    head: tuple[int, str] | None,
    access_entry: PendingEntry | None,
    principal: Principal,
) -> AnsweredQuery:
    """What an answered raw ``column`` query writes, on the cursor of the caller's transaction (the quota
    charged and the partner row locked before): the release row locked and its chain head read (unless
    ``head`` is given: SQLite's exclusive transaction read it with the release), the pending question, its
    person's (unbounded) output charge, the answer and its link in the release's hash chain, the moved head
    and the request's access-log entry. The one write path of such a query, for the fast lane
    (``answer_at_once``) and the use case (``queries.create_query``) alike; an Idempotency-Key used before
    fails the insert (``IntegrityError``) with nothing else written."""
    if head is None:
        head = sql.lock_head(cur, release_id)
    created = utcnow()
    query_id = sql.insert_pending(
        cur,
        release_id=release_id,
        partner_id=partner_id,
        row_index=index,
        key=idempotency_key,
        created_at=created,
    )
    query = AnsweredQuery(
        query_id, release_id, partner_id, index, "pending", None, idempotency_key, created, None
    )
    sql.add_output_charge(  # a raw answer: its person's output epsilon is unbounded
        cur,
        population_id=source.population_id,
        dataset_id=source.dataset_id,
        row_index=index,
        query_id=query_id,
        partner_id=partner_id,
        epsilon=None,
    )
    y = column_outcome(store, source.outcomes_path, source.outcomes_sha256, source.noise_std, index)
    written = sql.link(cur, query, y, head)
    if access_entry is not None:
        access_entry.add_with(lambda fields: sql.add_access_log(cur, fields), principal, 201)
    return replace(query, status="complete", y=y, completed_at=written["completed_at"])
