"""Rounds: plan one with the study's strategy, record its write-ahead intent, record its outcomes.

No HTTP types here, and nothing commits: callers own transactions. A study's state is in the database
alone: the study row (parameters, run state, ``pending_round``: the write-ahead intent of the round in
flight) and its audit entries, which double as the observations the strategy is rebuilt from
(``Strategy.from_history``). ``StudyCache`` keeps the rebuilt strategy in memory between rounds, keyed by
the number of rounds it has observed; any mismatch (a restart, another worker) catches up or rebuilds from
the database. This module knows strategies only through the registry interface.

Two request kinds travel the same way: a row request (``POST /v1/releases/{id}/queries``; its answer a
``QueryPublic``) and a gradient request (``POST /v1/gradient-oracles/{id}/steps`` with the body written
ahead in the intent; its answer a ``GradientStepResult``, recorded with index and y null, the step number
as curator query id and the step's inputs, the noisy gradient and the strategy's outcome in ``details``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service.audit import HASH_VERSION, entry_hash
from modeler_service.context import Context, StudyFacts
from modeler_service.exceptions import Conflict, StorageError, UpstreamError
from modeler_service.models import AuditEntry, Study, utcnow
from modeler_service.round_sql import RoundWriter
from modeler_service.schemas import RoundQuery
from shared.bo.strategies import (
    Answer,
    GradientAnswer,
    GradientRequest,
    RoundOutcome,
    RowRequest,
    Strategy,
    get_strategy,
    gradient_record,
    parse_params,
    round_rng,
)
from shared.errors import StrategyError
from shared.protocol.keys import request_key
from shared.protocol.schemas import GradientStepResult, QueryPublic

#: The curator's answer to one request: a row query, or a gradient oracle's step.
CuratorAnswer = QueryPublic | GradientStepResult


def is_complete(answer: CuratorAnswer) -> bool:
    """A gradient step is answered at once; a row query may wait for a measurement."""
    return not isinstance(answer, QueryPublic) or answer.status == "complete"


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the round in flight, as written ahead: what to ask, why, with which key."""

    request: int
    kind: str
    index: int | None
    details: dict[str, Any]
    key: str
    query_id: int | None = None
    body: dict[str, Any] | None = None  # a gradient request: the step's body, re-sent as is after a crash

    def public(self, query: CuratorAnswer | None) -> RoundQuery:
        if isinstance(query, GradientStepResult):
            return RoundQuery(
                request=self.request,
                kind="gradient",
                index=None,
                status="complete",
                y=None,
                curator_query_id=query.step,
                details={**self.details, "gradient": list(query.gradient), "steps_left": query.steps_left},
            )
        answered = query is not None and query.status == "complete"
        status = "not_sent" if query is None and self.query_id is None else "pending"
        return RoundQuery(
            request=self.request,
            kind=self.kind,  # type: ignore[arg-type]
            index=self.index,
            status="complete" if answered else status,  # type: ignore[arg-type]
            y=query.y if answered and query is not None else None,
            curator_query_id=query.id if query is not None else self.query_id,
            details=self.details,
        )


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
        return replace(
            self,
            requests=tuple(
                replace(r, query_id=q.id) if isinstance(q, QueryPublic) else r
                for r, q in zip(self.requests, queries, strict=True)
            ),
        )


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
    observing just the missing rounds instead of a rebuild.
    """
    state = ctx.state(study)
    with state.lock:
        if state.strategy is not None and 0 <= state.n_rounds < study.rounds_done:
            missing = repo.rounds(session, study.id, after_round=state.n_rounds)
            if len(missing) == study.rounds_done - state.n_rounds:
                for answers in missing:
                    state.strategy.observe(answers)
                state.n_rounds, state.n_queries = study.rounds_done, study.iterations_done
                return state.strategy
        if state.strategy is None or state.n_rounds != study.rounds_done:
            rounds = repo.rounds(session, study.id)
            recorded = sum(len(r) for r in rounds)
            if len(rounds) != study.rounds_done or recorded != study.iterations_done:
                raise StorageError(
                    f"study {study.id} records {study.rounds_done} rounds and {study.iterations_done} "
                    f"queries but its audit log has {len(rounds)} rounds and {recorded} entries"
                )
            state.strategy = new_strategy(study, state.inputs, rounds)
            state.n_rounds, state.n_queries = len(rounds), recorded
        return state.strategy


def plan_round(session: Session, ctx: Context, study: Study, *, budget: int) -> RoundIntent:
    """The next round as the strategy plans it (at most ``budget`` requests), with each request's key."""
    round_no = study.rounds_done + 1
    with ctx.state(study).lock:  # no observe() of this study's strategy while it plans
        strategy = strategy_for(session, ctx, study)
        planned = strategy.plan(budget=budget, rng=round_rng(study.seed, round_no))
    return _intent(StudyFacts.of(study), round_no, planned, budget)


