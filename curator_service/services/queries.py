"""Outcome queries: a partner asks for row i's outcome; the curator answers from the column or by hand.

Every query is committed (and charged to the partner's quota, and to its person's output ledger) before its
answer is sent: a ``column`` query together with its answer, in one transaction; a ``manual`` one as pending,
before it is answered. It joins the release's hash-chained query log when its outcome is recorded
(``querylog.py``).
A partner with output privacy gets CTL-privatised answers (``outputs.py``); one without gets outcomes as they
are measured (``noise_std`` is simulation noise for retrospective pilots, not a privacy mechanism).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from curator_service import answer_repository as arepo
from curator_service import faults, querylog
from curator_service import lab_repository as lab_repo
from curator_service import repository as repo
from curator_service.db import Database
from curator_service.exceptions import Conflict, Gone, InvalidInput, NotFound, QuotaExceeded
from curator_service.models import Dataset, Query, QueryCorrection
from curator_service.services import answers, outputs
from curator_service.services.access_log import PendingEntry
from curator_service.services.auth import Principal
from curator_service.services.releases import get_release
from curator_service.storage import ArrayStore
from shared.servicekit.hashchain import GENESIS_HASH, Verification

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueryView:
    """A query and the corrections of it that the viewer may see (a partner: its supersessions)."""

    query: Query
    corrections: list[QueryCorrection] = field(default_factory=list)


def _visible_kinds(principal: Principal) -> tuple[str, ...] | None:
    return None if principal.is_admin else lab_repo.PARTNER_KINDS


def _delivered(session: Session, query: Query) -> Query:
    """Record that the query's partner is being sent it complete (the first time counts); the query as
    committed next. See ``services.corrections`` for what delivery decides."""
    if query.status != "complete" or query.delivered_at is not None:
        return query
    lab_repo.mark_delivered(session, partner_id=query.partner_id, query_id=query.id)
    fresh = repo.refresh_query(session, query.id)
    assert fresh is not None
    return fresh


def _column_outcome(store: ArrayStore, dataset: Dataset, index: int) -> float:
    """Stored outcome of row ``index`` plus fresh N(0, noise_std^2) noise (a new OS-entropy draw)."""
    assert dataset.outcomes_path is not None and dataset.outcomes_sha256 is not None
    return answers.column_outcome(
        store, dataset.outcomes_path, dataset.outcomes_sha256, dataset.noise_std, index
    )


def _settle(session: Session, store: ArrayStore, query: Query) -> Query:
    """Evaluate a committed pending ``column`` query, or a cached repeat whose first answer is in (idempotent:
    the first completion wins), and commit. Used for replays and crash recovery; a new ``column`` query is
    answered in the transaction that inserts it (``create_query``)."""
    if query.status != "pending":
        return query
    if query.source_query_id is not None:
        if not outputs.settle_repeat(session, query):
            return query
    else:
        dataset = _dataset_of(session, query)
        if dataset.objective_mode != "column":
            return query
        # same transaction: the (privatised) outcome and its chain link
        outputs.record_answer(session, query, dataset, _column_outcome(store, dataset, query.row_index))
    fresh = repo.refresh_query(session, query.id)  # what is committed next, read before the commit
    assert fresh is not None
    session.commit()  # deliberate: the outcome is on record before it is sent
    return fresh


def _dataset_of(session: Session, query: Query) -> Dataset:
    release = repo.get_release(session, query.release_id)
    assert release is not None
    dataset = repo.get_dataset(session, release.dataset_id)
    assert dataset is not None
    return dataset


def create_query(
    session: Session,
    store: ArrayStore,
    principal: Principal,
    release_id: int,
    index: int,
    idempotency_key: str | None,
    access_entry: PendingEntry | None = None,
) -> tuple[Query | answers.AnsweredQuery, bool]:
    """Ask for the outcome of row ``index``. Returns (query, replayed).

    ``access_entry``: the request's access-log entry; an answered ``column`` query writes it (status 201)
    in the transaction of its answer (``access_log.PendingEntry``).

    Order (each step matters):
    1. access: the release exists and is granted to this partner (404 for either);
    2. an ``Idempotency-Key`` seen before returns that query again, never charged twice (a different
       release or index under the same key is a 409);
    3. the index is in range (422), one query is taken from the quota (429);
    4. its person's output ledger is charged (``outputs.admit``: a raw answer is recorded as unbounded; a
       repeat under a cached-answer grant is free and points at the row's first noisy answer; past
       ``max_epsilon_per_row`` it is a 409 and the whole transaction, quota charge included, rolls back);
       a concurrent twin with the same key fails the unique constraint at the insert, is rolled back (its
       quota and output charges with it) and returns the winner's query;
    5. ``column`` datasets: the outcome is evaluated, recorded and linked into the chain in the same
       transaction (for a partner without output privacy by ``answers.write_answer``, the statements the
       fast lane runs), which is COMMITTED before the answer is returned: the question, its charges and its
       answer reach the disk together or not at all, so a crash can neither lose an answer that left nor
       answer a question twice with fresh noise (a crash before the commit leaves no trace, and a retry is
       a new question). ``manual`` datasets: the pending query is committed and stays pending until the
       curator posts the measured value.
    """
    assert principal.partner_id is not None
    partner_id = principal.partner_id
    release = get_release(session, principal, release_id)  # 404 alike for missing and ungranted
    if idempotency_key is not None:
        existing = repo.get_query_by_key(session, partner_id, idempotency_key)
        if existing is not None:
            return _delivered(session, _replay(session, store, existing, release_id, index)), True
    if index >= release.n:
        raise InvalidInput(
            f"index {index} is out of range: release {release_id} has n = {release.n} rows "
            f"(valid 0..{release.n - 1})"
        )
    if not repo.charge_quota(session, partner_id):
        partner = repo.get_partner(session, partner_id)
        if partner is not None:
            session.refresh(partner)  # the count as the failed charge saw it, not as authentication did
        used, quota = (partner.queries_used, partner.max_queries) if partner else (0, 0)
        raise QuotaExceeded(
            f"query quota used up: this partner has used {used} of its {quota} queries; "
            f"ask the curator to raise max_queries (PATCH /v1/partners/{partner_id})"
        )
    # read in this transaction when the request authenticated (no statement then); only its immutable
    # fields (id, output_privacy) are used below
    partner = repo.get_partner(session, partner_id)
    assert partner is not None
    dataset = repo.get_dataset(session, release.dataset_id)
    assert dataset is not None
    answer_now = dataset.objective_mode == "column"
    if answer_now and partner.output_privacy is None:
        return _answer_raw(
            session, store, principal, release_id, index, idempotency_key, dataset, access_entry
        )
    # Lock order (PostgreSQL): population before the query insert's key-share lock on the release, the
    # order in which completing an answer takes them (``outputs.record_answer``): no deadlock.
    outputs.serialise(session, partner, dataset)
    if answer_now:
        querylog.lock_release(session, release_id)  # before the insert: see ``querylog.lock_release``
    query = Query(
        release_id=release_id,
        partner_id=partner_id,
        row_index=index,
        status="pending",
        y=None,
        idempotency_key=idempotency_key,
    )
    session.add(query)
    try:
        session.flush()
        outputs.admit(session, partner, dataset, query)
        if not answer_now or query.source_query_id is not None:
            session.commit()  # deliberate: the question is on record before its answer exists
    except IntegrityError:
        session.rollback()
        if idempotency_key is None:
            raise
        existing = repo.get_query_by_key(session, partner_id, idempotency_key)
        if existing is None:
            raise
        return _delivered(session, _replay(session, store, existing, release_id, index)), True
    if not answer_now or query.source_query_id is not None:
        # manual, or a cached repeat (answered by ``admit`` already, or waiting for its first answer)
        faults.pause_point("query.after_commit")  # crash tests: the query is on record, not yet answered
        settled = _settle(session, store, query)
        return (_delivered(session, settled) if not answer_now else settled), False
    outputs.record_answer(session, query, dataset, _column_outcome(store, dataset, index), inserted=True)
    if access_entry is not None:
        access_entry.add(session, principal, 201)
    faults.pause_point("query.before_commit")  # crash tests: answered in memory, nothing on record yet
    session.commit()  # deliberate: question, charges and answer are on record before the answer is sent
    if access_entry is not None:
        access_entry.committed()
    return query, False


def _answer_raw(
    session: Session,
    store: ArrayStore,
    principal: Principal,
    release_id: int,
    index: int,
    idempotency_key: str | None,
    dataset: Dataset,
    access_entry: PendingEntry | None,
) -> tuple[Query | answers.AnsweredQuery, bool]:
    """A raw ``column`` query (quota charged): written by ``answers.write_answer`` on this transaction's
    cursor, the very statements of the fast lane, and committed before the answer is returned."""
    assert principal.partner_id is not None and dataset.outcomes_path and dataset.outcomes_sha256
    bind = session.get_bind()
    assert isinstance(bind, Engine)
    source = answers.AnswerSource(
        dataset.population_id, dataset.id, dataset.outcomes_path, dataset.outcomes_sha256, dataset.noise_std
    )
    try:
        with Database.session_cursor(session) as cur:
            answered = answers.write_answer(
                arepo.statements(bind),
                cur,
                store,
                source,
                release_id=release_id,
                partner_id=principal.partner_id,
                index=index,
                idempotency_key=idempotency_key,
                head=None,
                access_entry=access_entry,
                principal=principal,
            )
    except IntegrityError:  # a concurrent twin with the same key won: roll back, return its query
        session.rollback()
        existing = repo.get_query_by_key(session, principal.partner_id, idempotency_key or "")
        if idempotency_key is None or existing is None:
            raise
        return _replay(session, store, existing, release_id, index), True
    faults.pause_point("query.before_commit")  # crash tests: answered in memory, nothing on record yet
    session.commit()  # deliberate: question, charges and answer are on record before the answer is sent
    if access_entry is not None:
        access_entry.committed()
    return answered, False


def _replay(session: Session, store: ArrayStore, existing: Query, release_id: int, index: int) -> Query:
    if existing.release_id != release_id or existing.row_index != index:
        raise Conflict(
            f"this Idempotency-Key was already used for query {existing.id} (release {existing.release_id}, "
            f"index {existing.row_index}); use a new key for a different query"
        )
    return _settle(session, store, existing)


def read_query(db: Database, store: ArrayStore, principal: Principal, query_id: int) -> QueryView:
    """A query as its partner or the admin may see it (a fresh short read, for long-polling). A partner's
    first read of it complete must go through :func:`deliver` (``needs_delivery``)."""
    with db.session(write=False) as session:
        return view(session, principal, query_id)


def needs_delivery(principal: Principal, query: Query) -> bool:
    """Whether answering ``query`` to ``principal`` is its first delivery to its partner."""
    return not principal.is_admin and query.status == "complete" and query.delivered_at is None


def deliver(db: Database, principal: Principal, query_id: int) -> QueryView:
    """A partner's read of its complete query that records the delivery, in one write transaction: what it
    returns is what was marked delivered (a correction committed before is in it; one committed after
    sees the delivery and becomes a supersession)."""
    with db.session(write=True) as session:
        assert principal.partner_id is not None
        lab_repo.mark_delivered(session, partner_id=principal.partner_id, query_id=query_id)
        found = view(session, principal, query_id)
        session.commit()
        return found


def view(session: Session, principal: Principal, query_id: int) -> QueryView:
    """The query as ``principal`` may see it (404 for another partner's), read afresh in ``session``."""
    query = repo.refresh_query(session, query_id)
    if query is None or (not principal.is_admin and query.partner_id != principal.partner_id):
        # another partner's query is "not found" too: a partner cannot probe which query ids exist
        raise NotFound(f"query {query_id} does not exist")
    if not principal.is_admin:
        release = repo.get_release(session, query.release_id)
        if release is not None and release.erased_at is not None:
            raise Gone(f"release {query.release_id} was erased: its dataset was erased by the curator")
    found = lab_repo.corrections_of(session, [query.id], _visible_kinds(principal))
    return QueryView(query, found.get(query.id, []))


def view_of(session: Session, principal: Principal, query: Query) -> QueryView:
    """``query`` (read in ``session``) with the corrections ``principal`` may see."""
    found = lab_repo.corrections_of(session, [query.id], _visible_kinds(principal))
    return QueryView(query, found.get(query.id, []))


def post_result(session: Session, query_id: int, y: float) -> Query:
    """The curator's measured outcome of a pending ``manual`` query."""
    query = repo.get_query(session, query_id)
    if query is None:
        raise NotFound(f"query {query_id} does not exist")
    if query.status == "complete":
        raise Conflict(already_complete(session, query))
    if query.source_query_id is not None:
        raise Conflict(
            f"query {query_id} repeats query {query.source_query_id}'s row under a grant whose repeats are "
            f"answered from the row's first noisy answer: post the measurement to query "
            f"{query.source_query_id}, and this query is answered with it"
        )
    dataset = _dataset_of(session, query)
    if dataset.erased_at is not None:
        raise Gone(f"query {query_id} is on release {query.release_id}, which was erased with its dataset")
    if dataset.objective_mode != "manual":
        raise Conflict(
            f"query {query_id} is on a dataset whose outcomes come from its '{dataset.objective}' column; "
            "results are posted only for objective_mode 'manual'"
        )
    if not outputs.record_answer(session, query, dataset, y):
        raise Conflict(already_complete(session, query))
    fresh = repo.refresh_query(session, query_id)
    assert fresh is not None
    return fresh


def already_complete(session: Session, query: Query) -> str:
    """Why a result cannot be posted to a complete query, and how a measured value is changed instead."""
    if query.source_query_id is None and _dataset_of(session, query).objective_mode == "manual":
        return (
            f"query {query.id} is already complete; a result is posted once. To change the value, POST "
            f'/v1/queries/{query.id}/corrections with {{"y": <new value>, "reason": "<why>"}}: it is '
            "replaced if the partner has not been sent it yet, else superseded (both values kept in the log)"
        )
    return f"query {query.id} is already complete; a result can be posted only once"


@dataclass(frozen=True)
class QueryList:
    views: list[QueryView]
    #: A partner's complete queries it was never sent: list again with ``deliver`` to record the sending.
    undelivered: bool


def list_queries(session: Session, principal: Principal, release_id: int) -> Sequence[Query]:
    get_release(session, principal, release_id)
    return repo.list_queries(session, release_id, None if principal.is_admin else principal.partner_id)


def query_list(db: Database, principal: Principal, release_id: int, *, deliver: bool = False) -> QueryList:
    """The release's queries (admin: all; partner: its own) with their visible corrections. ``deliver``
    (a partner, in a write transaction): record that its complete queries are being sent now."""
    with db.session(write=deliver) as session:
        get_release(session, principal, release_id)
        partner_id = None if principal.is_admin else principal.partner_id
        if deliver and partner_id is not None:
            lab_repo.mark_delivered(session, partner_id=partner_id, release_id=release_id)
        queries = repo.list_queries(session, release_id, partner_id)
        found = lab_repo.corrections_of(session, [q.id for q in queries], _visible_kinds(principal))
        views = [QueryView(q, found.get(q.id, [])) for q in queries]
        if deliver:
            session.commit()
        undelivered = partner_id is not None and any(needs_delivery(principal, q) for q in queries)
        return QueryList(views, undelivered and not deliver)


def verify_queries(session: Session, principal: Principal, release_id: int) -> tuple[Verification, str]:
    """Verify the release's query-log hash chain (admin, or a partner granted the release).

    The whole chain is always checked. The admin sees it whole; a partner sees ``ok``, ``entries`` counting
    its own links only and ``head`` the hash of its own latest link, so an intact log tells it nothing about
    how many queries other partners asked, or when. Its own links are its queries' whose value it was sent
    (``lab_repository.partner_links``): a link's hash covers its whole payload, so the hash of a measurement
    not yet delivered or replaced before delivery, or of a correction's link (the curator's reason), would
    let it confirm a guess of what it was not sent. When the log is broken,
    ``first_bad_seq`` (the position in the whole chain, needed to act on it) is shown to every principal
    that may verify.
    """
    get_release(session, principal, release_id)
    result, head = querylog.verify_release_chain(session, release_id)
    if principal.is_admin:
        return result, head
    assert principal.partner_id is not None
    own = lab_repo.partner_links(session, release_id, principal.partner_id)  # in chain order
    return (
        Verification(ok=result.ok, entries=len(own), first_bad_seq=result.first_bad_seq),
        own[-1][1] if own else GENESIS_HASH,
    )


def recover_pending_queries(db: Database, store: ArrayStore) -> int:
    """Evaluate ``column`` queries a crash left pending (they were committed, and charged, already)."""
    with db.session(write=False) as session:
        ids = repo.pending_column_query_ids(session)
    for query_id in ids:
        with db.session(write=True) as session:
            query = repo.get_query(session, query_id)
            if query is not None:
                _settle(session, store, query)
    if ids:
        logger.info("completed %d query(ies) left pending by an earlier crash", len(ids))
    return len(ids)
