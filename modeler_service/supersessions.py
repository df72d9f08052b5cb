"""Supersessions: values the study had been sent that the curator then superseded, recorded in the audit.

A ``manual`` dataset's value may change after the lab posted it (the curator's
``services/corrections.py``): before the partner was sent it the curator simply replaces it (the modeler
only ever sees the new value), after it the value is *superseded* and the partner keeps what it had been
sent. ``GET /v1/releases/{id}/corrections`` (partner token) lists the supersessions of the partner's queries;
:func:`sync_supersessions` records the study's among them, each once (unique correction id), in one
transaction, as a second hash chain of the study's audit log (``modeler_audit_supersessions``): the entry
keeps the value it was sent, the supersession holds both values. The entries' chain and its ``seq`` (the
query number, ``iteration`` in the API) are untouched.

When the modeler learns of them:

* after every round that waited for a measurement, and every round of a study that ever did
  (``Study.awaits_measurements``), so also at the end of a run (its last round), and before a run's first
  round (``runner.RunnerRegistry``); a study whose outcomes come from a column never waits and is never
  asked (no extra request per iteration on the fast path);
* on demand: ``POST /v1/studies/{id}/audit/sync`` (and ``pobo reconcile``, which calls it first).

The strategy is rebuilt from the audit log with each entry's latest value (``repository.audit_rounds``):
recording a supersession drops the study's cached strategy, and the study's ``supersessions_done`` is part
of what a round planned from the cache assumed (``round_sql``), so another worker process's cache is not
used either. Everything shown as answered (the entries, the best value, the progress plot) keeps the values
as they were sent.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service.audit import supersession_hash
from modeler_service.context import Context, upstream
from modeler_service.db import transaction
from modeler_service.exceptions import ModelerError
from modeler_service.models import AuditSupersession, Study, utcnow
from modeler_service.schemas import AuditSupersessionPublic, AuditSync
from shared.protocol.client import CuratorClient, CuratorError
from shared.protocol.schemas import QueryCorrectionPublic

__all__ = ["supersessions_public", "sync_quietly", "sync_supersessions"]

log = logging.getLogger("pobo.modeler.supersessions")

#: Corrections asked for per page (the curator's default page; it allows up to 10 000).
PAGE = 1000

#: The curator's name for a change of a value the partner had been sent.
_SUPERSESSION = "supersession"


def _fetch(client: CuratorClient, release_id: int, after_id: int | None) -> list[QueryCorrectionPublic]:
    """Every supersession of the partner's queries on the release after ``after_id``, oldest first."""
    found: list[QueryCorrectionPublic] = []
    while True:
        page = client.list_corrections(release_id, after_id=after_id, limit=PAGE).data
        found += [c for c in page if c.kind == _SUPERSESSION]
        if len(page) < PAGE:
            return found
        after_id = page[-1].id


def _last_correction_id(session: Session, study_id: str) -> int | None:
    records = repo.supersessions(session, study_id)
    return max((r.correction_id for r in records), default=None)


def sync_supersessions(ctx: Context, study: Study) -> AuditSync:
    """Record the curator's supersessions of ``study``'s values that its audit log lacks (each once), and
    drop its cached strategy if there were any. A curator error is the modeler's (``upstream``).

    Pages ``GET /v1/releases/{id}/corrections`` from the newest correction recorded. The partner's other
    studies on the release have their own (skipped). A supersession of a query of the round in flight
    (sent, not recorded yet) stops the walk there: it and those after it are recorded by the next sync,
    after the round, so that the chain keeps the curator's order.
    """
    if study.release_id is None:  # a study that asks no release's queries has no value to supersede
        with transaction(ctx.db, write=False) as session:
            return AuditSync(recorded=0, supersessions=len(repo.supersessions(session, study.id)))
    with transaction(ctx.db, write=False) as session:
        study = repo.get_study(session, study.id) or study  # as it is now (e.g. a rotated token)
        after = _last_correction_id(session, study.id)
    assert study.release_id is not None
    what = f"study {study.id}: the curator's corrections of release {study.release_id}"
    try:
        fetched = _fetch(ctx.client(study), study.release_id, after)
    except CuratorError as exc:
        raise upstream(exc, what) from exc
    with transaction(ctx.db) as session:
        current = repo.get_study(session, study.id, for_update=True)
        assert current is not None
        records = _new_records(session, current, fetched)
        if records:
            repo.add_supersessions(session, study.id, records, records[-1].hash)
        total = current.supersessions_done + len(records)
    if records:
        _drop_cached_strategy(ctx, study.id)
        log.info("study %s: recorded %d supersession(s) of its values", study.id, len(records))
    return AuditSync(recorded=len(records), supersessions=total)


