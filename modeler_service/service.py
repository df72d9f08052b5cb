"""Use cases of the modeler service around studies: create, show, claim for a run or a step, settle.

No HTTP types here, and nothing commits: callers own transactions. The rounds themselves (plan, write-ahead
intent, record) are in ``modeler_service.rounds``. The service knows strategies only through the registry
interface (``shared.bo.strategies``): a name, a parameter model, ``initial_state``, ``plan``, ``observe``.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service.context import (  # noqa: F401 - re-exported for the routes and the app
    ClientFactory,
    Context,
    NotClaimed,
    StudyCache,
    StudyState,
    default_client_factory,
    upstream,
)
from modeler_service.db import transaction
from modeler_service.exceptions import Conflict, NotFound, Unprocessable
from modeler_service.kinds import kind_for, kind_of
from modeler_service.models import Study, utcnow
from modeler_service.rounds import RoundIntent, posterior_mean_at_best, public_query
from modeler_service.schemas import (
    PendingQuery,
    PendingRound,
    RunAccepted,
    StrategiesPublic,
    StrategyInfo,
    StudiesPublic,
    StudyCreate,
    StudyPublic,
    StudyUpdate,
)
from shared.bo.strategies import (
    catalogue,
    get_strategy,
    parse_params,
)
from shared.errors import InputDataError
from shared.protocol.client import CuratorError
from shared.protocol.schemas.studies import check_tag

log = logging.getLogger("pobo.modeler")

#: Study columns published under their own names.
_STUDY_FIELDS = (
    *("id", "name", "status", "release_id", "curator_url", "n", "r", "strategy", "iterations_total"),
    *("iterations_done", "rounds_done", "run_target", "error", "retry_at", "created_at", "updated_at"),
)

#: Study statuses from which a new run or step may start.
STARTABLE = ("ready", "failed")


# --------------------------------------------------------------------------------------------- studies


def check_curator_url(url: str, allowlist: list[str]) -> None:
    """The study's curator_url, against the setting CURATOR_URL_ALLOWLIST (empty: any URL)."""
    if not allowlist:
        return
    base = url.rstrip("/")
    for allowed in allowlist:
        prefix = allowed.rstrip("/")
        if base == prefix or base.startswith(prefix + "/"):
            return
    raise Unprocessable(
        f"curator_url {base!r} is not allowed: this modeler talks only to {', '.join(map(repr, allowlist))} "
        "(setting POBO_MODELER_CURATOR_URL_ALLOWLIST)"
    )


def create_study(session: Session, ctx: Context, body: StudyCreate) -> Study:
    """Validate the strategy's parameters, then create the study on what the strategy runs on (its request
    kind sets it up: a release and its Z, a gradient oracle's public parameters, ...)."""
    check_curator_url(body.curator_url, ctx.settings.curator_url_allowlist)
    try:
        strategy = get_strategy(body.strategy)
        params = parse_params(body.strategy, body.merged_params())
    except (InputDataError, ValueError) as exc:
        raise Unprocessable(str(exc)) from exc
    try:
        study = kind_for(strategy).create(session, ctx, body, strategy, params)
    except NotFound:
        problem = not_a_curator(ctx, body.curator_url, body.curator_token.get_secret_value())
        if problem is not None:
            raise Unprocessable(problem) from None
        raise
    study.name = body.name
    repo.set_tags(session, study, body.tags or [])
    return study


def not_a_curator(ctx: Context, url: str, token: str) -> str | None:
    """Why ``url`` is not a pobo curator's base URL (asked when it answered "not found"), or None when it
    is one: its ``GET /healthz`` names the service that answers."""
    base = url.rstrip("/")
    hint = " (give its base URL, without /v1)" if base.endswith("/v1") else ""
    client = ctx.client_factory(base, token)
    try:
        health = client.healthz()
    except CuratorError:
        return (
            f'curator_url {base!r} is not a pobo curator: it answered "not found" and its GET /healthz '
            f"does not answer like a pobo service{hint}; give the curator's base URL, e.g. "
            "https://curator.example.org"
        )
    finally:
        client.close()
    if health.service not in (None, "curator"):
        return (
            f"curator_url {base!r} is not a pobo curator (it answered as the pobo {health.service}){hint}; "
            "give the curator's base URL"
        )
    return None


