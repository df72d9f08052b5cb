"""The statistics of the privacy audit: error rates of a test -> a lower bound on what a mechanism spends.

A test S that says "the data was D'" has error rates FPR = P_D(S) and FNR = P_D'(not S). Every privacy claim
pobo makes restricts which pairs (FPR, FNR) any test can reach on a neighbouring pair:

* **(epsilon, delta)-DP** (Dwork & Roth 2014, Def. 2.4, applied to S and to its complement)::

      1 - FNR <= e^epsilon FPR + delta        and        1 - FPR <= e^epsilon FNR + delta

  so ``epsilon >= max(ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR))`` (``epsilon_lower_bound``).
  This bound holds whatever the mechanism is; at a small delta it cannot witness a Gaussian mechanism's
  epsilon with a practical number of runs (that lives in the far tails).
* **mu-GDP** (Dong, Roth & Su 2022, Def. 2.6): ``FNR >= Phi(Phi^-1(1 - FPR) - mu)`` for every test, i.e.
  ``mu >= Phi^-1(1 - FPR) - Phi^-1(FNR)``. The Gaussian mechanisms (release, gradient oracle, a federation
  round at q = 1) claim exactly this (their (epsilon, delta) is its conversion, and the PLD accountant
  composes it), and the best test's rates near FPR = FNR measure mu to within a few percent at 10^4 runs: a
  1.5x sensitivity error is caught where the (epsilon, delta) bound sees nothing.
* **pure epsilon-DP** (CTL's Laplace): the first bullet with delta = 0, tight at the extreme threshold.
* **a Poisson-subsampled Gaussian** (a federation round at q < 1, noise multiplier z = 1 / mu): the rates
  must satisfy the first bullet at every epsilon with that mechanism's exact privacy profile delta(epsilon)
  (``subsampled_gaussian_delta``, both directions of the zero-out relation). Its level is mu: the lower
  bound is the smallest mu' whose profile admits the rates.

Each claim is a family with one level (mu, or epsilon); ``Claim.level_lower_bound`` turns a test's rates
into the smallest level consistent with them. The audit replaces FPR and FNR by one-sided Clopper-Pearson
upper bounds (alpha / 2 each), so a level bound above the claimed level refutes the claim with confidence
1 - alpha, whatever the mechanism is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import special, stats

from shared.privacy.rows import FloatArray

__all__ = [
    "Claim",
    "ClaimKind",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "gdp_mu_lower_bound",
    "subsampled_gaussian_delta",
]

ClaimKind = Literal["gdp", "pure", "subsampled-gaussian", "approx"]

#: The epsilons at which a subsampled Gaussian's profile is checked (a rate pair that breaks it between two
#: grid points is judged at the grid: the bound can only come out lower, never falsely high).
_EPS_GRID = np.concatenate([np.linspace(0.0, 4.0, 801), np.linspace(4.005, 40.0, 800)])


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson upper bound on a rate with k events in n trials."""
    if not (0 <= k <= n) or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if k == n:
        return 1.0
    return float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))


def epsilon_lower_bound(fpr_upper: float, fnr_upper: float, delta: float) -> float:
    """``max(ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR), 0)`` from upper bounds on the rates."""
    best = 0.0
    for num, den in ((1.0 - delta - fnr_upper, fpr_upper), (1.0 - delta - fpr_upper, fnr_upper)):
        if num > 0 and den > 0:
            best = max(best, math.log(num / den))
    return best


def gdp_mu_lower_bound(fpr_upper: float, fnr_upper: float) -> float:
    """``max(0, Phi^-1(1 - FPR) - Phi^-1(FNR))``: the smallest mu whose GDP trade-off admits the rates."""
    if fpr_upper <= 0.0 or fnr_upper <= 0.0:
        return math.inf
    return max(0.0, float(-special.ndtri(fpr_upper) - special.ndtri(fnr_upper)))