def _new_records(
    session: Session, study: Study, fetched: Sequence[QueryCorrectionPublic]
) -> list[AuditSupersession]:
    """The supersessions of ``fetched`` to record, chained after the study's (read under its row lock)."""
    known = {r.correction_id for r in repo.supersessions(session, study.id)}
    answered = repo.answered_values(session, study.id)  # curator query id -> (audit seq, y sent)
    value = dict(answered.values())
    value.update(repo.latest_values(session, study.id))
    in_flight = _in_flight(study)
    head, seq, now = study.supersessions_head, study.supersessions_done, utcnow()
    records: list[AuditSupersession] = []
    for c in sorted(fetched, key=lambda c: c.id):
        if c.id in known:
            continue
        entry = answered.get(c.query_id)
        if entry is None:
            if in_flight is None or c.query_id in in_flight:
                break  # perhaps a query of the round in flight: recorded after that round
            continue  # another study's query (the partner's token may serve several)
        audit_seq = entry[0]
        if value[audit_seq] == c.y and value[audit_seq] != c.previous_y:
            continue  # the study was first sent the new value (it read the query after the change)
        seq += 1
        record = AuditSupersession(
            study_id=study.id,
            seq=seq,
            at=now,
            correction_id=c.id,
            curator_query_id=c.query_id,
            audit_seq=audit_seq,
            previous_y=float(c.previous_y),
            y=float(c.y),
            curator_at=c.created_at,
            prev_hash=head,
        )
        record.hash = head = supersession_hash(head, record)
        records.append(record)
        value[audit_seq] = float(c.y)
    return records


def _in_flight(study: Study) -> set[int] | None:
    """The curator query ids of the round in flight (empty: none in flight); None when some request of it
    may have been sent without its id being known yet."""
    pending = study.pending_round
    if not pending:
        return set()
    ids = [r.get("query_id") for r in pending.get("requests", [])]
    return None if any(i is None for i in ids) else {int(i) for i in ids}


def _drop_cached_strategy(ctx: Context, study_id: str) -> None:
    """The next round rebuilds the strategy from the audit log, with the latest values."""
    state = ctx.cache.get(study_id)
    if state is None:
        return
    with state.lock:
        state.strategy, state.n_rounds, state.n_queries = None, -1, -1


def sync_quietly(ctx: Context, study: Study) -> None:
    """``sync_supersessions`` from the runner: a failure is logged and left to the next sync (a run never
    fails for it)."""
    try:
        sync_supersessions(ctx, study)
    except (ModelerError, CuratorError) as exc:
        log.warning("study %s: supersessions not synced now (%s); next time", study.id, exc)


def supersessions_public(session: Session, study_id: str) -> list[AuditSupersessionPublic]:
    """The study's supersessions as ``GET .../audit`` shows them (with the round, request and row of the
    entry each supersedes)."""
    records = repo.supersessions(session, study_id)
    entries = repo.entries_at(session, study_id, (r.audit_seq for r in records))
    out = []
    for r in records:
        entry = entries.get(r.audit_seq)
        out.append(
            AuditSupersessionPublic(
                seq=r.seq,
                at=r.at,
                correction_id=r.correction_id,
                curator_query_id=r.curator_query_id,
                audit_seq=r.audit_seq,
                round=entry.round if entry is not None else 0,
                request=entry.request if entry is not None else 0,
                index=entry.row_index if entry is not None else None,
                previous_y=r.previous_y,
                y=r.y,
                curator_at=r.curator_at,
                prev_hash=r.prev_hash,
                hash=r.hash,
            )
        )
    return out