def update_study(ctx: Context, study_id: str, body: StudyUpdate) -> Study:
    """``PATCH /v1/studies/{id}``: a rotated partner token, a new budget, a new name or new tags.

    The one use case here that owns its transactions (as the stepper does): the study is read, the curator
    asked (outside any write transaction: the new token must read the study's target, and a larger budget
    must fit what the grant has left, ``RequestKind.budget_left``), then the study is written under its
    row lock, checked again. A new token is used from the study's next request on, even while it runs; the
    budget changes only while no run owns the study, and the strategy keeps the constants it chose for
    its first budget. A name or tags alone are written at once, in any status (the curator is not asked)."""
    if not body.asks_curator:
        with transaction(ctx.db) as session:
            locked = repo.get_study(session, study_id, for_update=True)  # one relabelling at a time
            if locked is None:
                raise NotFound(f"study {study_id} not found")
            study = locked
            _relabel(session, study, body)
            log.info("study %s relabelled", study_id)
            return study
    with transaction(ctx.db, write=False) as session:
        study = get_study(session, study_id)
        _check_update(study, body)
        token = body.curator_token.get_secret_value() if body.curator_token is not None else None
        kind = kind_of(study)
        url, token_enc = study.curator_url, study.curator_token_enc
    client = ctx.client_factory(url, token if token is not None else ctx.decrypt(token_enc))
    try:
        left, what_left = kind.budget_left(client, study)
    except CuratorError as exc:
        raise upstream(exc, f"study {study_id}") from exc
    finally:
        client.close()
    with transaction(ctx.db) as session:
        locked = repo.get_study(session, study_id, for_update=True)
        if locked is None:
            raise NotFound(f"study {study_id} not found")
        study = locked
        floor = _check_update(study, body)
        if body.iterations is not None:
            needed = body.iterations - floor
            if body.iterations > study.iterations_total and needed > left:
                raise Unprocessable(
                    f"iterations {body.iterations} would need {needed} more queries, but the curator's grant "
                    f"has {what_left}: ask for at most {floor + left} iterations, or ask the curator for more"
                )
            study.iterations_total = body.iterations
            if study.status in ("done", "ready"):
                study.status = "done" if study.iterations_done >= body.iterations else "ready"
            ctx.cache.drop(study_id)  # its fixed facts changed (no run owns it: nothing in flight uses it)
        if token is not None:
            study.curator_token_enc = ctx.encrypt(token)
            ctx.cache.retire_client(study_id)  # the next request makes a client with the new token
        _relabel(session, study, body)
        study.updated_at = utcnow()
        log.info("study %s updated (%s)", study_id, ", ".join(k for k in body.model_fields_set))
        return study


def _relabel(session: Session, study: Study, body: StudyUpdate) -> None:
    """The name and tags of ``body``, if it gives them (a name given as null removes it)."""
    if "name" in body.model_fields_set:
        study.name = body.name
    if body.tags is not None:
        repo.set_tags(session, study, body.tags)
    if body.relabels:
        study.updated_at = utcnow()


def _check_update(study: Study, body: StudyUpdate) -> int:
    """The queries the study has made or has in flight (the least its budget may become); 409 when its budget
    would change while a run owns it, 422 for a budget below what it has made."""
    intent = RoundIntent.of(study)
    floor = study.iterations_done + (len(intent.requests) if intent is not None else 0)
    if body.iterations is not None:
        if study.status in repo.ACTIVE_STATUSES:
            raise Conflict(
                f"study {study.id} is {study.status}: its budget changes only while no run owns it; stop it "
                f"(POST /v1/studies/{study.id}/stop) or wait for the run to end, then PATCH again"
            )
        if body.iterations < floor:
            raise Unprocessable(
                f"iterations must be at least the {floor} queries the study has made, got {body.iterations}"
            )
    return floor


def get_study(session: Session, study_id: str) -> Study:
    study = repo.get_study(session, study_id)
    if study is None:
        raise NotFound(f"study {study_id} not found")
    return study


def to_public(study: Study) -> StudyPublic:
    kind = kind_of(study)
    intent = RoundIntent.of(study)
    pending, pending_round = None, None
    if intent is not None:
        queries = [public_query(r, None) for r in intent.requests]
        pending_round = PendingRound(round=intent.round, queries=queries)
        first = next((r for r in intent.requests if r.index is not None), None)
        if first is not None and first.index is not None:
            pending = PendingQuery(
                iteration=study.iterations_done + 1 + first.request,
                index=first.index,
                curator_query_id=first.query_id,
            )
    return StudyPublic.model_validate(
        {
            **{key: getattr(study, key) for key in _STUDY_FIELDS},
            "strategy_params": dict(study.strategy_params or {}),
            "tags": list(study.tags or []),
            "retry_attempts": study.retry_attempts or 0,
            "best": kind.best(study),
            "pending": pending,
            "pending_round": pending_round,
            **kind.public_fields(study),
        }
    )


def study_detail(session: Session, ctx: Context, study_id: str) -> StudyPublic:
    """``GET /v1/studies/{id}``: the study, its noisy best answer with the strategy's posterior mean beside
    it (``rounds.posterior_mean_at_best``)."""
    study = get_study(session, study_id)
    public = to_public(study)
    mean = posterior_mean_at_best(session, ctx, study)
    if mean is None or public.best is None:
        return public
    return public.model_copy(update={"best": public.best.model_copy(update={"posterior_mean": mean})})


def strategies() -> StrategiesPublic:
    """The registry: every strategy's name, description and parameter JSON schema."""
    return StrategiesPublic(strategies=[StrategyInfo(**entry) for entry in catalogue()])


