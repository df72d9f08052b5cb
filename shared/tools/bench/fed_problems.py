"""Problems and the simulation loop of ``pobo bench fed`` (DP-FTS-DE, Dai, Low & Jaillet, NeurIPS 2021).

The domain is a finite grid over the unit box (the paper's Section 2 assumes a discrete domain, footnote 3):
an agent's argmax of a sampled function phi(x)^T omega (Algorithm 2, lines 6 and 8) is then exact, one matrix
product for all agents at once, instead of ``shared.federated.maximize_rff``'s Sobol set + L-BFGS-B per agent
(which would cost ~N x rounds x configurations optimiser runs). Everything else is the shared numerics:
``draw_rff`` (shared features), ``RFFPosterior`` (eq. 2), ``split_box`` / ``round_robin`` / ``initial_points``
(DE's sub-regions and initial points, snapped to the grid), ``p_t``, ``TemperatureSchedule``,
``poisson_sample`` and ``aggregate_round`` (Algorithm 1, lines 5-11).

Problems (``GridProblem``: each agent's objective on the grid, [N, G]):

* ``make_synthetic``: f ~ GP(0, SE) sampled exactly on the grid; agent n's objective is f + eps_n with
  eps_n iid N(0, perturb^2) per grid point (Section 5.1: "different small random perturbations to the
  values of the sampled function"). Observations add N(0, noise_std^2).
* ``make_svm_shards``: scikit-learn's digits (odd vs even), shuffled and cut into N shards; agent n tunes an
  RBF SVM's (log10 C, log10 gamma) on its own shard (half train, half validation) for validation AUC. The
  AUC of every grid point is computed once (the objective is deterministic). Agents standardise their own
  observations (local; nothing about the raw AUC leaves the agent).

Regret: agent n's simple regret max_grid f_n - max_{s <= t} f_n(x_s) (noise-free values), averaged over
agents; for ``svm-shards`` the gap to the best validation AUC on the grid.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared.federated import (
    RFFPosterior,
    TemperatureSchedule,
    aggregate_round,
    clean_aggregate,
    initial_points,
    p_t,
    poisson_sample,
    round_robin,
    se_kernel,
    split_box,
)
from shared.federated.agent_step import PSchedule
from shared.federated.rff import RandomFourierFeatures

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = ["AlgConfig", "GridProblem", "make_svm_shards", "make_synthetic", "simulate"]


@dataclass(frozen=True)
class GridProblem:
    """N agents' objectives on a regular grid of ``side``^d points over [0, 1]^d."""

    side: int
    d: int
    values: FloatArray  # [N, G], G = side^d
    noise_std: float  # observation noise (0: deterministic)
    standardise: bool  # agents standardise their own observations

    @property
    def N(self) -> int:
        return int(self.values.shape[0])

    @property
    def grid(self) -> FloatArray:
        axes = np.meshgrid(*[np.linspace(0.0, 1.0, self.side)] * self.d, indexing="ij")
        return np.stack([a.ravel() for a in axes], axis=1)

    def snap(self, X: FloatArray) -> IntArray:
        """Index of the nearest grid point of each row of X [k, d]."""
        ij = np.clip(np.rint(np.asarray(X) * (self.side - 1)).astype(np.int64), 0, self.side - 1)
        flat: IntArray = np.ravel_multi_index(tuple(ij.T), (self.side,) * self.d).astype(np.int64)
        return flat


def make_synthetic(
    rng: np.random.Generator,
    *,
    N: int,
    side: int,
    d: int,
    lengthscale: float,
    perturb: float,
    noise_std: float,
) -> GridProblem:
    """A GP(0, SE(lengthscale)) sample on the grid, plus iid N(0, perturb^2) per agent and grid point."""
    prob = GridProblem(side=side, d=d, values=np.zeros((1, side**d)), noise_std=noise_std, standardise=False)
    grid = prob.grid
    K = se_kernel(grid, grid, lengthscale) + 1e-8 * np.eye(grid.shape[0])
    f = np.linalg.cholesky(K) @ rng.standard_normal(grid.shape[0])
    values = f[None, :] + perturb * rng.standard_normal((N, grid.shape[0]))
    return GridProblem(side=side, d=d, values=values, noise_std=noise_std, standardise=False)


