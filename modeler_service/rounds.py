"""Rounds: plan one with the study's strategy, record its write-ahead intent, record its outcomes.

No HTTP types here, and nothing commits: callers own transactions. A study's state is in the database
alone: the study row (parameters, run state, ``pending_round``: the write-ahead intent of the round in
flight) and its audit entries, which double as the observations the strategy is rebuilt from
(``Strategy.from_history``). ``StudyCache`` keeps the rebuilt strategy in memory between rounds, keyed by
the number of rounds it has observed; any mismatch (a restart, another worker) catches up or rebuilds from
the database. This module knows strategies only through the registry interface.

Every request travels the same way whatever its kind: the request kind (``modeler_service.kinds``) writes
it ahead, decodes the curator's answer into what the strategy observes and into its audit entry, and shows
it; this module never looks inside a request or an answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service import round_sql
from modeler_service.audit import HASH_VERSION, entry_hash
from modeler_service.context import Context
from modeler_service.exceptions import Conflict, StorageError
from modeler_service.kinds import PlannedRequest, StudyFacts, facts_of, kind_named
from modeler_service.models import AuditEntry, Study, utcnow
from modeler_service.round_sql import RoundWriter
from modeler_service.schemas import RoundQuery
from shared.bo.strategies import RoundOutcome, Strategy, get_strategy, parse_params, round_rng
from shared.errors import StrategyError
from shared.protocol.keys import request_key
from shared.servicekit.db import Database

__all__ = [
    "CuratorAnswer",
    "PlannedRequest",
    "RoundIntent",
    "answers_of",
    "is_complete",
    "public_query",
]

#: The curator's answer to one request, as its kind's client call returns it (opaque here).
CuratorAnswer = Any


def is_complete(request: PlannedRequest, answer: CuratorAnswer) -> bool:
    """Whether the curator's answer to ``request`` is final (a measurement may still be awaited)."""
    return kind_named(request.kind).is_complete(answer)


def public_query(request: PlannedRequest, answer: CuratorAnswer | None) -> RoundQuery:
    """A request of a round and its answer so far, as its kind shows it."""
    return kind_named(request.kind).public(request, answer)


@dataclass(frozen=True)
class RoundIntent:
    """The round in flight (``Study.pending_round``): its number and its requests, in order."""

    round: int
    requests: tuple[PlannedRequest, ...]

    @classmethod
    def of(cls, study: Study) -> RoundIntent | None:
        data = study.pending_round
        if not data:
            return None
        return cls(int(data["round"]), tuple(PlannedRequest(**r) for r in data["requests"]))

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "requests": [r.__dict__ for r in self.requests]}

    def with_query_ids(self, queries: Sequence[CuratorAnswer]) -> RoundIntent:
        requests = []
        for r, q in zip(self.requests, queries, strict=True):
            query_id = kind_named(r.kind).query_id(q)
            requests.append(replace(r, query_id=query_id) if query_id is not None else r)
        return replace(self, requests=tuple(requests))


#: Numbers a strategy may report in ``details`` that API v1 publishes as fields of their own (a step's and
#: an audit entry's ``acquisition``, ``beta``, ``mean``, ``std``).
V1_NUMBERS = ("acquisition", "beta", "mean", "std")


def v1_numbers(details: dict[str, Any]) -> dict[str, float | None]:
    """The API v1 fields a request's ``details`` fill (None where the strategy reports no such number)."""
    out: dict[str, float | None] = {}
    for key in V1_NUMBERS:
        value = details.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        out[key] = float(value) if ok else None  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------------------------------ strategies


