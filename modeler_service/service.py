"""Use cases of the modeler service. No HTTP types here, and nothing commits: callers own transactions.

The state of a study lives in the database alone: the study row (parameters, run state, the write-ahead
intent of the iteration in flight) and its audit entries, which double as the observations (index, y) that
the GP-UCB strategy is rebuilt from (``GPUCB.from_history``). ``StudyCache`` keeps the rebuilt strategy in
memory between iterations, keyed by the number of observations it has seen; any mismatch (a restart,
another process) rebuilds it from the database.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service.audit import canonical_hyperparameters, entry_hash
from modeler_service.context import (  # noqa: F401
    ClientFactory,
    Context,
    NotClaimed,
    StudyCache,
    StudyState,
    default_client_factory,
    upstream,
)
from modeler_service.exceptions import (
    Conflict,
    NotFound,
    StorageError,
    Unprocessable,
    UpstreamError,
)
from modeler_service.models import AuditEntry, Study, utcnow
from modeler_service.schemas import (
    BestPoint,
    FixedHyperparameters,
    PendingQuery,
    ReleaseInfo,
    RunAccepted,
    StudiesPublic,
    StudyCreate,
    StudyPublic,
)
from shared.bo.gp import Hyperparameters
from shared.bo.strategies import GPUCB, random_initial_indices
from shared.protocol.client import CuratorError, ReleaseIntegrityError
from shared.protocol.schemas import QueryPublic

log = logging.getLogger("pobo.modeler")

#: Study statuses from which a new run or step may start.
STARTABLE = ("ready", "failed")


# --------------------------------------------------------------------------------------------- studies


def _hp_option(hp: Any) -> Hyperparameters | str:
    if hp == "mle":
        return "mle"
    return Hyperparameters(
        lengthscale=float(hp["lengthscale"]),
        signal_variance=float(hp["signal_variance"]),
        noise_variance=float(hp["noise_variance"]),
    )


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
    """Fetch the release's public parameters and Z (sha256-verified, stored atomically), then the study."""
    check_curator_url(body.curator_url, ctx.settings.curator_url_allowlist)
    study_id = uuid.uuid4().hex
    token = body.curator_token.get_secret_value()
    client = ctx.client_factory(body.curator_url, token)
    what = f"release {body.release_id}"
    z_dir = ctx.data_dir / "releases"
    z_dir.mkdir(parents=True, exist_ok=True)
    z_file = Path("releases") / f"study-{study_id}.npy"
    try:
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
    if body.initial_points > n:
        (ctx.data_dir / z_file).unlink(missing_ok=True)
        raise Unprocessable(f"initial_points must be <= the release's n = {n}, got {body.initial_points}")
    rng = np.random.default_rng(body.seed)  # seed None: fresh OS entropy
    initial = random_initial_indices(n, min(body.initial_points, body.iterations), rng)
    hp: Any = "mle" if body.hyperparameters == "mle" else body.hyperparameters.model_dump()
    study = Study(
        id=study_id,
        curator_url=body.curator_url.rstrip("/"),
        curator_token_enc=ctx.encrypt(token),
        release_id=body.release_id,
        n=n,
        r=r,
        release_epsilon=release.epsilon,
        release_delta=release.delta,
        release_mechanism=release.mechanism,
        release_formal_guarantee=release.formal_guarantee,
        release_noise_std=release.noise_std,
        release_lift=release.lift,
        release_omega=release.omega,
        z_file=str(z_file),
        z_sha256=digest,
        strategy=body.strategy,
        iterations_total=body.iterations,
        delta_prime=body.delta_prime,
        hyperparameters=hp,
        exclude_queried=body.exclude_queried,
        initial_points=body.initial_points,
        initial_indices=initial,
        seed=body.seed,
        status="ready",
        iterations_done=0,
    )
    log.info("study %s created on release %s (n=%d, r=%d)", study_id, body.release_id, n, r)
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
    pending = None
    if study.pending_iteration is not None and study.pending_index is not None:
        pending = PendingQuery(
            iteration=study.pending_iteration,
            index=study.pending_index,
            curator_query_id=study.pending_query_id,
        )
    hp: Any = "mle" if study.hyperparameters == "mle" else FixedHyperparameters(**study.hyperparameters)
    return StudyPublic(
        id=study.id,
        status=study.status,  # type: ignore[arg-type]
        release_id=study.release_id,
        curator_url=study.curator_url,
        n=study.n,
        r=study.r,
        strategy=study.strategy,  # type: ignore[arg-type]
        iterations_total=study.iterations_total,
        iterations_done=study.iterations_done,
        run_target=study.run_target,
        delta_prime=study.delta_prime,
        hyperparameters=hp,
        initial_points=study.initial_points,
        exclude_queried=study.exclude_queried,
        best=best,
        pending=pending,
        error=study.error,
        retry_at=study.retry_at,
        retry_attempts=study.retry_attempts or 0,
        release=ReleaseInfo(
            id=study.release_id,
            n=study.n,
            r=study.r,
            epsilon=study.release_epsilon,
            delta=study.release_delta,
            mechanism=study.release_mechanism,  # type: ignore[arg-type]
            formal_guarantee=study.release_formal_guarantee,
            noise_std=study.release_noise_std,
            lift=study.release_lift,
            omega=study.release_omega,
            sha256=study.z_sha256,
        ),
        created_at=study.created_at,
        updated_at=study.updated_at,
    )


