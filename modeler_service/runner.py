"""Executes rounds (plan -> curator requests -> observe) and runs studies in the background.

One round, in short transactions around the two slow parts (the strategy's arithmetic and the curator)::

    plan the round with the cached strategy (else: read study; if no intent: plan it)   -- no lock held
    tx: claim, check the plan against the row (moved: roll back, plan from a read as above), write-ahead
        intent (round, requests, their numbers and Idempotency-Keys)   -- survives a crash
    curator: each request sent by its kind (modeler_service.kinds: a row's POST /v1/releases/{id}/queries,
             a gradient step's POST /v1/gradient-oracles/{id}/steps with the body written ahead);
             Idempotency-Key = shared.protocol.keys.request_key (a "manual" dataset: pending queries; the
             study is awaiting_measurement and its kind long-polls until every request of the round is
             measured, in any order)
    the strategy's outcome of the round (Strategy.outcome: e.g. DP-GIBO's theta_next; no state change)
    tx: the round's audit entries + counters, intent cleared   -- one transaction
    observe (strategy, in the cache)
    a round that waited for a measurement: record the curator's supersessions (modeler_service.supersessions)

A crash anywhere is repaired by running the same round again: the intent gives the same requests and the
same keys (and a gradient step's same body), so the curator returns the queries or steps it already made
(never charged twice); an intent whose outcomes were recorded no longer exists.

``RunnerRegistry`` runs a study's rounds in a thread of its own (the event loop never does arithmetic or
blocking HTTP); the database status, claimed with one conditional UPDATE, guarantees one runner per study.
When the curator is unreachable or overloaded the runner waits and tries the same round again
(``waiting_for_curator``, ``modeler_service.retry``); only permanent errors fail the study.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from datetime import timedelta

from modeler_service import repository as repo
from modeler_service import round_sql, rounds, service, supersessions
from modeler_service.context import Context, NotClaimed, upstream
from modeler_service.db import driver_transaction, transaction
from modeler_service.exceptions import Conflict, ModelerError
from modeler_service.kinds import kind_named
from modeler_service.models import Study, utcnow
from modeler_service.retry import curator_cause, delay_seconds, is_transient
from modeler_service.round_sql import RoundWriter
from modeler_service.rounds import CuratorAnswer, PlannedRequest, RoundIntent, is_complete, public_query
from modeler_service.schemas import RunAccepted, StepResult, StepTimings
from shared.errors import PoboError, StrategyError
from shared.protocol.client import CuratorClient, CuratorError

log = logging.getLogger("pobo.modeler.runner")


class Stepper:
    """Runs one round of a study that the caller has claimed (status ``running``)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def step(
        self,
        study_id: str,
        *,
        wait: bool,
        stop: threading.Event | None = None,
        claim: bool = False,
        settle_at: int | None = None,
    ) -> StepResult | None:
        """One round. ``wait``: long-poll pending (manual) queries until all are complete; else return them
        pending.

        ``claim``: first claim the study for this one round (``POST .../step``; 409 if a runner owns it), in
        the same transaction that writes the intent. ``settle_at``: the run's target number of queries; a
        round plans at most that many minus those done, and when the recorded queries reach it, the study
        becomes ``done``/``ready`` in the same transaction. Returns None only when ``stop`` was set while
        waiting for a measurement.
        """
        ctx = self.ctx
        t_start = time.perf_counter()
        study, intent, plan_s = self._begin_round(study_id, claim=claim, settle_at=settle_at)

        t_curator = time.perf_counter()
        db_s = t_curator - t_start - plan_s  # the claim/intent transaction (and a cache warm-up, if any)
        client = ctx.client(study)
        what = f"study {study_id} round {intent.round}"
        queries: list[CuratorAnswer] = []
        refused: int | None = None
        waited = study.awaits_measurements  # a measured study: its values may be superseded later
        try:
            for j, req in enumerate(intent.requests):
                try:
                    queries.append(self._send(client, study, req, what))
                except CuratorError as exc:
                    if not kind_named(req.kind).refused_for_good(exc):
                        raise
                    refused = j  # e.g. a row whose person's output allotment is used up: nothing charged
                    break
            if refused is not None:
                self._exclude(client, study, intent.requests[refused], what)
        except CuratorError as exc:
            raise upstream(exc, what) from exc
        if refused == 0:  # nothing of the round was answered: forget it, and plan it again without the row
            with transaction(ctx.db) as session:
                if not repo.drop_pending_round(session, study_id, intent.round):
                    raise Conflict(f"study {study_id} is not at round {intent.round} any more")
            return self.step(study_id, wait=wait, stop=stop, claim=False, settle_at=settle_at)
        if refused is not None:  # the requests answered before the refusal make the round
            intent = replace(intent, requests=intent.requests[:refused])
        if not all(is_complete(r, q) for r, q in zip(intent.requests, queries, strict=True)):
            # the round waits for a measurement: its query ids join the intent (shown in the study, and
            # the wait is resumed by id); an answered round goes straight to its record below
            intent, waited = intent.with_query_ids(queries), True
            with transaction(ctx.db) as session:
                repo.set_pending_round(session, study_id, intent.to_json(), awaiting=True)
            if not wait:
                return self._result(
                    intent, study, queries, plan_s, time.perf_counter() - t_curator, db_s, t_start
                )
            log.info(
                "%s: awaiting the curator's measurement of %d queries",
                what,
                sum(not is_complete(r, q) for r, q in zip(intent.requests, queries, strict=True)),
            )
            for j, (req, query) in enumerate(zip(intent.requests, queries, strict=True)):
                kind = kind_named(req.kind)
                while not kind.is_complete(query):
                    if stop is not None and stop.is_set():
                        return None
                    try:
                        query = kind.wait(client, query, ctx.settings.poll_seconds)
                    except CuratorError as exc:
                        if stop is not None and stop.is_set():
                            return None
                        raise upstream(exc, what) from exc
                queries[j] = query
            with transaction(ctx.db) as session:
                repo.set_status(session, study_id, "running", only_if=("awaiting_measurement",))
        curator_s = time.perf_counter() - t_curator

        t0 = time.perf_counter()
        outcome = rounds.cached_outcome(ctx, study, intent, queries)
        if outcome is None:  # the cache was dropped or is behind: catch up from the database
            with transaction(ctx.db, write=False) as session:
                outcome = rounds.round_outcome(session, ctx, study, intent, queries)
        plan_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        with driver_transaction(ctx.db) as cur:
            writer = RoundWriter(round_sql.statements(ctx.db.engine), cur)
            rounds.record_round(writer, study, intent, queries, settle_at=settle_at, outcome=outcome)
        t1 = time.perf_counter()
        rounds.observe_cached(ctx, study_id, intent, queries)
        plan_s += time.perf_counter() - t1
        db_s += t1 - t0
        if waited:  # the lab may have superseded a value meanwhile: the next round observes the new one
            supersessions.sync_quietly(ctx, study)
        return self._result(intent, study, queries, plan_s, curator_s, db_s, t_start)

    def _begin_round(
        self, study_id: str, *, claim: bool, settle_at: int | None
    ) -> tuple[Study, RoundIntent, float]:
        """Claim (with ``claim``) and read the study under its write lock, and commit the write-ahead intent
        of its next round unless one is already in flight. Returns the study as read, the round's intent
        and the seconds the strategy spent planning.

        The strategy plans before the write transaction, so that no other study waits for it (on SQLite
        the write lock is one for the whole database). Usually the cached strategy plans without reading
        the database (``rounds.plan_cached``) and one conditional ``UPDATE ... RETURNING`` writes it, claim
        included, iff the study is what the plan assumed (``round_sql.RoundWriter``). If the study moved
        meanwhile (another worker process recorded a round; a round is in flight; it is not startable),
        nothing is written and the round is planned as without a cache: from a read transaction, then
        checked again under the write lock (and re-planned there if it moved again), where a study that
        cannot step gets its 404 / 409.
        """
        ctx = self.ctx
        t0 = time.perf_counter()
        cached = rounds.plan_cached(
            ctx, study_id, lambda total, done: _allowed(total, done, settle_at, claim)
        )
        plan_s = time.perf_counter() - t0
        if cached is not None:
            planned = cached.intent
            with driver_transaction(ctx.db) as cur:
                written = RoundWriter(round_sql.statements(ctx.db.engine), cur).write_planned_round(
                    study_id,
                    intent=planned.to_json(),
                    rounds_done=planned.round - 1,
                    iterations_done=cached.iterations_done,
                    iterations_total=cached.iterations_total,
                    supersessions_done=cached.supersessions_done,
                    claim_from=service.STARTABLE if claim else None,
                    run_target=cached.iterations_done + len(planned.requests) if claim else None,
                )
            if written is not None:
                return written, planned, plan_s
        proposal: RoundIntent | None = None
        with transaction(ctx.db, write=False) as session:
            study = service.get_study(session, study_id)
            observed = study.supersessions_done  # the values the proposal is planned on
            if RoundIntent.of(study) is None and study.iterations_done < study.iterations_total:
                t0 = time.perf_counter()
                proposal = rounds.plan_round(session, ctx, study, budget=_budget(study, settle_at, claim))
                plan_s += time.perf_counter() - t0
        with transaction(ctx.db) as session:
            study = service.claimable(session, study_id) if claim else service.get_study(session, study_id)
            intent = RoundIntent.of(study)
            if intent is not None:
                if claim:
                    study = service.claim_step(session, study)
                return study, intent, plan_s
            _check_budget_left(study)
            budget = _budget(study, settle_at, claim)
            if (
                proposal is None
                or proposal.round != study.rounds_done + 1
                or len(proposal.requests) > budget
                or study.supersessions_done != observed
            ):
                t0 = time.perf_counter()  # the study moved since it was read: plan again
                proposal = rounds.plan_round(session, ctx, study, budget=budget)
                plan_s += time.perf_counter() - t0
            target = study.iterations_done + len(proposal.requests) if claim else None
            claim_from = service.STARTABLE if claim else None
            study = rounds.save_intent(session, study, proposal, claim_from=claim_from, run_target=target)
        return study, proposal, plan_s

    def _exclude(self, client: CuratorClient, study: Study, refused: PlannedRequest, what: str) -> None:
        """The curator refused ``refused`` for good: from now on the study's strategy (cached, and every one
        rebuilt in this process) never chooses what its kind says the grant can no longer have answered."""
        kind = kind_named(refused.kind)
        mask = kind.exclusions(client, study, refused)
        state = self.ctx.state(study)
        with state.lock:
            before = state.excluded
            stale = before is not None and mask is not None and not (mask & ~before).any()
            if mask is None or stale:
                raise StrategyError(
                    f"{what}: the curator refused request {refused.request} for good, but it was excluded "
                    "already: the strategy chose it anyway"
                )
            state.excluded = mask if before is None else mask | before
            if state.strategy is not None:
                state.strategy.exclude_rows(state.excluded)
        log.info(
            "%s: the curator can no longer answer request %d under the study's grant (nothing was charged); "
            "%d candidates are excluded from now on",
            what,
            refused.request,
            int(state.excluded.sum()),
        )

    @staticmethod
    def _send(client: CuratorClient, study: Study, req: PlannedRequest, what: str) -> CuratorAnswer:
        """One request of the round to the curator, sent by its kind (a repeat of a sent one returns the
        curator's record)."""
        return kind_named(req.kind).send(client, study, req, what)

    @staticmethod
    def _result(
        intent: RoundIntent,
        study: Study,
        queries: list[CuratorAnswer],
        plan_s: float,
        curator_s: float,
        db_s: float,
        t_start: float,
    ) -> StepResult:
        public = [public_query(req, q) for req, q in zip(intent.requests, queries, strict=True)]
        complete = all(q.status == "complete" for q in public)
        single = public[0] if len(public) == 1 else None
        details = single.details if single is not None else {}
        return StepResult(
            round=intent.round,
            queries=public,
            status="complete" if complete else "pending",
            iteration=study.iterations_done + len(public),
            index=single.index if single is not None else None,
            y=single.y if single is not None else None,
            **rounds.v1_numbers(details),
            source=str(details["source"]) if "source" in details else None,
            curator_query_id=single.curator_query_id if single is not None else None,
            timings=StepTimings(
                gp_ms=plan_s * 1e3,
                curator_ms=curator_s * 1e3,
                db_ms=db_s * 1e3,
                total_ms=(time.perf_counter() - t_start) * 1e3,
            ),
        )