SVM_BOX = ((-3.0, 3.0), (-4.0, 2.0))  # log10 C, log10 gamma (digits scaled to [0, 1])


def make_svm_shards(seed: int, *, N: int, side: int) -> GridProblem:
    """Validation AUC of an RBF SVM on each agent's shard of digits (odd vs even), on a side x side grid."""
    from sklearn.datasets import load_digits
    from sklearn.metrics import roc_auc_score
    from sklearn.svm import SVC

    X, y = load_digits(return_X_y=True)
    X, y = X / 16.0, (y % 2).astype(np.int64)
    order = np.random.default_rng([seed, 7001]).permutation(len(y))
    shards = np.array_split(order, N)
    prob = GridProblem(side=side, d=2, values=np.zeros((N, side * side)), noise_std=0.0, standardise=True)
    lo, hi = np.array([b[0] for b in SVM_BOX]), np.array([b[1] for b in SVM_BOX])
    params = 10.0 ** (lo + prob.grid * (hi - lo))  # [G, 2]
    for n, idx in enumerate(shards):
        tr, va = idx[: len(idx) // 2], idx[len(idx) // 2 :]
        for g, (C, gamma) in enumerate(params):
            model = SVC(C=float(C), gamma=float(gamma)).fit(X[tr], y[tr])
            prob.values[n, g] = roc_auc_score(y[va], model.decision_function(X[va]))
    return prob


@dataclass(frozen=True)
class AlgConfig:
    """One curve: ``algorithm`` in ts / fts / fts-de / dp-fts / dp-fts-de; q, z, S None without DP."""

    algorithm: str
    P: int = 1
    q: float | None = None
    z: float | None = None
    S: float | None = None

    @property
    def federated(self) -> bool:
        return self.algorithm != "ts"

    @property
    def dp(self) -> bool:
        return self.algorithm.startswith("dp-")


def _observe(prob: GridProblem, idx: IntArray, rng: np.random.Generator) -> FloatArray:
    """Noisy observations f_n(x) + N(0, noise_std^2) of agent n at grid index idx[n, k]: [N, k]."""
    v = np.take_along_axis(prob.values, idx, axis=1)
    return v + prob.noise_std * rng.standard_normal(v.shape) if prob.noise_std > 0 else v


def _targets(prob: GridProblem, y: FloatArray) -> FloatArray:
    if not prob.standardise:
        return y
    sd = float(y.std())
    z: FloatArray = (y - y.mean()) / (sd if sd > 1e-9 else 1.0)
    return z


def simulate(
    prob: GridProblem,
    cfg: AlgConfig,
    rff: RandomFourierFeatures,
    *,
    rounds: int,
    n_init: int,
    schedule: PSchedule,
    lam: float,
    temperature: TemperatureSchedule,
    rng_init: np.random.Generator,
    rng: np.random.Generator,
    on_round: Callable[[], None] | None = None,
) -> tuple[FloatArray, float]:
    """One run of ``cfg`` on ``prob``: (regret averaged over agents after init and each round [rounds + 1],
    fraction of sampled submissions that were clipped (0 without DP)).

    Round t = 1..rounds (Algorithm 2): r ~ U(0, 1); r <= p_t -> argmax of the agent's own posterior sample
    (eq. 2) on the grid; else argmax of phi(x)^T omega_{t-1}^(i[x]). After observing, every agent samples
    omega_{n,t} from its posterior (eq. 2) and the coordinator aggregates (Algorithm 1) over the frozen list;
    without DP: q = 1, no clipping (S just above the largest submission's norm, each round: the aggregate's
    exact sum snaps to a lattice relative to S, so S = inf would erase it), no noise. ``ts``: no aggregation,
    local TS every round.
    """
    N, d, M, P = prob.N, prob.d, rff.M, cfg.P
    regions = split_box(np.zeros(d), np.ones(d), P)
    assign = round_robin(N, P)
    grid = prob.grid
    Phi = rff.features(grid)  # [G, M]
    grid_region = regions.region_of(grid)  # [G]
    best_true = prob.values.max(axis=1)

    init = np.stack(
        [prob.snap(initial_points(regions, int(assign[n]), n_init, rng=rng_init)) for n in range(N)]
    )
    idx = np.zeros((N, n_init + rounds), dtype=np.int64)
    y = np.zeros((N, n_init + rounds))
    idx[:, :n_init] = init
    y[:, :n_init] = _observe(prob, init, rng_init)
    best = np.take_along_axis(prob.values, init, axis=1).max(axis=1)
    regret = [float((best_true - best).mean())]

    if cfg.dp:
        q, z, S = float(cfg.q or 1.0), float(cfg.z or 1.0), float(cfg.S or 1.0)
    else:
        q, z, S = 1.0, 1.0, math.inf  # S: per round, below

    clipped, sampled_total = 0, 0
    agg: FloatArray | None = None
    n_obs = n_init
    for t in range(rounds + 1):
        # every agent's posterior after its n_obs observations: the submission of release t - 1 ... and
        # the local TS sample of round t + 1 (two independent draws from the same eq. 2 posterior)
        omegas = np.zeros((N, 2, M))
        for n in range(N):
            post = RFFPosterior(Phi[idx[n, :n_obs]], _targets(prob, y[n, :n_obs]), lam=lam)
            omegas[n] = post.sample(rng, n_samples=2)
        if t == rounds:
            break
        if cfg.federated:  # release t (after round t's observations; t = 0: after the initial points)
            mask = poisson_sample(N, q, rng=rng) if cfg.dp else np.ones(N, dtype=np.bool_)
            subs = {int(n): omegas[n, 0] for n in np.flatnonzero(mask)}
            if cfg.dp:
                norms = np.linalg.norm(omegas[mask, 0], axis=1)
                clipped += int((norms > S / math.sqrt(P)).sum())
                sampled_total += int(mask.sum())
            if cfg.dp:  # line 11's noise, added exactly from the run's generator
                agg = aggregate_round(
                    N, subs, mask, M=M, P=P, S=S, q=q, z=z,
                    temperature=temperature.temperature(t), rng=rng, assignment=assign,
                )  # fmt: skip
            else:  # FTS / FTS-DE: the same aggregate without noise, and without clipping
                unclipped = 2.0 * math.sqrt(P) * float(np.linalg.norm(omegas[:, 0], axis=1).max())
                agg = clean_aggregate(
                    N, subs, mask, M=M, P=P, S=max(unclipped, 1e-300), q=q,
                    temperature=temperature.temperature(t), assignment=assign,
                )[0]  # fmt: skip
        # round t + 1: choose, observe
        pt = p_t(t + 1, schedule)
        local = (rng.random(N) <= pt) if cfg.federated else np.ones(N, dtype=np.bool_)
        choice = np.empty(N, dtype=np.int64)
        if local.any():
            choice[local] = np.argmax(omegas[local, 1] @ Phi.T, axis=1)
        if (~local).any():
            assert agg is not None  # noqa: S101 - federated rounds always have an aggregate
            choice[~local] = int(np.argmax(np.einsum("gm,gm->g", Phi, agg[grid_region])))
        idx[:, n_obs] = choice
        y[:, n_obs] = _observe(prob, choice[:, None], rng)[:, 0]
        n_obs += 1
        best = np.maximum(best, prob.values[np.arange(N), choice])
        regret.append(float((best_true - best).mean()))
        if on_round:
            on_round()
    return np.asarray(regret), (clipped / sampled_total if sampled_total else 0.0)