def list_studies(session: Session) -> StudiesPublic:
    studies = [to_public(s) for s in repo.list_studies(session)]
    return StudiesPublic(data=studies, count=len(studies))


# ------------------------------------------------------------------------------------------- iterations


@dataclass(frozen=True)
class Intent:
    """The iteration in flight: which row, and the numbers that chose it (recorded in the audit entry)."""

    iteration: int
    index: int
    suggestion: dict[str, Any]
    query_id: int | None

    @classmethod
    def of(cls, study: Study) -> Intent | None:
        if study.pending_iteration is None or study.pending_index is None:
            return None
        return cls(
            study.pending_iteration,
            study.pending_index,
            dict(study.pending_suggestion or {}),
            study.pending_query_id,
        )


def strategy_for(session: Session, ctx: Context, study: Study) -> GPUCB:
    """The GP-UCB state after the study's recorded observations (cached; rebuilt from the DB on a miss).

    A cached strategy that is behind (another worker process recorded the last iterations) catches up by
    observing just the missing entries, O(n (t + r)) each, instead of a rebuild that replays every refit.
    """
    state = ctx.state(study)
    with state.lock:
        if state.strategy is not None and 0 <= state.n_obs < study.iterations_done:
            missing = repo.observations(session, study.id, after_seq=state.n_obs)
            if len(missing) == study.iterations_done - state.n_obs:
                for index, y in missing:
                    state.strategy.observe(index, y)
                state.n_obs = study.iterations_done
                return state.strategy
        if state.strategy is None or state.n_obs != study.iterations_done:
            obs = repo.observations(session, study.id)
            if len(obs) != study.iterations_done:
                raise StorageError(
                    f"study {study.id} records {study.iterations_done} iterations "
                    f"but has {len(obs)} audit entries"
                )
            state.strategy = GPUCB.from_history(
                state.Z,
                obs,
                delta_prime=study.delta_prime,
                hyperparameters=_hp_option(study.hyperparameters),
                exclude_queried=study.exclude_queried,
            )
            state.n_obs = len(obs)
        return state.strategy


def suggest(session: Session, ctx: Context, study: Study) -> Intent:
    """Choose the row of the next iteration: a random initial row, then the UCB argmax (Alg. 2 line 4)."""
    iteration = study.iterations_done + 1
    initial = list(study.initial_indices or [])
    with ctx.state(study).lock:  # no observe() of this study's strategy while it is read
        strategy = strategy_for(session, ctx, study)
        if iteration <= len(initial):
            index = int(initial[iteration - 1])
            ucb, beta, _t = strategy.acquisition()
            acquisition = float(ucb[index])
            mean, std = float(strategy.gp.mean()[index]), float(strategy.gp.std()[index])
            source = "initial"
        else:
            s = strategy.suggest()
            index, acquisition, beta, mean, std, source = (
                s.index,
                s.acquisition,
                s.beta,
                s.mean,
                s.std,
                "gp-ucb",
            )
        hyperparameters = strategy.hyperparameters.as_dict()
    suggestion = {
        "source": source,
        "acquisition": acquisition,
        "beta": float(beta),
        "mean": mean,
        "std": std,
        "hyperparameters": hyperparameters,
    }
    return Intent(iteration=iteration, index=index, suggestion=suggestion, query_id=None)


def save_intent(session: Session, study: Study, intent: Intent) -> None:
    """Write-ahead: the row about to be queried and the numbers that chose it (in the reading transaction)."""
    if study.pending_iteration is not None or study.iterations_done != intent.iteration - 1:
        raise Conflict(f"study {study.id} changed while iteration {intent.iteration} was being chosen")
    study.pending_iteration = intent.iteration
    study.pending_index = intent.index
    study.pending_suggestion = intent.suggestion
    study.pending_query_id = None
    study.updated_at = utcnow()