@dataclass(frozen=True)
class CachedPlan:
    """A round planned from the cache alone, and what it assumed of the study: that it had recorded
    ``round - 1`` rounds and ``iterations_done`` of ``iterations_total`` queries, with no round in flight.
    If the study is exactly that (checked under its write lock by ``round_sql.RoundWriter``),
    ``plan_round`` in that transaction would plan the very same round (same observed rounds, same round
    number and seed, same budget)."""

    intent: RoundIntent
    iterations_done: int
    iterations_total: int


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
    return CachedPlan(_intent(facts, rounds_done + 1, planned, allowed), done, facts.iterations_total)


def _intent(facts: StudyFacts, round_no: int, planned: Sequence[Any], budget: int) -> RoundIntent:
    """The strategy's planned requests as the round's intent: checked, JSON-safe, each with its key."""
    if not 1 <= len(planned) <= budget:
        raise StrategyError(
            f"strategy {facts.strategy!r} planned {len(planned)} requests; a round has 1 to {budget}"
        )
    requests = []
    kinds = get_strategy(facts.strategy).kinds
    for j, req in enumerate(planned):
        key = request_key(facts.id, round_no, j)
        details = _json_safe(dict(req.details))
        json.dumps(details, allow_nan=False)  # fails here rather than in the audit chain
        if isinstance(req, RowRequest) and "row" in kinds and 0 <= int(req.index) < facts.n:
            requests.append(PlannedRequest(j, "row", int(req.index), details, key))
        elif (
            isinstance(req, GradientRequest) and "gradient" in kinds and facts.gradient_oracle_id is not None
        ):
            body = req.body()
            json.dumps(body, allow_nan=False)
            requests.append(PlannedRequest(j, "gradient", None, details, key, body=body))
        else:
            raise StrategyError(f"strategy {facts.strategy!r} planned an invalid request {req!r}")
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
        if state.strategy is None or state.n_rounds != study.rounds_done:
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
    session: Session, study: Study, intent: RoundIntent, *, run_target: int | None = None
) -> None:
    """Write-ahead: the round about to be sent and the numbers that chose it (in the reading transaction).

    ``run_target``: a synchronous step ends after this round (so a background wait for a manual
    measurement stops there too).
    """
    if study.pending_round is not None or study.rounds_done != intent.round - 1:
        raise Conflict(f"study {study.id} changed while round {intent.round} was being planned")
    study.pending_round = intent.to_json()
    if run_target is not None:
        study.run_target = run_target
    study.updated_at = utcnow()


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
    for query in queries:
        if isinstance(query, QueryPublic) and (query.y is None or query.status != "complete"):
            raise UpstreamError(f"query {query.id} has no outcome yet")
    extras = outcome.details if outcome is not None else tuple({} for _ in queries)
    entries: list[AuditEntry] = []
    head = study.audit_head
    best = (study.best_index, study.best_y)
    now = utcnow()
    for req, query, extra in zip(intent.requests, queries, extras, strict=True):
        if isinstance(query, GradientStepResult):
            answer = _gradient_answer(req, query)
            y, query_id = None, int(query.step)
            details = _json_safe(gradient_record(answer, extra))
        else:
            y, query_id = float(query.y), int(query.id)  # type: ignore[arg-type]
            details = _json_safe({**req.details, **extra}) if extra else req.details
        entry = AuditEntry(
            study_id=study.id,
            seq=study.iterations_done + 1 + req.request,
            at=now,
            round=intent.round,
            request=req.request,
            kind=req.kind,
            row_index=req.index,
            y=y,
            details=details,
            curator_query_id=query_id,
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


def _gradient_answer(req: PlannedRequest, result: GradientStepResult) -> GradientAnswer:
    body = req.body or {}
    request = GradientRequest(
        theta=tuple(float(v) for v in body["theta"]),
        points=tuple(tuple(float(v) for v in p) for p in body["points"]),
        kernel=dict(body["kernel"]),
        noise_var=float(body["noise_var"]),
        jitter=float(body["jitter"]),
        details=req.details,
    )
    return GradientAnswer(request, tuple(float(v) for v in result.gradient), int(result.step))


def answers_of(intent: RoundIntent, queries: Sequence[CuratorAnswer]) -> list[Answer | GradientAnswer]:
    """The round's answers as its strategy observes them (a row's outcome, or a gradient step's)."""
    out: list[Answer | GradientAnswer] = []
    for r, q in zip(intent.requests, queries, strict=True):
        if isinstance(q, GradientStepResult):
            out.append(_gradient_answer(r, q))
        else:
            out.append(Answer(RowRequest(int(r.index), r.details), float(q.y)))  # type: ignore[arg-type]
    return out


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