def _json_safe(value: Any) -> Any:
    """``details`` as plain JSON: numpy scalars to Python, non-finite floats to their names."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def new_strategy(study: Study, Z: Any, rounds: Sequence[Sequence[Any]]) -> Strategy[Any, Any]:
    """The study's strategy after ``rounds`` (its name, parameters and private state from the study row);
    ``Z`` is what it runs on (the release's Z, or the gradient oracle's domain)."""
    cls = get_strategy(study.strategy)
    params = parse_params(study.strategy, study.strategy_params)
    return cls.from_history(Z, params, study.strategy_state or {}, rounds)


def strategy_for(session: Session, ctx: Context, study: Study) -> Strategy[Any, Any]:
    """The study's strategy after its recorded rounds (cached; caught up or rebuilt from the DB on a miss).

    A cached strategy that is behind (another worker process recorded the last rounds) catches up by
    observing just the missing rounds instead of a rebuild. One built before the study's last supersession
    (``supersessions_done`` moved) is rebuilt: each entry observed with its latest value.
    """
    state = ctx.state(study)
    superseded = study.supersessions_done
    with state.lock:
        if state.n_supersessions != superseded:  # values changed since it observed them: rebuild
            state.strategy, state.n_rounds, state.n_queries = None, -1, -1
        if state.strategy is not None and 0 <= state.n_rounds < study.rounds_done:
            missing = recorded_rounds(session, study.id, after_round=state.n_rounds, superseded=superseded)
            if len(missing) == study.rounds_done - state.n_rounds:
                for answers in missing:
                    state.strategy.observe(answers)
                state.n_rounds, state.n_queries = study.rounds_done, study.iterations_done
                return state.strategy
        if state.strategy is None or state.n_rounds != study.rounds_done:
            rounds = recorded_rounds(session, study.id, superseded=superseded)
            recorded = sum(len(r) for r in rounds)
            if len(rounds) != study.rounds_done or recorded != study.iterations_done:
                raise StorageError(
                    f"study {study.id} records {study.rounds_done} rounds and {study.iterations_done} "
                    f"queries but its audit log has {len(rounds)} rounds and {recorded} entries"
                )
            state.strategy = new_strategy(study, state.inputs, rounds)
            state.strategy.exclude_rows(state.excluded)
            state.n_rounds, state.n_queries = len(rounds), recorded
            state.n_supersessions = superseded
        return state.strategy


def posterior_mean_at_best(session: Session, ctx: Context, study: Study) -> float | None:
    """The strategy's posterior mean at the study's best row, for a study whose answers are noisy (output
    privacy); None otherwise, or when the strategy keeps no model. Uses the cached strategy as it stands
    (the newest model), else rebuilds it from the audit log (and caches it)."""
    if not study.outputs_private or study.best_index is None:
        return None
    state = ctx.state(study)
    with state.lock:
        strategy = state.strategy if state.strategy is not None else strategy_for(session, ctx, study)
        return strategy.posterior_mean(study.best_index)


def plan_round(session: Session, ctx: Context, study: Study, *, budget: int) -> RoundIntent:
    """The next round as the strategy plans it (at most ``budget`` requests), with each request's key."""
    round_no = study.rounds_done + 1
    with ctx.state(study).lock:  # no observe() of this study's strategy while it plans
        strategy = strategy_for(session, ctx, study)
        planned = strategy.plan(budget=budget, rng=round_rng(study.seed, round_no))
    return _intent(facts_of(study), round_no, planned, budget)


@dataclass(frozen=True)
class CachedPlan:
    """A round planned from the cache alone, and what it assumed of the study: that it had recorded
    ``round - 1`` rounds and ``iterations_done`` of ``iterations_total`` queries, with no round in flight.
    If the study is exactly that (checked under its write lock by ``round_sql.RoundWriter``),
    ``plan_round`` in that transaction would plan the very same round (same observed rounds, same round
    number and seed, same budget, the same supersessions observed)."""

    intent: RoundIntent
    iterations_done: int
    iterations_total: int
    supersessions_done: int = 0


def plan_cached(ctx: Context, study_id: str, budget: Callable[[int, int], int]) -> CachedPlan | None:
    """The next round planned by the cached strategy without reading the database, or None when the cache
    has no caught-up strategy for the study (after a restart, a failed round) or its budget is used.

    ``budget(iterations_total, iterations_done)``: the requests the round may have. The plan is a guess:
    the caller writes it only if the study row is what it assumed (``round_sql.RoundWriter``) and plans
    again from the database if the study moved (another worker process recorded a round meanwhile).
    """
    state = ctx.cache.get(study_id)
    if state is None or state.facts is None:
        return None
    facts = state.facts
    with state.lock:  # no observe() of this study's strategy while it plans
        strategy, rounds_done, done = state.strategy, state.n_rounds, state.n_queries
        if strategy is None or rounds_done < 0 or done < 0 or done >= facts.iterations_total:
            return None
        allowed = budget(facts.iterations_total, done)
        planned = strategy.plan(budget=allowed, rng=round_rng(facts.seed, rounds_done + 1))
        superseded = state.n_supersessions
    intent = _intent(facts, rounds_done + 1, planned, allowed)
    return CachedPlan(intent, done, facts.iterations_total, superseded)


