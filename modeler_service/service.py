"""Use cases of the modeler service around studies: create, show, claim for a run or a step, settle.

No HTTP types here, and nothing commits: callers own transactions. The rounds themselves (plan, write-ahead
intent, record) are in ``modeler_service.rounds``. The service knows strategies only through the registry
interface (``shared.bo.strategies``): a name, a parameter model, ``initial_state``, ``plan``, ``observe``.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import numpy as np
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
from modeler_service.exceptions import Conflict, NotFound, Unprocessable, UpstreamError
from modeler_service.grants import fit_to_grant, grant_problem, needs_grant
from modeler_service.models import Study
from modeler_service.rounds import RoundIntent
from modeler_service.schemas import (
    BestPoint,
    GradientOracleInfo,
    PendingQuery,
    PendingRound,
    ReleaseInfo,
    RunAccepted,
    StrategiesPublic,
    StrategyInfo,
    StudiesPublic,
    StudyCreate,
    StudyPublic,
)
from shared.bo.strategies import (
    GradientDomain,
    Strategy,
    StrategyParams,
    catalogue,
    get_strategy,
    parse_params,
)
from shared.errors import InputDataError
from shared.privacy.rng import os_entropy_rng
from shared.protocol.client import CuratorError, ReleaseIntegrityError
from shared.protocol.schemas.gradients import MAX_DESIGN_POINTS

log = logging.getLogger("pobo.modeler")

#: The release's public parameters a study keeps, as ``release_<name>`` columns.
RELEASE_FIELDS = ("epsilon", "delta", "mechanism", "formal_guarantee", "noise_std", "lift", "omega")

#: Study columns published under their own names.
_STUDY_FIELDS = (
    *("id", "status", "release_id", "curator_url", "n", "r", "strategy", "iterations_total"),
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
    """Validate the strategy's parameters, then create the study on what the strategy runs on: a release
    (its public parameters and Z) or a gradient oracle (its public parameters)."""
    check_curator_url(body.curator_url, ctx.settings.curator_url_allowlist)
    try:
        strategy = get_strategy(body.strategy)
        params = parse_params(body.strategy, body.merged_params())
    except (InputDataError, ValueError) as exc:
        raise Unprocessable(str(exc)) from exc
    if strategy.runs_on == "gradient-oracle":
        return _create_on_gradient_oracle(session, ctx, body, strategy, params)
    return _create_on_release(session, ctx, body, strategy, params)


def _create_on_release(
    session: Session,
    ctx: Context,
    body: StudyCreate,
    strategy: type[Strategy[Any, Any]],
    params: StrategyParams,
) -> Study:
    """Fetch the release's public parameters and Z (sha256-verified, stored atomically), then the study."""
    if body.release_id is None:  # StudyCreate checks it; for the type checker
        raise Unprocessable(f"strategy {body.strategy!r} runs on a curator release: give release_id")
    study_id = uuid.uuid4().hex
    token = body.curator_token.get_secret_value()
    client = ctx.client_factory(body.curator_url, token)
    what = f"release {body.release_id}"
    z_dir = ctx.data_dir / "releases"
    z_dir.mkdir(parents=True, exist_ok=True)
    z_file = Path("releases") / f"study-{study_id}.npy"
    try:
        if needs_grant(strategy, params, body.iterations):
            grant = client.get_partner().output_privacy
            problem = grant_problem(strategy, params, body.iterations, grant)
            if problem is not None:
                raise Unprocessable(problem)
            params = fit_to_grant(strategy, params, grant)
        release = client.get_release(body.release_id)
        digest = client.download_release_rows(
            body.release_id, ctx.data_dir / z_file, expected_sha256=release.sha256
        )
    except ReleaseIntegrityError as exc:
        raise UpstreamError(f"{what}: {exc.detail}") from exc
    except CuratorError as exc:
        raise upstream(exc, what) from exc
    finally:
        client.close()
    Z = np.load(ctx.data_dir / z_file, mmap_mode="r")
    n, r = int(Z.shape[0]), int(Z.shape[1])
    if n != release.n or r != release.r:
        (ctx.data_dir / z_file).unlink(missing_ok=True)
        raise UpstreamError(
            f"{what}: rows have shape {n} x {r}, but the release says {release.n} x {release.r}"
        )
    rng = np.random.default_rng(body.seed) if body.seed is not None else os_entropy_rng()
    try:
        state = strategy.initial_state(params, n=n, budget=body.iterations, rng=rng)
    except InputDataError as exc:
        (ctx.data_dir / z_file).unlink(missing_ok=True)
        raise Unprocessable(str(exc)) from exc
    study = Study(
        id=study_id,
        curator_url=body.curator_url.rstrip("/"),
        curator_token_enc=ctx.encrypt(token),
        release_id=body.release_id,
        n=n,
        r=r,
        **{f"release_{key}": getattr(release, key) for key in RELEASE_FIELDS},
        z_file=str(z_file),
        z_sha256=digest,
        strategy=body.strategy,
        strategy_params=params.model_dump(mode="json"),
        strategy_state=state,
        iterations_total=body.iterations,
        seed=body.seed,
        status="ready",
        iterations_done=0,
        rounds_done=0,
    )
    log.info(
        "study %s (%s) created on release %s (n=%d, r=%d)", study_id, body.strategy, body.release_id, n, r
    )
    return repo.add_study(session, study)