def list_studies(
    session: Session, *, name: str | None = None, tags: list[str] | None = None
) -> StudiesPublic:
    """Every study, or those whose name contains ``name`` (ignoring case) and that have every tag of
    ``tags`` (ignoring case); a filter tag that no study could have is a 422 that says what a tag is."""
    try:
        wanted = [check_tag(t) for t in tags or []]
    except ValueError as exc:
        raise Unprocessable(f"tag filter: {exc}") from None
    found = repo.list_studies(session, name=(name or "").strip() or None, tags=wanted)
    studies = [to_public(s) for s in found]
    return StudiesPublic(data=studies, count=len(studies))


# ------------------------------------------------------------------------------------------------- runs


def prepare_run(session: Session, study_id: str, iterations: int | None) -> RunAccepted:
    """Claim the study for a background run (atomically: a second run is a 409)."""
    study = get_study(session, study_id)
    remaining = study.iterations_total - study.iterations_done
    if study.status in repo.ACTIVE_STATUSES:
        raise Conflict(f"study {study_id} is already {study.status}")
    if remaining <= 0:
        raise Conflict(f"study {study_id} is done: all {study.iterations_total} iterations are used")
    if iterations is not None and iterations > remaining:
        raise Unprocessable(
            f"iterations must be <= the {remaining} iterations left in the budget, got {iterations}"
        )
    target = study.iterations_done + (iterations or remaining)
    if not repo.claim_study(
        session, study_id, from_statuses=STARTABLE, to_status="running", run_target=target
    ):
        raise Conflict(f"study {study_id} is already running")
    return RunAccepted(
        id=study_id, status="running", iterations_done=study.iterations_done, run_target=target
    )


def stop_run(session: Session, study_id: str) -> Study:
    """Ask a running study to stop after the round in flight: its ``run_target`` becomes
    ``iterations_done``. The runner re-reads the target before every round (in whichever worker process it
    runs), so once the round in flight is recorded it settles the study (``ready``, or ``done`` if that
    round used the budget). A study ``awaiting_measurement`` stops once that round's answers arrive; one
    ``waiting_for_curator`` stops after its retried round. 409 when the study is not running.
    """
    study = repo.get_study(session, study_id, for_update=True)
    if study is None:
        raise NotFound(f"study {study_id} not found")
    if study.status not in repo.ACTIVE_STATUSES:
        raise Conflict(
            f"study {study_id} is {study.status}, not running: only a running study can be stopped"
        )
    study.run_target = study.iterations_done
    session.flush()
    log.info("study %s: stop asked at iteration %d", study_id, study.iterations_done)
    return study


def claimable(session: Session, study_id: str) -> Study:
    """The study under its write lock, if a synchronous step may claim it (409 when a runner owns it or the
    budget is used); nothing written. Check under the row's write lock (PostgreSQL: ``SELECT ... FOR
    UPDATE``; SQLite: the write session's ``BEGIN IMMEDIATE``), so two concurrent claims cannot both
    succeed: the claim itself is written with the round's intent (``rounds.save_intent``) or, for a round
    already in flight, by ``claim_step``."""
    study = repo.get_study(session, study_id, for_update=True)
    if study is None:
        raise NotFound(f"study {study_id} not found")
    if study.status in repo.ACTIVE_STATUSES:
        raise NotClaimed(f"study {study_id} is {study.status}; wait for it or for its run to finish")
    if study.iterations_done >= study.iterations_total and study.pending_round is None:
        raise NotClaimed(f"study {study_id} is done: all {study.iterations_total} iterations are used")
    if study.status not in STARTABLE:
        raise NotClaimed(f"study {study_id} is {study.status}")
    return study


def claim_step(session: Session, study: Study) -> Study:
    """Claim a ``claimable`` study whose round is in flight (its intent written before) for one step."""
    study.status, study.run_target, study.error = "running", study.iterations_done + 1, None
    return study


def settle(session: Session, study_id: str) -> None:
    """After a run or a step: ``done`` when the budget is used, else ``ready``."""
    study = get_study(session, study_id)
    status = "done" if study.iterations_done >= study.iterations_total else "ready"
    repo.set_status(session, study_id, status, only_if=repo.ACTIVE_STATUSES, clear_run_target=True)


def recover_stale(session: Session) -> list[str]:
    """Studies left ``running``/``awaiting_measurement`` by a killed process become ``ready``.

    Their write-ahead intent (if any) is kept, so the next step or run first completes that very round with
    the same Idempotency-Keys (the curator answers with the queries it already has: nothing is charged twice).
    """
    ids = repo.stale_study_ids(session)
    for study_id in ids:
        repo.set_status(session, study_id, "ready", only_if=repo.ACTIVE_STATUSES)
    return ids


def release_after_failed_step(session: Session, study_id: str) -> None:
    """A step or a run start failed: the study goes back to ``ready`` (its intent, if any, is kept)."""
    repo.set_status(session, study_id, "ready", only_if=("running",), clear_run_target=True)