def subsampled_gaussian_delta(q: float, mu: float, epsilon: FloatArray) -> FloatArray:
    """delta(epsilon) of one Poisson-subsampled Gaussian mechanism, the worse of its two directions.

    In units of the sensitivity, the output without the agent is P = N(0, 1) and with it
    Q = (1 - q) N(0, 1) + q N(mu, 1) (zero-out relation). The likelihood ratio is monotone in x, so the
    hockey-stick divergences have closed forms (Balle & Wang's argument for the Gaussian, with a mixture):

    * remove, H_{e^eps}(Q || P): Q(x > t) - e^eps P(x > t) with q e^{mu t - mu^2/2} + 1 - q = e^eps;
    * add, H_{e^eps}(P || Q): P(x < t') - e^eps Q(x < t') with q e^{mu t' - mu^2/2} + 1 - q = e^-eps
      (0 when e^-eps <= 1 - q: the ratio never falls that low).
    """
    eps = np.asarray(epsilon, dtype=np.float64)
    if mu <= 0.0:
        return np.zeros_like(eps)
    sf = special.ndtr
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = (np.log((np.exp(eps) - (1.0 - q)) / q) + mu * mu / 2.0) / mu
        remove = (1.0 - q) * sf(-t) + q * sf(mu - t) - np.exp(eps) * sf(-t)
        inner = np.exp(-eps) - (1.0 - q)
        t2 = (np.log(np.where(inner > 0, inner, 1.0) / q) + mu * mu / 2.0) / mu
        add = sf(t2) - np.exp(eps) * ((1.0 - q) * sf(t2) + q * sf(t2 - mu))
        add = np.where(inner > 0, add, 0.0)
    out: FloatArray = np.clip(np.maximum(np.nan_to_num(remove), np.nan_to_num(add)), 0.0, 1.0)
    return out


def _admits(q: float, mu: float, fpr: float, fnr: float) -> bool:
    """Whether every (epsilon, delta(epsilon)) of the (q, mu) mechanism admits the rates (FPR, FNR)."""
    delta = subsampled_gaussian_delta(q, mu, _EPS_GRID)
    e = np.exp(_EPS_GRID)
    tol = 1e-12
    return bool(np.all(1.0 - fnr <= e * fpr + delta + tol) and np.all(1.0 - fpr <= e * fnr + delta + tol))


def _subsampled_mu_lower_bound(q: float, fpr: float, fnr: float, cap: float = 50.0) -> float:
    """The smallest mu whose (q, mu) profile admits the rates (bisection: admitting is monotone in mu)."""
    if _admits(q, 0.0, fpr, fnr):
        return 0.0
    if not _admits(q, cap, fpr, fnr):
        return cap
    lo, hi = 0.0, cap
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _admits(q, mid, fpr, fnr):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class Claim:
    """What a mechanism claims on one neighbouring pair: a family and its level, and the (epsilon, delta)
    pobo prints for it.

    ``kind``: ``"gdp"`` (level mu), ``"pure"`` (level epsilon, delta 0), ``"subsampled-gaussian"`` (level
    mu = 1 / z of the unsampled mechanism, sampling probability ``q``) or ``"approx"`` (level epsilon at
    ``delta``: the (epsilon, delta) pair alone, e.g. the label of a mechanism without a guarantee).
    """

    kind: ClaimKind
    level: float
    epsilon: float
    delta: float
    q: float = 1.0

    @property
    def level_name(self) -> str:
        return "mu" if self.kind in ("gdp", "subsampled-gaussian") else "epsilon"

    def describe(self) -> str:
        if self.kind == "gdp":
            return f"{self.level:.4g}-GDP (epsilon {self.epsilon:.4g} at delta {self.delta:g})"
        if self.kind == "subsampled-gaussian":
            return (
                f"Poisson-subsampled Gaussian, q = {self.q:g}, mu = {self.level:.4g} "
                f"(epsilon {self.epsilon:.4g} at delta {self.delta:g})"
            )
        if self.kind == "pure":
            return f"{self.epsilon:.4g}-DP"
        return f"({self.epsilon:.4g}, {self.delta:g})-DP"

    def level_lower_bound(self, fpr_upper: float, fnr_upper: float) -> float:
        """The smallest level of this family that admits the rates (upper bounds on FPR and FNR)."""
        if self.kind == "gdp":
            return gdp_mu_lower_bound(fpr_upper, fnr_upper)
        if self.kind == "subsampled-gaussian":
            return _subsampled_mu_lower_bound(self.q, fpr_upper, fnr_upper)
        delta = 0.0 if self.kind == "pure" else self.delta
        return epsilon_lower_bound(fpr_upper, fnr_upper, delta)