def idempotency_key(study_id: str, iteration: int) -> str:
    """The per-iteration key: a repeat (after a crash, a retry) is the same query at the curator."""
    return f"{study_id}:{iteration}"


def record_outcome(
    session: Session, study: Study, intent: Intent, query: QueryPublic, *, settle_at: int | None = None
) -> AuditEntry:
    """The observation and its audit entry, with the study's counters, in the caller's one transaction.

    ``study`` is the row as read when the intent was written (this runner owns the study since then). The
    study row is advanced with one conditional UPDATE that also checks that nothing moved in between (same
    iteration in flight, same audit head); otherwise ``Conflict`` and the insert is rolled back. With
    ``settle_at``, reaching that many iterations ends the run in the same UPDATE (``done`` when the budget
    is used, else ``ready``).
    """
    if query.y is None or query.status != "complete":
        raise UpstreamError(f"query {query.id} has no outcome yet")
    s = intent.suggestion
    entry = AuditEntry(
        study_id=study.id,
        seq=intent.iteration,
        at=utcnow(),
        iteration=intent.iteration,
        row_index=intent.index,
        y=float(query.y),
        source=str(s["source"]),
        acquisition=float(s["acquisition"]),
        beta=float(s["beta"]),
        mean=float(s["mean"]),
        std=float(s["std"]),
        hyperparameters=canonical_hyperparameters(s["hyperparameters"]),
        curator_query_id=int(query.id),
        prev_hash=study.audit_head,
    )
    entry.hash = entry_hash(entry.prev_hash, entry)
    best = (study.best_index, study.best_y)
    if study.best_y is None or entry.y > study.best_y:
        best = (entry.row_index, entry.y)
    settle_status = None
    if settle_at is not None and entry.seq >= settle_at:
        settle_status = "done" if entry.seq >= study.iterations_total else "ready"
    repo.insert_audit_entry(session, entry)
    advanced = repo.advance_study(
        session,
        study.id,
        iteration=intent.iteration,
        prev_head=study.audit_head,
        head=entry.hash,
        best_index=best[0],
        best_y=best[1],
        settle_status=settle_status,
    )
    if not advanced:
        raise Conflict(f"study {study.id} is not at iteration {intent.iteration} any more")
    return entry


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
    if study.iterations_done >= study.iterations_total and study.pending_iteration is None:
        raise NotClaimed(f"study {study_id} is done: all {study.iterations_total} iterations are used")
    if study.status not in STARTABLE:
        raise NotClaimed(f"study {study_id} is {study.status}")
    study.status, study.run_target, study.error = "running", study.iterations_done + 1, None
    return study


def settle(session: Session, study_id: str) -> None:
    """After a run or a step: ``done`` when the budget is used, else ``ready``."""
    study = get_study(session, study_id)
    status = "done" if study.iterations_done >= study.iterations_total else "ready"
    repo.set_status(session, study_id, status, only_if=repo.ACTIVE_STATUSES, clear_run_target=True)


def recover_stale(session: Session) -> list[str]:
    """Studies left ``running``/``awaiting_measurement`` by a killed process become ``ready``.

    Their write-ahead intent (if any) is kept, so the next step or run first completes that very query with
    the same Idempotency-Key (the curator answers with the query it already has: nothing is charged twice).
    """
    ids = repo.stale_study_ids(session)
    for study_id in ids:
        repo.set_status(session, study_id, "ready", only_if=repo.ACTIVE_STATUSES)
    return ids


def observe_cached(ctx: Context, study_id: str, entry: AuditEntry) -> None:
    """Condition the cached strategy on a just-recorded observation (O(n (t + r)), plus scheduled refits).

    If the cache is not exactly one observation behind, it is dropped and rebuilt from the DB next time.
    """
    state = ctx.cache.get(study_id)
    if state is None:
        return
    with state.lock:
        if state.strategy is not None and state.n_obs == entry.seq - 1:
            state.strategy.observe(entry.row_index, entry.y)
            state.n_obs = entry.seq
        else:
            state.strategy, state.n_obs = None, -1


def release_after_failed_step(session: Session, study_id: str) -> None:
    """A step or a run start failed: the study goes back to ``ready`` (its intent, if any, is kept)."""
    repo.set_status(session, study_id, "ready", only_if=("running",), clear_run_target=True)
