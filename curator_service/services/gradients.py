"""Private gradient oracles (DP-GIBO): create (admin; charges mu-GDP), read, step (granted partner).

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 lines 5-8 and Lemma 3.1: T steps whose
gradients are clipped to norm B, averaged over the n rows and given Gaussian noise of std 2 B sqrt(T)/(n mu)
are mu-GDP together (replace-one neighbours). The whole T-step cost is converted to (epsilon, delta) at the
oracle's delta (``shared.privacy.gdp.gdp_epsilon``, the closed form of Dong, Roth & Su 2019, Cor. 2.13,
which agrees with dp-accounting's PLD under add-or-remove; plus the Gaussian sampler's margins:
``shared.bo.gibo.private_gradient.oracle_epsilon``) and charged to the population's ledger when the
oracle is created; steps cost nothing more.

What keeps the guarantee here (each point is a test in tests/curator_service/test_gradient_oracles.py):

* the oracle reads the stored columns of a dataset whose scaling is ``none`` or curator-declared scales;
  ``max_norm`` datasets are refused (their factor is computed from every row, so no row stands alone);
* a plug-in loss (operator settings only) must pass the row-independence check on the dataset's rows;
* every non-data input of a step (theta, points, kernel, jitter) is validated against the oracle's public
  bounds before any row is read, and the GP's weights are computed before the loss
  (``shared.bo.gibo.oracle.oracle_gradient``); a row whose loss or gradient is not finite counts as 0;
* a step reads, computes and records under the oracle's row lock, so the step counter is exact under
  concurrency; a replay of an Idempotency-Key returns the stored gradient; the answer is
  ``{step, gradient, steps_left}`` only;
* the noise is added exactly (the clean average snapped to a public lattice, integer noise:
  ``shared.privacy.lattice``), drawn from a fresh AES-CTR generator keyed from the OS.

With the setting ``backend = "dask"`` a step's per-row part (losses, gradients, clipping, the exact sum) runs
on the curator's Dask cluster in blocks of rows (``shared.distributed.gradients.oracle_gradient_dask``): the
same answer, bit for bit, as the local oracle; the noise is added here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from curator_service import gradient_repository as grepo
from curator_service import repository as repo
from curator_service.db import Database
from curator_service.exceptions import Conflict, Gone, InvalidInput, NotFound
from curator_service.models import Dataset, GradientOracle, GradientStep, LedgerEntry
from curator_service.services.auth import Principal
from curator_service.services.datasets import get_dataset, live_dataset
from curator_service.services.gradient_losses import check_loss, loss_factory_of, loss_matrix_of
from curator_service.services.releases import (
    LOCAL,
    ComputeBackend,
    budget_label,
    check_total_delta,
    fits,
)
from curator_service.storage import ArrayStore
from shared.bo.gibo.kernels import GradKernel
from shared.bo.gibo.oracle import (
    check_step,
    kernel_from_spec,
    oracle_gradient,
)
from shared.bo.gibo.private_gradient import noise_std, oracle_epsilon, oracle_margins
from shared.protocol.schemas import GradientOracleCreate, GradientOraclePublic, GradientStepCreate
from shared.protocol.schemas.gradients import MAX_DESIGN_POINTS

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------- creation


def planned_charge(
    db: Database,
    store: ArrayStore,
    dataset_id: int,
    body: GradientOracleCreate,
    plugins: Mapping[str, str],
) -> tuple[float, float, Dataset]:
    """(epsilon the population would be charged, the noise std per coordinate, the dataset) of an oracle
    with ``body``, refused (422) as ``create_oracle`` would refuse it; nothing is written (the console's
    confirmation page shows it before the oracle is made)."""
    with db.session(write=False) as session:
        dataset = live_dataset(session, dataset_id)
        session.expunge(dataset)
    check_loss(store, dataset, body, plugins)
    rows = max(1, int(dataset.rows_per_person or 1))
    charged = oracle_epsilon(body.mu, body.delta, body.steps, body.dimension, rows=rows)
    return charged, noise_std(body.clip, body.steps, dataset.n, body.mu, body.dimension), dataset


def create_oracle(
    db: Database,
    store: ArrayStore,
    dataset_id: int,
    body: GradientOracleCreate,
    plugins: Mapping[str, str],
) -> GradientOracle:
    """Check the loss and the dataset, then in one transaction check-and-spend the budget and store it."""
    with db.session(write=False) as session:
        dataset = live_dataset(session, dataset_id)
        session.expunge(dataset)
    check_loss(store, dataset, body, plugins)
    # a person with k rows replaces k rows: the clipped average moves k times as far, so the T steps are
    # (k mu)-GDP for the person (group privacy; Dong, Roth & Su 2022, Theorem 2.7); both with the sampler's
    # margins (``oracle_epsilon``)
    rows = max(1, int(dataset.rows_per_person or 1))
    epsilon = oracle_epsilon(body.mu, body.delta, body.steps, body.dimension)
    charged = oracle_epsilon(body.mu, body.delta, body.steps, body.dimension, rows=rows)
    margins = oracle_margins(body.mu, body.delta, body.steps, body.dimension, rows=rows)
    with db.session(write=True) as session:
        population_id = live_dataset(session, dataset_id).population_id
        population = repo.lock_population(session, population_id)  # the erasure takes this lock too
        assert population is not None
        session.expire_all()  # read the dataset again under the lock: erased meanwhile is a 410
        dataset = live_dataset(session, dataset_id)
        eps_spent, delta_spent = repo.ledger_totals(session, population.id)
        for name, spent, asked, budget in (
            ("epsilon", eps_spent, charged, population.epsilon_budget),
            ("delta", delta_spent, body.delta, population.delta_budget),
        ):
            if not fits(spent, asked, budget):
                raise Conflict(
                    f"privacy budget exceeded: this oracle (mu = {body.mu:g} over {body.steps} steps) needs "
                    f"{name}={asked:g} but {budget_label(session, population)} has {name} "
                    f"{max(0.0, budget - spent):g} left (budget {budget:g}, spent {spent:g}); nothing was "
                    "created"
                )
        check_total_delta(session, population, delta_spent, body.delta, allow_large_delta=False)
        oracle = GradientOracle(
            dataset_id=dataset.id,
            loss=body.loss,
            loss_params={
                "intercept": body.intercept,
                "delta_huber": body.delta_huber,
                "weight_clip": body.weight_clip,
            },
            dimension=body.dimension,
            bounds=[[float(lo), float(hi)] for lo, hi in body.bounds],
            clip=body.clip,
            mu=body.mu,
            steps=body.steps,
            steps_used=0,
            epsilon=epsilon,
            delta=body.delta,
            n=dataset.n,
        )
        repo.add(session, oracle)
        entry = LedgerEntry(
            population_id=population.id,
            dataset_id=dataset.id,
            gradient_oracle_id=oracle.id,
            mechanism="dp-gibo",
            epsilon=charged,
            nominal_epsilon=epsilon,
            delta=body.delta,
            native={
                "kind": "gdp",
                "mu": rows * body.mu,
                "steps": body.steps,
                "clip": body.clip,
                "rows_per_person": rows,
                # the sampler's margins of the charged claim, folded into the ledger's composition
                "epsilon_margin": margins.epsilon,
                "delta_margin": margins.delta,
            },
            status="spent",
        )
        repo.add(session, entry)
        session.commit()
        return oracle


# ---------------------------------------------------------------------------------------------- reading


def get_oracle(session: Session, principal: Principal, oracle_id: int) -> GradientOracle:
    """The oracle, if the principal may read it (a partner gets the same 404 for "not granted")."""
    oracle = grepo.get_oracle(session, oracle_id)
    if oracle is not None and not principal.is_admin:
        assert principal.partner_id is not None
        if not grepo.has_oracle_grant(session, principal.partner_id, oracle_id):
            oracle = None
    if oracle is None:
        raise NotFound(f"gradient oracle {oracle_id} does not exist")
    if oracle.erased_at is not None and not principal.is_admin:
        raise Gone(f"gradient oracle {oracle_id} was erased: its dataset was erased by the curator")
    return oracle


def list_oracles(
    session: Session, principal: Principal, dataset_id: int | None = None
) -> Sequence[GradientOracle]:
    if principal.is_admin:
        if dataset_id is not None:
            get_dataset(session, dataset_id)
        return grepo.list_oracles(session, dataset_id=dataset_id)
    assert principal.partner_id is not None
    return grepo.list_oracles(session, ids=grepo.granted_oracle_ids(session, principal.partner_id))


def list_steps(session: Session, principal: Principal, oracle_id: int) -> Sequence[GradientStep]:
    get_oracle(session, principal, oracle_id)
    return grepo.steps(session, oracle_id, None if principal.is_admin else principal.partner_id)


def oracle_public(o: GradientOracle) -> GradientOraclePublic:
    params = o.loss_params or {}
    return GradientOraclePublic(
        id=o.id,
        dataset_id=o.dataset_id,
        loss=o.loss,
        dimension=o.dimension,
        bounds=[list(map(float, b)) for b in o.bounds],
        clip=o.clip,
        mu=o.mu,
        steps=o.steps,
        steps_used=o.steps_used,
        steps_left=o.steps - o.steps_used,
        epsilon=o.epsilon,
        delta=o.delta,
        mu_spent=o.mu * math.sqrt(o.steps_used / o.steps),
        n=o.n,
        noise_std=noise_std(o.clip, o.steps, o.n, o.mu, o.dimension),
        intercept=bool(params.get("intercept")),
        delta_huber=params.get("delta_huber"),
        weight_clip=params.get("weight_clip"),
        created_at=o.created_at,
    )


# ------------------------------------------------------------------------------------------------- steps


def request_digest(body: GradientStepCreate) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replay(existing: GradientStep, digest: str, oracle_id: int) -> GradientStep:
    if existing.request_sha256 != digest:
        raise Conflict(
            f"this Idempotency-Key was used for step {existing.step} of gradient oracle {oracle_id} with "
            "other inputs; a retry must send the same body (or use a new key for a new step)"
        )
    return existing


def _validate(oracle: GradientOracle, body: GradientStepCreate) -> GradKernel:
    """Every non-data input, checked before a row is read (422 on failure); returns the step's kernel."""
    kernel = kernel_from_spec(body.kernel.spec())
    if len(body.theta) != oracle.dimension:
        raise InvalidInput(f"theta must have {oracle.dimension} entries (the oracle's dimension)")
    if any(len(p) != oracle.dimension for p in body.points):
        raise InvalidInput(f"every point must have {oracle.dimension} entries (the oracle's dimension)")
    points = body.points or [body.theta]  # checks theta alone when no point is new
    check_step(body.theta, points, oracle.bounds)
    return kernel


