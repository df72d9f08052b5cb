"""One agent's step of DP-FTS-DE (Algorithm 2): initial points, then local TS or the published aggregates.

Paper: DP-FTS-DE (Dai, Low & Jaillet, NeurIPS 2021), Algorithm 2 and Section 3.3:

* t = 0 (line 2): N_init points drawn uniformly at random from the agent's assigned sub-region X_{i_n}.
* t >= 1 (lines 4-8): r ~ U(0, 1); if r <= p_t, local TS: x_t = argmax_x phi(x)^T omega with omega from
  the agent's own posterior (eq. 2, optionally scaled by beta, line 6); otherwise
  x_t = argmax_x phi(x)^T omega_{t-1}^(i[x]): each sub-region's published aggregate on its own cell (line 8).
* line 10: after observing y_t, sample omega_{n,t} (eq. 2) and submit it (``agent_submission``).

p_t schedules (Section 5): 1 - p_t = 1/sqrt(t) (synthetic), 1 - p_t = 1/t (real data), or a constant.
The agent's own TS uses the same shared features (the RFF approximation of the GP posterior, eq. 2).

Argmax over a continuous box: a scrambled Sobol set of ``n_candidates`` points (scipy.stats.qmc) scored in
one matrix product, then L-BFGS-B from the ``n_starts`` best, each kept inside its own sub-region's cell
(where the objective phi(x)^T omega^(i) is smooth, with the analytic gradient). The best candidate is always
among the answers, so refinement never returns a worse point.

Notation (shapes in brackets)::

    X [t, d], y [t]   the agent's own queries and observations (they never leave the agent)
    omegas  [P, M]    the published omega_{t-1}^joint;  regions  the P cells X_1..X_P of the box
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError
from shared.federated.posterior import RFFPosterior
from shared.federated.regions import Regions, split_box
from shared.federated.rff import RandomFourierFeatures

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "AgentChoice",
    "PSchedule",
    "agent_submission",
    "choose_query",
    "initial_points",
    "maximize_rff",
    "p_t",
]

PSchedule = Literal["inv_sqrt", "inv", "constant"]


def p_t(t: int, schedule: PSchedule = "inv_sqrt", *, constant: float | None = None) -> float:
    """Probability of local TS in round t >= 1: 1 - 1/sqrt(t), 1 - 1/t or ``constant`` (Section 5).

    The paper's schedules give p_1 = 0 (round 1 always uses the aggregates); the authors' code uses
    1 - 1/(t + 1), i.e. ``p_t(t + 1, "inv")``.
    """
    if isinstance(t, bool) or not isinstance(t, int | np.integer) or t < 1:
        raise InputDataError(f"round t must be an integer >= 1, got {t!r}")
    if schedule == "inv_sqrt":
        return 1.0 - 1.0 / math.sqrt(int(t))
    if schedule == "inv":
        return 1.0 - 1.0 / int(t)
    if schedule == "constant":
        if constant is None or not (math.isfinite(constant) and 0.0 <= constant <= 1.0):
            raise InputDataError(f"a constant p_t must be in [0, 1], got {constant!r}")
        return float(constant)
    raise InputDataError(f"schedule must be 'inv_sqrt', 'inv' or 'constant', got {schedule!r}")


def initial_points(regions: Regions, region: int, n_init: int, *, rng: np.random.Generator) -> FloatArray:
    """N_init points uniform in the assigned sub-region X_{i_n} (Algorithm 2, line 2), shape [n_init, d]."""
    if isinstance(region, bool) or not isinstance(region, int | np.integer) or not 0 <= region < regions.P:
        raise InputDataError(f"region must be an integer in [0, {regions.P}), got {region!r}")
    if isinstance(n_init, bool) or not isinstance(n_init, int | np.integer) or n_init < 1:
        raise InputDataError(f"n_init must be an integer >= 1, got {n_init!r}")
    lo, hi = regions.lo[int(region)], regions.hi[int(region)]
    pts: FloatArray = lo + rng.random((int(n_init), regions.d)) * (hi - lo)
    return pts


def maximize_rff(
    rff: RandomFourierFeatures,
    omegas: npt.ArrayLike,
    regions: Regions,
    *,
    rng: np.random.Generator,
    n_candidates: int = 2048,
    n_starts: int = 5,
) -> tuple[FloatArray, float]:
    """argmax over the box of g(x) = phi(x)^T omega^(i[x]) (Algorithm 2, line 8; line 6 with P = 1).

    ``omegas`` is [P, M] with P = ``regions.P`` (or [M] when P = 1). Returns (x [d], g(x)).
    """
    Om = np.atleast_2d(np.asarray(omegas, dtype=np.float64))
    if Om.shape != (regions.P, rff.M):
        raise InputDataError(f"omegas must have shape ({regions.P}, {rff.M}), got shape {Om.shape}")
    if not np.isfinite(Om).all():
        raise InputDataError("omegas must be finite")
    if regions.d != rff.d:
        raise InputDataError(f"regions have dimension {regions.d} but the features {rff.d}")
    if n_candidates < 1 or n_starts < 0:
        raise InputDataError(f"need n_candidates >= 1 and n_starts >= 0, got {n_candidates}, {n_starts}")

    m = max(0, math.ceil(math.log2(n_candidates)))
    from scipy.stats import qmc

    sobol = qmc.Sobol(d=rff.d, scramble=True, seed=rng)
    C = regions.lower + sobol.random_base2(m) * (regions.upper - regions.lower)  # [2^m, d]
    reg = regions.region_of(C)
    values = np.einsum("km,km->k", rff.features(C), Om[reg])  # g at every candidate, [2^m]

    order = np.argsort(-values)
    best_x, best_v = C[order[0]].copy(), float(values[order[0]])
    lo, hi = regions.lo, regions.hi
    from scipy.optimize import minimize  # (scipy.optimize and scipy.stats: imported when first used)

    for k in order[:n_starts]:
        i = int(reg[k])

        def neg(x: FloatArray, i: int = i) -> tuple[float, FloatArray]:
            v, g = rff.value_and_grad(x, Om[i])
            return -v, -g

        res = minimize(neg, C[k], jac=True, method="L-BFGS-B", bounds=list(zip(lo[i], hi[i], strict=True)))
        x = np.clip(np.asarray(res.x, dtype=np.float64), lo[i], hi[i])
        j = int(regions.region_of(x)[0])  # a point on a cell's upper face belongs to the next cell
        v = float(rff.features(x)[0] @ Om[j])
        if v > best_v:
            best_x, best_v = x, v
    return best_x, best_v


@dataclass(frozen=True)
class AgentChoice:
    """The query of round t and how it was chosen (``source``: "local" line 6, "aggregate" line 8)."""

    x: FloatArray
    source: Literal["local", "aggregate"]
    p_t: float
    r: float


def choose_query(
    t: int,
    rff: RandomFourierFeatures,
    X: npt.ArrayLike,
    y: npt.ArrayLike,
    aggregates: npt.ArrayLike | None,
    regions: Regions,
    *,
    rng: np.random.Generator,
    schedule: PSchedule = "inv_sqrt",
    constant: float | None = None,
    lam: float = 1.0,
    beta: float = 1.0,
    n_candidates: int = 2048,
    n_starts: int = 5,
) -> AgentChoice:
    """x_t for round t >= 1 (Algorithm 2, lines 4-8).

    r ~ U(0, 1); if r <= p_t (or no aggregate has been published yet: ``aggregates`` None) the agent
    maximises phi(x)^T omega, omega ~ N(nu_t, beta^2 lambda Sigma_t^{-1}) from its own (X, y) (line 6);
    else it maximises phi(x)^T omega_{t-1}^(i[x]) with ``aggregates`` [P, M] over ``regions`` (line 8).
    """
    pt = p_t(t, schedule, constant=constant)
    r = float(rng.random())
    whole = split_box(regions.lower, regions.upper, 1)
    if aggregates is None or r <= pt:
        Xa = np.asarray(X, dtype=np.float64).reshape(-1, rff.d)
        omega = RFFPosterior(rff.features(Xa) if Xa.size else np.zeros((0, rff.M)), y, lam=lam).sample(
            rng, beta=beta
        )
        x, _ = maximize_rff(rff, omega[None, :], whole, rng=rng, n_candidates=n_candidates, n_starts=n_starts)
        return AgentChoice(x=x, source="local", p_t=pt, r=r)
    x, _ = maximize_rff(rff, aggregates, regions, rng=rng, n_candidates=n_candidates, n_starts=n_starts)
    return AgentChoice(x=x, source="aggregate", p_t=pt, r=r)


def agent_submission(
    rff: RandomFourierFeatures,
    X: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    rng: np.random.Generator,
    lam: float = 1.0,
) -> FloatArray:
    """omega_{n,t} ~ N(nu_t, lambda Sigma_t^{-1}) (eq. 2) from the agent's own history: what it submits to
    the coordinator (Algorithm 2, line 10). Shape [M]."""
    Xa = np.asarray(X, dtype=np.float64).reshape(-1, rff.d)
    Phi = rff.features(Xa) if Xa.size else np.zeros((0, rff.M))
    return RFFPosterior(Phi, y, lam=lam).sample(rng)
