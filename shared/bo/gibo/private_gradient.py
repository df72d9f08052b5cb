"""The privatised surrogate gradient of DP-GIBO: per-user gradients, clipping, averaging, Gaussian noise.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 lines 6-8 and Lemma 3.1 (proof in App. B:
sensitivity of the clipped average is 2B/n; noise 2B sqrt(T)/(n mu) per step makes each step
mu/sqrt(T)-GDP and the T-fold composition mu-GDP, Corollary 2.5).

Notation (shapes in brackets)::

    n        number of users;  m design points;  d dimension
    L        [m, n]  loss matrix: L[j, i] = L(D_j, x_i), loss of design point j on user i's record
    W        [d, m]  grad k(theta, D) K(D, D)^{-1}  (gp.GradientGP.grad_weights)
    G        [n, d]  per-user posterior-mean gradients, row i = g^(i) = W L[:, i]   (line 6)
                     = L^T W^T: ONE matrix product; a non-finite row (from a NaN / inf loss) is set to 0
    Pi_B(g)  = g min(1, B / |g|)                                                    (line 7)
    g_bar    [d] = (1/n) sum_i Pi_B(g^(i)), summed exactly (``shared.privacy.lattice.exact_sum``)
    sigma    = 2 B sqrt(T) / (n mu)  (x (1 + g sqrt(d) n / 2B) <= 1 + 2^-20)          (line 8, Lemma 3.1)
    released = g_bar + N(0, sigma^2 I_d), added EXACTLY (``shared.privacy.lattice``)

Noise, exactly. Line 8's sum is never computed in floating point (``g_bar + z`` would leak g_bar through the
low-order bits of the result: Jin et al., IEEE S&P 2022). ``step_mechanism`` is the exact Gaussian mechanism
with sensitivity 2B/n (replace one user: Lemma 3.1), noise multiplier sqrt(T)/mu and a lattice of step
2^k <= 2^-20 (2B/n) / sqrt(d): g_bar is snapped to the lattice, integer noise is added, and the lattice's
rounding (<= 2^k sqrt(d) in L2) is added to the sensitivity, so sigma grows by at most 2^-20 of itself and
each step stays exactly mu/sqrt(T)-GDP. The noise comes from ``rng`` (production: ``os_entropy_rng()``,
AES-CTR keyed from the OS; tests and benchmarks pass a seeded generator). ``mu = inf`` means no privacy:
sigma = 0 and the clean average is returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.losses import TINY_DIFFERENCE, flush_tiny
from shared.errors import InputDataError
from shared.privacy.gdp import gdp_epsilon
from shared.privacy.lattice import (
    LatticeGaussian,
    SamplerMargins,
    add_lattice_noise,
    check_sampler_margins,
    exact_sum,
    lattice_gaussian,
    sum_slack,
)
from shared.privacy.rng import os_entropy_rng

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "PrivateGradientDiagnostics",
    "clip_rows",
    "noise_std",
    "oracle_epsilon",
    "oracle_margins",
    "per_user_gradients",
    "private_gradient",
    "private_gradient_diagnostics",
    "step_mechanism",
]


def _check(B: float, T: int, n: int, mu: float) -> None:
    if not (math.isfinite(B) and B > 0):
        raise InputDataError(f"clipping bound B must be a finite number > 0, got {B!r}")
    if not isinstance(T, int | np.integer) or isinstance(T, bool) or T < 1:
        raise InputDataError(f"T (number of iterations) must be an integer >= 1, got {T!r}")
    if not isinstance(n, int | np.integer) or n < 1:
        raise InputDataError(f"n (number of users) must be an integer >= 1, got {n!r}")
    if math.isnan(mu) or mu <= 0:
        raise InputDataError(f"mu (GDP parameter) must be > 0 (inf for no privacy), got {mu!r}")


def step_mechanism(B: float, T: int, n: int, mu: float, d: int) -> LatticeGaussian | None:
    """The exact Gaussian mechanism of one step (None for mu = inf): sensitivity 2B/n of the clipped average
    (replace one user, Lemma 3.1) plus what its exact summation adds (``sum_slack``: ~2^-37 of it), noise
    multiplier sqrt(T)/mu, d entries, each of |value| <= B."""
    _check(B, T, n, mu)
    if math.isinf(mu):
        return None
    sensitivity = 2.0 * B / n + sum_slack(n, B, d, mean=True)
    return lattice_gaussian(sensitivity, math.sqrt(T) / mu, d, value_bound=B)


def oracle_epsilon(mu: float, delta: float, T: int, d: int, *, rows: int = 1) -> float:
    """The epsilon at ``delta`` of the T steps for one person of ``rows`` rows: they are (rows mu)-GDP
    (Lemma 3.1; group privacy for Gaussian noise: k rows move the clipped average k times as far), converted
    by ``gdp_epsilon`` (Dong, Roth & Su 2019, Cor. 2.13), plus the sampler's margins on T draws of d entries
    (``shared.privacy.lattice.sampler_margins``; InputDataError when they would take half of the claim)."""
    k = max(1, int(rows))
    if math.isinf(mu):
        return math.inf
    margins = oracle_margins(mu, delta, T, d, rows=k)
    return gdp_epsilon(k * mu, margins.ideal_delta(delta)) + margins.epsilon


def oracle_margins(mu: float, delta: float, T: int, d: int, *, rows: int = 1) -> SamplerMargins:
    """The sampler's margins in ``oracle_epsilon``'s claim (T draws of d entries; the ledger keeps them)."""
    k = max(1, int(rows))
    return check_sampler_margins(gdp_epsilon(k * mu, delta), delta, d, math.sqrt(T) / (k * mu), draws=T)


def noise_std(B: float, T: int, n: int, mu: float, d: int = 1) -> float:
    """sigma of one step: 2 B sqrt(T) / (n mu) (Alg. 1 line 8) with the lattice's term; 0 for mu = inf."""
    mechanism = step_mechanism(B, T, n, mu, d)
    return 0.0 if mechanism is None else mechanism.sigma