def _intent(facts: StudyFacts, round_no: int, planned: Sequence[Any], budget: int) -> RoundIntent:
    """The strategy's planned requests as the round's intent: checked, JSON-safe, each with its key."""
    if not 1 <= len(planned) <= budget:
        raise StrategyError(
            f"strategy {facts.strategy!r} planned {len(planned)} requests; a round has 1 to {budget}"
        )
    requests = []
    kinds = get_strategy(facts.strategy).kinds
    for j, req in enumerate(planned):
        name = getattr(req, "kind", None)
        if name not in kinds:
            raise StrategyError(f"strategy {facts.strategy!r} planned an invalid request {req!r}")
        details = _json_safe(dict(req.details))
        json.dumps(details, allow_nan=False)  # fails here rather than in the audit chain
        key = request_key(facts.id, round_no, j)
        requests.append(kind_named(str(name)).plan(facts, req, j, details, key))
    return RoundIntent(round_no, tuple(requests))


def round_outcome(
    session: Session, ctx: Context, study: Study, intent: RoundIntent, answers: Sequence[CuratorAnswer]
) -> RoundOutcome:
    """What the strategy adds to the round's audit entries before observing it (``Strategy.outcome``:
    e.g. DP-GIBO's theta_next), from the strategy caught up to the round before this one."""
    with ctx.state(study).lock:
        strategy = strategy_for(session, ctx, study)
        outcome = strategy.outcome(answers_of(intent, answers))
    return _checked_outcome(study, intent, outcome)


def cached_outcome(
    ctx: Context, study: Study, intent: RoundIntent, answers: Sequence[CuratorAnswer]
) -> RoundOutcome | None:
    """``round_outcome`` without a session when the cached strategy has observed exactly the rounds before
    this one (the usual case: it just planned it); None when it would need the database."""
    state = ctx.cache.get(study.id)
    if state is None:
        return None
    with state.lock:
        if (
            state.strategy is None
            or state.n_rounds != study.rounds_done
            or state.n_supersessions != study.supersessions_done
        ):
            return None
        outcome = state.strategy.outcome(answers_of(intent, answers))
    return _checked_outcome(study, intent, outcome)


def _checked_outcome(study: Study, intent: RoundIntent, outcome: RoundOutcome) -> RoundOutcome:
    if len(outcome.details) != len(intent.requests):
        raise StrategyError(
            f"strategy {study.strategy!r} reported {len(outcome.details)} outcomes for "
            f"{len(intent.requests)} requests"
        )
    return outcome


# ------------------------------------------------------------------------------------- intent, outcome


def save_intent(
    session: Session,
    study: Study,
    intent: RoundIntent,
    *,
    claim_from: Sequence[str] | None = None,
    run_target: int | None = None,
) -> Study:
    """Write-ahead: the round about to be sent and the numbers that chose it, in the reading transaction,
    with the very statement a round planned from the cache is written with
    (``round_sql.RoundWriter.write_planned_round``). ``claim_from``: a synchronous step also claims the
    study (``running``, with ``run_target``: the step ends after this round, so a background wait for a
    manual measurement stops there too). Returns the study as written."""
    if study.pending_round is not None or study.rounds_done != intent.round - 1:
        raise Conflict(f"study {study.id} changed while round {intent.round} was being planned")
    bind = session.get_bind()
    assert isinstance(bind, Engine)
    with Database.session_cursor(session) as cur:
        written = RoundWriter(round_sql.statements(bind), cur).write_planned_round(
            study.id,
            intent=intent.to_json(),
            rounds_done=study.rounds_done,
            iterations_done=study.iterations_done,
            iterations_total=study.iterations_total,
            supersessions_done=study.supersessions_done,
            claim_from=claim_from,
            run_target=run_target,
        )
    if written is None:
        raise Conflict(f"study {study.id} changed while round {intent.round} was being planned")
    return written