def step(
    db: Database,
    store: ArrayStore,
    principal: Principal,
    oracle_id: int,
    body: GradientStepCreate,
    idempotency_key: str | None,
    plugins: Mapping[str, str],
    backend: ComputeBackend = LOCAL,
) -> tuple[GradientStep, int, bool]:
    """One private gradient: (the step record, steps left, replayed?); its rows' part here or on the Dask
    cluster (``backend``)."""
    assert principal.partner_id is not None
    digest = request_digest(body)
    with db.session(write=False) as session:
        oracle = get_oracle(session, principal, oracle_id)
        if idempotency_key is not None:
            existing = grepo.step_by_key(session, oracle_id, principal.partner_id, idempotency_key)
            if existing is not None:
                return _replay(existing, digest, oracle_id), oracle.steps - existing.step, True
        kernel = _validate(oracle, body)
        dataset = live_dataset(session, oracle.dataset_id)
        if backend.kind == "local":
            loss_matrix, width = loss_matrix_of(oracle, store, dataset, plugins)
        else:
            factory, X, y, width = loss_factory_of(oracle, store, dataset, plugins)
    with db.session(write=True) as session:
        locked = grepo.lock_oracle(session, oracle_id)  # steps of one oracle run one at a time
        assert locked is not None
        oracle = locked
        if oracle.erased_at is not None:  # erased while the step was computed
            raise Gone(f"gradient oracle {oracle_id} was erased: its dataset was erased by the curator")
        if idempotency_key is not None:  # a concurrent retry may have answered it meanwhile
            existing = grepo.step_by_key(session, oracle_id, principal.partner_id, idempotency_key)
            if existing is not None:
                return _replay(existing, digest, oracle_id), oracle.steps - existing.step, True
        if oracle.steps_used >= oracle.steps:
            raise Conflict(
                f"gradient oracle {oracle_id} has answered all of its {oracle.steps} steps (its mu-GDP "
                "budget is spent); ask the curator for a new oracle"
            )
        previous = [p for batch in grepo.design_points(session, oracle_id) for p in batch]
        design = previous + [list(p) for p in body.points]
        if not design:
            raise InvalidInput("the first step must send at least one design point (points is empty)")
        if len(design) > MAX_DESIGN_POINTS:
            raise InvalidInput(
                f"the design would hold {len(design)} points; an oracle's design holds at most "
                f"{MAX_DESIGN_POINTS}"
            )
        common: dict[str, Any] = {
            "n": oracle.n,
            "row_width": width,
            "theta": body.theta,
            "design": design,
            "bounds": oracle.bounds,
            "kernel": kernel,
            "clip": oracle.clip,
            "steps": oracle.steps,
            "mu": oracle.mu,
            "noise_var": body.noise_var,
            "jitter": body.jitter,
        }
        if backend.kind == "local":
            gradient = oracle_gradient(loss_matrix, **common)
        else:
            from shared.distributed.gradients import oracle_gradient_dask

            gradient = oracle_gradient_dask(factory, X, y, client=backend.client(), **common)
        number = grepo.take_step(session, oracle_id)
        if number is None:  # pragma: no cover - the row lock makes the check above exact
            raise Conflict(f"gradient oracle {oracle_id} has answered all of its {oracle.steps} steps")
        record = GradientStep(
            oracle_id=oracle_id,
            step=number,
            partner_id=principal.partner_id,
            idempotency_key=idempotency_key,
            request_sha256=digest,
            theta=[float(v) for v in body.theta],
            points=[[float(v) for v in p] for p in body.points],
            kernel=body.kernel.spec(),
            noise_var=body.noise_var,
            jitter=body.jitter,
            gradient=[float(v) for v in gradient],
        )
        repo.add(session, record)
        session.commit()
        return record, oracle.steps - number, False