def per_user_gradients(W: npt.ArrayLike, L: npt.ArrayLike) -> FloatArray:
    """G = L^T W^T [n, d] in one product (Alg. 1 line 6); rows that are not finite become 0."""
    return _per_user_gradients(W, L)[0]


def _per_user_gradients(W: npt.ArrayLike, L: npt.ArrayLike) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    w = np.asarray(W, dtype=np.float64)
    loss = np.asarray(L, dtype=np.float64)
    if w.ndim != 2 or loss.ndim != 2 or loss.shape[0] != w.shape[1]:
        raise InputDataError(
            f"need W [d, m] and the loss matrix L [m, n] with the same m, got W {w.shape} and L {loss.shape}"
        )
    if not np.isfinite(w).all():
        raise InputDataError("the gradient weights W are not finite; check theta, the design and the kernel")
    # no product underflows (a subnormal's time would show which rows are tiny: ``shared.bo.gibo.losses``):
    # |L| >= 2^-500 and |W| >= 2^-400 or 0, so every |L W| >= 2^-900
    loss, w = flush_tiny(loss, TINY_DIFFERENCE), flush_tiny(w)
    with np.errstate(invalid="ignore", over="ignore"):
        G: FloatArray = loss.T @ w.T
    bad: npt.NDArray[np.bool_] = np.asarray(~np.isfinite(G).all(axis=1))
    G[bad] = 0.0
    return G, bad


def clip_rows(G: FloatArray, B: float) -> FloatArray:
    """Row-wise Pi_B(g) = g min(1, B / |g|) (Alg. 1 line 7); zero rows stay zero."""
    # the norm of a row with entries near 1e308 would overflow: scale by its largest entry first; entries
    # below 2^-500 of it are flushed first (they move the norm by < 2^-1000 of itself), so that no ratio or
    # square underflows (timing: ``shared.bo.gibo.losses``)
    peak = np.max(np.abs(G), axis=1) if G.shape[1] else np.zeros(G.shape[0])
    G = np.where(np.frexp(G)[1] < np.frexp(peak)[1][:, None] - 500, 0.0, G)
    safe = np.where(peak > 0, peak, 1.0)
    norms = peak * np.linalg.norm(G / safe[:, None], axis=1)
    with np.errstate(over="ignore"):
        scale = np.minimum(1.0, B / np.maximum(norms, 1e-300))
    out: FloatArray = G * scale[:, None]
    return out


@dataclass(frozen=True)
class PrivateGradientDiagnostics:
    """For tests and benchmarks only (contains per-user quantities; never release)."""

    G: FloatArray  # [n, d] per-user gradients (non-finite rows zeroed)
    G_clipped: FloatArray  # [n, d]
    n_nonfinite: int
    clean_average: FloatArray  # [d]
    sigma: float
    released: FloatArray  # [d]


def private_gradient_diagnostics(
    W: npt.ArrayLike,
    L: npt.ArrayLike,
    *,
    B: float,
    T: int,
    mu: float,
    rng: np.random.Generator | None = None,
) -> PrivateGradientDiagnostics:
    """Alg. 1 lines 6-8 with every intermediate; see ``private_gradient`` for what may be released."""
    loss = np.asarray(L, dtype=np.float64)
    if loss.ndim != 2 or loss.shape[1] < 1:
        raise InputDataError(f"the loss matrix L must have shape [m, n] with n >= 1, got {loss.shape}")
    n = int(loss.shape[1])
    w = np.asarray(W, dtype=np.float64)
    mechanism = step_mechanism(B, T, n, mu, max(1, int(w.shape[0])) if w.ndim == 2 else 1)
    G, bad = _per_user_gradients(w, loss)
    n_nonfinite = int(bad.sum())
    Gc = clip_rows(G, B)
    # the average, summed exactly (each clipped row snapped to a public lattice, an int64 sum): a float sum's
    # rounding would depend on every row, and move the average between neighbours by more than 2B/n
    avg: FloatArray = exact_sum(Gc, B, mean=True).value
    if mechanism is None:
        released, sigma = avg.copy(), 0.0
    else:  # line 8, exactly: snapped to the lattice, integer noise (never avg + float noise)
        released = add_lattice_noise(mechanism, avg, rng if rng is not None else os_entropy_rng())
        sigma = mechanism.sigma
    return PrivateGradientDiagnostics(
        G=G, G_clipped=Gc, n_nonfinite=n_nonfinite, clean_average=avg, sigma=sigma, released=released
    )


def private_gradient(
    W: npt.ArrayLike,
    L: npt.ArrayLike,
    *,
    B: float,
    T: int,
    mu: float,
    rng: np.random.Generator | None = None,
) -> FloatArray:
    """The released noisy clipped average gradient g_t + sigma w_t [d] (Alg. 1 lines 6-8), noise added
    exactly; ``rng`` None: a fresh OS-keyed AES-CTR generator (production)."""
    return private_gradient_diagnostics(W, L, B=B, T=T, mu=mu, rng=rng).released