def record_round(
    writer: RoundWriter,
    study: Study,
    intent: RoundIntent,
    queries: Sequence[CuratorAnswer],
    *,
    settle_at: int | None = None,
    outcome: RoundOutcome | None = None,
) -> list[AuditEntry]:
    """The round's audit entries and the study's counters, in the caller's one transaction (``writer``: the
    round statements on its cursor).

    ``study`` is the row as read when the intent was written (this runner owns the study since then). The
    study row is advanced with one conditional UPDATE that also checks that nothing moved in between (same
    round in flight, same audit head); otherwise ``Conflict`` and the inserts are rolled back. With
    ``settle_at``, reaching that many queries ends the run in the same UPDATE (``done`` when the budget is
    used, else ``ready``). ``outcome``: the strategy's numbers for the round (``round_outcome``): merged
    into each entry's details, and its point (a gradient study's theta) stored on the study.
    """
    extras = outcome.details if outcome is not None else tuple({} for _ in queries)
    recorded = [
        kind_named(req.kind).record(req, query, extra)
        for req, query, extra in zip(intent.requests, queries, extras, strict=True)
    ]
    entries: list[AuditEntry] = []
    head = study.audit_head
    best = (study.best_index, study.best_y)
    now = utcnow()
    for req, rec in zip(intent.requests, recorded, strict=True):
        entry = AuditEntry(
            study_id=study.id,
            seq=study.iterations_done + 1 + req.request,
            at=now,
            round=intent.round,
            request=req.request,
            kind=req.kind,
            row_index=rec.index,
            y=rec.y,
            details=_json_safe(rec.details),
            curator_query_id=rec.curator_query_id,
            hash_version=HASH_VERSION,
            prev_hash=head,
        )
        entry.hash = head = entry_hash(entry.prev_hash, entry)
        entries.append(entry)
    # best: a row played several times in one round (MoMA's epoch of k noisy answers) counts with its mean
    plays: dict[int, list[float]] = {}
    for entry in entries:
        if entry.row_index is not None and entry.y is not None:
            plays.setdefault(entry.row_index, []).append(entry.y)
    for row, ys in plays.items():
        mean = math.fsum(ys) / len(ys)
        if best[1] is None or mean > best[1]:
            best = (row, mean)
    done = study.iterations_done + len(entries)
    settle_status = None
    if settle_at is not None and done >= settle_at:
        settle_status = "done" if done >= study.iterations_total else "ready"
    writer.insert_audit_entries(entries)
    advanced = writer.advance_study(
        study.id,
        round_no=intent.round,
        prev_done=study.iterations_done,
        done=done,
        prev_head=study.audit_head,
        head=head,
        best_index=best[0],
        best_y=best[1],
        theta=study.theta if outcome is None or outcome.point is None else [float(v) for v in outcome.point],
        settle_status=settle_status,
    )
    if not advanced:
        raise Conflict(f"study {study.id} is not at round {intent.round} any more")
    return entries


def answers_of(intent: RoundIntent, queries: Sequence[CuratorAnswer]) -> list[Any]:
    """The round's answers as its strategy observes them, each decoded by its request's kind."""
    return [kind_named(r.kind).answer(r, q) for r, q in zip(intent.requests, queries, strict=True)]


def recorded_rounds(
    session: Session, study_id: str, *, after_round: int = 0, superseded: int = 0
) -> list[list[Any]]:
    """Every recorded round (with ``round > after_round``) as the strategy observes it, in order: the
    state the strategy is rebuilt from, each audit entry decoded by its kind. ``superseded``: the study's
    ``supersessions_done``; when nonzero, a superseded entry is observed with its latest value (the
    corrected measurement, ``modeler_service.supersessions``)."""
    recorded = repo.audit_rounds(session, study_id, after_round=after_round, superseded=superseded > 0)
    return [
        [kind_named(kind).from_record(index, y, details or {}) for kind, index, y, details in entries]
        for entries in recorded
    ]


def observe_cached(
    ctx: Context, study_id: str, intent: RoundIntent, queries: Sequence[CuratorAnswer]
) -> None:
    """Condition the cached strategy on a just-recorded round; if the cache is not exactly one round
    behind, it is dropped and rebuilt from the database next time."""
    state = ctx.cache.get(study_id)
    if state is None:
        return
    with state.lock:
        if state.strategy is not None and state.n_rounds == intent.round - 1:
            state.strategy.observe(answers_of(intent, queries))
            state.n_rounds = intent.round
            state.n_queries += len(intent.requests)
        else:
            state.strategy, state.n_rounds, state.n_queries = None, -1, -1