def _budget(study: Study, settle_at: int | None, claim: bool) -> int:
    """How many requests the study's next round may have (``_allowed``)."""
    return _allowed(study.iterations_total, study.iterations_done, settle_at, claim)


def _allowed(total: int, done: int, settle_at: int | None, claim: bool) -> int:
    """How many requests the next round may have, of a budget of ``total`` with ``done`` used: up to the
    run's target (a step: the whole budget left)."""
    limit = total
    if not claim and settle_at is not None and settle_at > 0:
        limit = min(limit, settle_at)
    return max(1, limit - done)


def _check_budget_left(study: Study) -> None:
    """409 when the study, with no round in flight, has used all its iterations."""
    if study.iterations_done >= study.iterations_total:
        raise Conflict(f"study {study.id} is done: all {study.iterations_total} iterations are used")


class RunnerRegistry:
    """At most one background thread per study; each runs iterations until the study's ``run_target``."""

    def __init__(self, ctx: Context, stepper: Stepper) -> None:
        self.ctx = ctx
        self.stepper = stepper
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._lock = threading.Lock()

    def is_running(self, study_id: str) -> bool:
        with self._lock:
            entry = self._threads.get(study_id)
            return entry is not None and entry[0].is_alive()

    def start(self, study_id: str, *, exit_wait: float = 10.0) -> None:
        """Start the runner of a study already claimed in the database (status running/awaiting).

        The caller's claim succeeded, so a previous runner still alive has left the study's active states
        (it settled the study, then returns): its thread is given ``exit_wait`` seconds to end instead of a
        409 (a run asked for the moment the last one settled, the study would otherwise be refused)."""
        deadline = time.monotonic() + exit_wait
        while True:
            with self._lock:
                current = self._threads.get(study_id)
                if current is None or not current[0].is_alive():
                    stop = threading.Event()
                    thread = threading.Thread(
                        target=self._run,
                        args=(study_id, stop),
                        name=f"pobo-study-{study_id[:8]}",
                        daemon=True,
                    )
                    self._threads[study_id] = (thread, stop)
                    thread.start()
                    return
            if time.monotonic() >= deadline:
                raise Conflict(f"study {study_id} already has a runner")
            current[0].join(min(0.5, max(0.0, deadline - time.monotonic())))

    def _run(self, study_id: str, stop: threading.Event) -> None:
        ctx = self.ctx
        failures = 0  # transient curator failures in a row
        synced = False
        try:
            while not stop.is_set():
                with transaction(ctx.db, write=False) as session:
                    study = service.get_study(session, study_id)
                if study.status not in repo.ACTIVE_STATUSES:
                    return
                if not synced and study.awaits_measurements:  # the run plans on the values as corrected
                    supersessions.sync_quietly(ctx, study)
                    synced = True
                target = study.iterations_total if study.run_target is None else study.run_target
                target = min(target, study.iterations_total)
                if study.iterations_done >= target and study.pending_round is None:
                    with transaction(ctx.db) as session:
                        service.settle(session, study_id)
                    log.info("study %s: run finished at iteration %d", study_id, study.iterations_done)
                    return
                try:
                    result = self.stepper.step(study_id, wait=True, stop=stop, settle_at=target)
                    if result is not None and result.iteration >= target:
                        # the round's transaction settled the study: this run is over. (Reading the study
                        # again could find it claimed by the next run already, and run that one too.)
                        log.info("study %s: run finished at iteration %d", study_id, result.iteration)
                        return
                except (ModelerError, CuratorError) as exc:
                    cause = curator_cause(exc)
                    if cause is None or not is_transient(cause):
                        raise
                    failures += 1
                    if not self._wait_for_curator(study_id, cause, failures, stop):
                        return
                    continue
                if failures:  # the curator is back: the next outage starts from the shortest wait
                    failures = 0
                    with transaction(ctx.db) as session:
                        repo.clear_retry_attempts(session, study_id)
        except (ModelerError, CuratorError, PoboError) as exc:
            if not stop.is_set():
                detail = getattr(exc, "detail", str(exc))
                log.warning("study %s: run failed: %s", study_id, detail)
                self._mark(study_id, "failed", error=str(detail))
        except Exception as exc:  # noqa: BLE001 - a runner must never die silently
            if not stop.is_set():
                log.exception("study %s: runner crashed (%s)", study_id, type(exc).__name__)
                self._mark(
                    study_id, "failed", error=f"internal error ({type(exc).__name__}); see the modeler log"
                )
        finally:
            if stop.is_set():
                self._mark(study_id, "ready", error=None)  # interrupted by a shutdown: resumable
            with self._lock:
                if self._threads.get(study_id, (None,))[0] is threading.current_thread():
                    del self._threads[study_id]

    def _wait_for_curator(
        self, study_id: str, cause: CuratorError, failures: int, stop: threading.Event
    ) -> bool:
        """``waiting_for_curator`` (with the error and the next attempt's time), wait, ``running`` again.

        False when the run must end instead (stopped by a shutdown, or the study left its active states).
        """
        settings = self.ctx.settings
        wait = delay_seconds(
            failures,
            base=settings.curator_retry_base_seconds,
            cap=settings.curator_retry_max_seconds,
            retry_after=cause.retry_after,
        )
        retry_at = utcnow() + timedelta(seconds=wait)
        log.warning(
            "study %s: waiting for the curator (attempt %d failed: %s); next attempt in %.1f s",
            study_id,
            failures,
            cause,
            wait,
        )
        with transaction(self.ctx.db) as session:
            if not repo.set_waiting(
                session, study_id, error=str(cause), retry_at=retry_at, attempts=failures
            ):
                return False
        if stop.wait(wait):
            return False
        with transaction(self.ctx.db) as session:
            return repo.resume_after_wait(session, study_id, attempts=failures)

    def _mark(self, study_id: str, status: str, *, error: str | None) -> None:
        try:
            with transaction(self.ctx.db) as session:
                repo.set_status(session, study_id, status, only_if=repo.ACTIVE_STATUSES, error=error)
        except ModelerError:
            log.exception("study %s: could not record status %s", study_id, status)

    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every runner (a shutdown): in-flight long-polls are cut by closing the curator clients."""
        with self._lock:
            entries = list(self._threads.items())
        for _, (_, stop) in entries:
            stop.set()
        for study_id, _ in entries:
            state = self.ctx.cache.get(study_id)
            if state is not None and state.client is not None:
                state.client.close()
        deadline = time.monotonic() + timeout
        for _, (thread, _) in entries:
            thread.join(max(0.0, deadline - time.monotonic()))


def start_run(ctx: Context, runners: RunnerRegistry, study_id: str, iterations: int | None) -> RunAccepted:
    """Claim the study for a background run (``prepare_run``, its own transaction) and start its runner
    thread; if the runner cannot start, the study goes back to ``ready``. (``POST .../run``, the console.)"""
    with transaction(ctx.db) as session:
        accepted = service.prepare_run(session, study_id, iterations)
    try:
        runners.start(study_id)
    except ModelerError:
        with transaction(ctx.db) as session:
            service.release_after_failed_step(session, study_id)
        raise
    return accepted


def step_now(ctx: Context, stepper: Stepper, runners: RunnerRegistry, study_id: str) -> StepResult:
    """One round now (claimed for this round; 409 when a runner owns the study or it is done). A round
    left pending on a manual measurement continues in a background runner. (``POST .../step``, the console.)
    """
    try:
        result = stepper.step(study_id, wait=False, claim=True, settle_at=0)
    except NotClaimed:
        raise  # someone else owns the study (or it is done): leave its status alone
    except BaseException:
        with transaction(ctx.db) as session:
            service.release_after_failed_step(session, study_id)
        raise
    assert result is not None
    if result.status == "pending":
        runners.start(study_id)  # waits for the measurement in the background
    return result
