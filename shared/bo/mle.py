"""Type-II maximum likelihood for the GP's hyper-parameters (Rasmussen & Williams, *Gaussian Processes for
Machine Learning*, 2006, eq. 2.30 and eq. 5.9: the log marginal likelihood and its gradient), fitted with
scipy.optimize's L-BFGS-B. Split from ``shared.bo.gp``, which holds the incremental posterior.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import numpy.typing as npt
from scipy.linalg import cho_factor, cho_solve

from shared.bo.gp import DEFAULT_JITTER, FloatArray, Hyperparameters, median_distance
from shared.bo.kernels import se_from_sqdist

__all__ = ["fit_hyperparameters"]


def _neg_log_marginal_likelihood(
    theta: FloatArray, D2: FloatArray, y: FloatArray, jitter: float
) -> tuple[float, FloatArray]:
    """-log p(y | theta) and its gradient in theta = (ln l, ln s2, ln noise) (GPML eqs. 2.30, 5.9)."""
    ell, s2, sn2 = np.exp(theta)
    t = y.size
    E = se_from_sqdist(D2, sq_scale=ell**2)  # the SE kernel at unit variance (GPML eq. 2.16)
    K = s2 * E + (sn2 + jitter) * np.eye(t)
    try:
        c = cho_factor(K, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return 1e25, np.zeros(3)
    alpha = cho_solve(c, y, check_finite=False)
    logdet = 2.0 * np.log(np.diag(c[0])).sum()
    nll = 0.5 * float(y @ alpha) + 0.5 * logdet + 0.5 * t * math.log(2 * math.pi)
    W = np.outer(alpha, alpha) - cho_solve(c, np.eye(t), check_finite=False)
    dK = [s2 * E * D2 / ell**2, s2 * E, sn2 * np.eye(t)]  # dK/d ln(param)
    grad = np.array([-0.5 * float(np.einsum("ij,ji->", W, g)) for g in dK])
    return nll, grad


def fit_hyperparameters(
    Z: FloatArray,
    idx: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    initial: Hyperparameters | None = None,
    jitter: float = DEFAULT_JITTER,
    restarts: int = 4,
    distance_scale: float | None = None,
    noise_floor: float | None = None,
) -> Hyperparameters:
    """Type-II maximum likelihood for (lengthscale, signal variance, noise variance), isotropic.

    L-BFGS-B (scipy.optimize) over the log-parameters with analytic gradients, within bounds relative to
    the data: lengthscale in [0.05, 20] x the median pairwise distance of Z, signal variance in
    [1e-3, 1e3] x var(y), noise variance in [1e-6, 1] x var(y). ``noise_floor`` (a known part of the
    observation noise's variance, e.g. the curator's output mechanism's) raises the noise's lower bound to
    it (and the upper to at least it).

    Deterministic starts, so the result is a function of the data alone (rebuildable state): ``initial``
    (default: the data's own scale, lengthscale the median distance, signal variance var(y), noise 1 % of
    var(y)) with its lengthscale x {1, 1/4, 4}, then the same lengthscale with var(y) split evenly between
    signal and noise (``restarts`` of them, in that order). The even split matters when the rows are far
    apart for the lengthscale: there every split of signal and noise explains the data equally, and a fit
    started with little noise stays on that ridge (all signal; an uninformed posterior mean).
    ``y`` is expected already centred if a constant mean is used. ``distance_scale`` (the median pairwise
    distance of Z) may be passed in to skip recomputing it.
    """
    Zi = np.asarray(Z, dtype=np.float64)[np.asarray(idx, dtype=np.int64)]
    y = np.asarray(y, dtype=np.float64)
    med = distance_scale if distance_scale is not None else median_distance(np.asarray(Z, dtype=np.float64))
    var_y = float(np.var(y)) if y.size > 1 and np.var(y) > 0 else 1.0
    sq = (Zi * Zi).sum(1)
    D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * Zi @ Zi.T, 0.0)
    floor = float(noise_floor) if noise_floor is not None and noise_floor > 0 else 0.0
    bounds = [
        (math.log(5e-2 * med), math.log(2e1 * med)),
        (math.log(1e-3 * var_y), math.log(1e3 * var_y)),
        (math.log(max(1e-6 * var_y, floor)), math.log(max(var_y, floor))),
    ]
    if initial is None:
        initial = Hyperparameters(lengthscale=med, signal_variance=var_y, noise_variance=1e-2 * var_y)
    ls0 = float(np.mean(np.atleast_1d(initial.lengthscale)))
    s0, n0 = math.log(initial.signal_variance), math.log(initial.noise_variance)
    starts = [np.array([math.log(ls0 * f), s0, n0]) for f in (1.0, 0.25, 4.0)]
    starts.append(np.array([math.log(ls0), math.log(0.5 * var_y), math.log(0.5 * var_y)]))
    starts = starts[: max(1, restarts)]
    best: tuple[float, FloatArray] | None = None
    from scipy.optimize import minimize  # (imported when first used: a service starts without it)

    for x0 in starts:
        x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
        res = minimize(
            _neg_log_marginal_likelihood,
            x0,
            args=(D2, y, jitter),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
        )
        if np.isfinite(res.fun) and (best is None or res.fun < best[0]):
            best = (float(res.fun), res.x)
    theta = best[1] if best is not None else starts[0]
    ell, s2, sn2 = np.exp(theta)
    return replace(initial, lengthscale=float(ell), signal_variance=float(s2), noise_variance=float(sn2))