def _create_on_gradient_oracle(
    session: Session,
    ctx: Context,
    body: StudyCreate,
    strategy: type[Strategy[Any, Any]],
    params: StrategyParams,
) -> Study:
    """Fetch the gradient oracle's public parameters (404 when unknown or not granted), check that the
    study's iterations fit the steps it has left and that the parameters fit its domain, then the study."""
    oracle_id = body.gradient_oracle_id
    if oracle_id is None:  # StudyCreate checks it; for the type checker
        raise Unprocessable(f"strategy {body.strategy!r} runs on a gradient oracle: give gradient_oracle_id")
    token = body.curator_token.get_secret_value()
    what = f"gradient oracle {oracle_id}"
    client = ctx.client_factory(body.curator_url, token)
    try:
        oracle = client.get_gradient_oracle(oracle_id)
    except CuratorError as exc:
        raise upstream(exc, what) from exc
    finally:
        client.close()
    if body.iterations > oracle.steps_left:
        raise Unprocessable(
            f"iterations must be <= the {oracle.steps_left} steps {what} has left (of {oracle.steps}), got "
            f"{body.iterations}: ask for at most {oracle.steps_left} iterations, or ask the curator for an "
            "oracle with more steps"
        )
    public = GradientOracleInfo.model_validate(oracle.model_dump()).model_dump(mode="json")
    domain = GradientDomain.from_public(public, max_design=MAX_DESIGN_POINTS)
    rng = np.random.default_rng(body.seed) if body.seed is not None else os_entropy_rng()
    try:
        strategy.check_domain(params, domain, budget=body.iterations)
        state = strategy.initial_state(params, n=oracle.n, budget=body.iterations, rng=rng)
        start = strategy(domain, params, state).point()
    except InputDataError as exc:
        raise Unprocessable(f"{exc} ({what}: dimension {domain.dimension})") from exc
    study = Study(
        id=uuid.uuid4().hex,
        curator_url=body.curator_url.rstrip("/"),
        curator_token_enc=ctx.encrypt(token),
        release_id=None,
        n=oracle.n,
        r=oracle.dimension,
        gradient_oracle_id=oracle_id,
        gradient_oracle=public,
        theta=None if start is None else [float(v) for v in start],
        strategy=body.strategy,
        strategy_params=params.model_dump(mode="json"),
        strategy_state=state,
        iterations_total=body.iterations,
        seed=body.seed,
        status="ready",
        iterations_done=0,
        rounds_done=0,
    )
    log.info(
        "study %s (%s) created on gradient oracle %s (d=%d, steps left %d)",
        study.id,
        body.strategy,
        oracle_id,
        oracle.dimension,
        oracle.steps_left,
    )
    return repo.add_study(session, study)


def get_study(session: Session, study_id: str) -> Study:
    study = repo.get_study(session, study_id)
    if study is None:
        raise NotFound(f"study {study_id} not found")
    return study


def to_public(study: Study) -> StudyPublic:
    best = None
    if study.best_index is not None and study.best_y is not None:
        best = BestPoint(index=study.best_index, y=study.best_y)
    elif study.theta is not None:  # a gradient-oracle study: its current theta
        best = BestPoint(index=None, y=None, theta=[float(v) for v in study.theta])
    intent = RoundIntent.of(study)
    pending, pending_round = None, None
    if intent is not None:
        queries = [r.public(None) for r in intent.requests]
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
            "retry_attempts": study.retry_attempts or 0,
            "best": best,
            "pending": pending,
            "pending_round": pending_round,
            "release": _release_info(study),
            "gradient_oracle_id": study.gradient_oracle_id,
            "gradient_oracle": study.gradient_oracle,
        }
    )


def _release_info(study: Study) -> ReleaseInfo | None:
    if study.release_id is None:
        return None
    return ReleaseInfo(
        id=study.release_id,
        n=study.n,
        r=study.r,
        sha256=study.z_sha256 or "",
        **{key: getattr(study, f"release_{key}") for key in RELEASE_FIELDS},
    )


def strategies() -> StrategiesPublic:
    """The registry: every strategy's name, description and parameter JSON schema."""
    return StrategiesPublic(strategies=[StrategyInfo(**entry) for entry in catalogue()])


def list_studies(session: Session) -> StudiesPublic:
    studies = [to_public(s) for s in repo.list_studies(session)]
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


def claim_step(session: Session, study_id: str) -> Study:
    """Claim the study for one synchronous step (409 when a runner owns it or the budget is used).

    Check-and-set under the row's write lock (PostgreSQL: ``SELECT ... FOR UPDATE``; SQLite: the write
    session's ``BEGIN IMMEDIATE``), so two concurrent claims cannot both succeed.
    """
    study = repo.get_study(session, study_id, for_update=True)
    if study is None:
        raise NotFound(f"study {study_id} not found")
    if study.status in repo.ACTIVE_STATUSES:
        raise NotClaimed(f"study {study_id} is {study.status}; wait for it or for its run to finish")
    if study.iterations_done >= study.iterations_total and study.pending_round is None:
        raise NotClaimed(f"study {study_id} is done: all {study.iterations_total} iterations are used")
    if study.status not in STARTABLE:
        raise NotClaimed(f"study {study_id} is {study.status}")
    # the step's round is not planned yet: its run target is set with the intent (rounds.save_intent)
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
