"""Gaussian differential privacy (mu-GDP): (epsilon, delta) conversion, composition, DP-GIBO noise.

Notation::

    Phi           standard normal CDF (log Phi = ``scipy.special.log_ndtr``)
    mu            GDP parameter: the mechanism is as hard to tell apart as N(0, 1) from N(mu, 1)
    T             number of composed steps (gradient steps of DP-GIBO)
    mu_step       per-step parameter, mu / sqrt(T)
    B, n          clipping bound of a per-user gradient, number of users
    z             noise multiplier: noise std over L2 sensitivity; a Gaussian mechanism is (1 / z)-GDP

Facts used (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022; arXiv:1905.02383):

* **Gaussian mechanism** (Theorem 2.7): adding N(0, sigma^2 I) to a statistic of L2 sensitivity s is
  (s / sigma)-GDP.
* **Conversion** (Corollary 2.13): a mechanism is mu-GDP iff it is (epsilon, delta(epsilon))-DP for every
  epsilon >= 0, with ``delta(epsilon) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)``.
* **Composition** (Corollary 3.3): the composition of mu_1-, ..., mu_k-GDP mechanisms is
  sqrt(mu_1^2 + ... + mu_k^2)-GDP, so T steps of mu / sqrt(T)-GDP each are mu-GDP.

DP-GIBO (Algorithm 1 and Lemma 3.1 of "Scalable Differentially Private Bayesian Optimization"): each step
clips n per-user gradients to norm B and averages them; replacing one user moves the average by at most
2B / n (the proof of Lemma 3.1 uses the replace-one relation, d_H(x, x') = 1), and the step adds
N(0, (2 B sqrt(T) / (n mu))^2 I), so each step is mu / sqrt(T)-GDP and the run is mu-GDP.

**Accounting trap.** The noise std 2 B sqrt(T) / (n mu) is already calibrated to the replace-one sensitivity
2B / n, so in ``dp_accounting`` the step is ``GaussianDpEvent(noise_multiplier=sqrt(T) / mu)`` under the
DEFAULT ``ADD_OR_REMOVE_ONE`` relation, whose sensitivity is 1 in units of the noise multiplier.
``PLDAccountant(NeighboringRelation.REPLACE_ONE)`` doubles a Gaussian event's sensitivity a second time and
charges the epsilon of 2 mu (about 10.0 instead of 4.38 at mu = 1, delta = 1e-5). This is the convention of
``shared.privacy.accounting`` (a ``{"kind": "gdp", "mu": mu}`` charge is ``GaussianDpEvent(1 / mu)``).

The noise of a step is added exactly by ``shared.privacy.lattice`` (the clean average snapped to a lattice,
integer noise from an OS-keyed AES-CTR generator), which closes the floating-point attack on ``value +
noise`` (Mironov, CCS 2012; Jin et al., IEEE S&P 2022); the lattice's rounding is added to the sensitivity,
so each step stays mu_step-GDP (``shared.bo.gibo.private_gradient.step_mechanism``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from shared.errors import InputDataError

__all__ = [
    "compose_gdp",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_epsilon_pld",
    "gibo_noise_std",
    "noise_multiplier_for",
    "per_step_mu",
]


def _number(name: str, value: float, *, positive: bool) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InputDataError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


def _steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise InputDataError(f"steps must be an integer >= 1, got {steps!r}")
    return int(steps)


def _delta_arg(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise InputDataError(f"delta must be in (0, 1), got {delta!r}")
    return delta


#: Below this mu, log Phi(a - mu) - log Phi(a) is integrated (``_log_phi_ratio``) instead of subtracted.
_QUADRATURE_MU = 0.5


def _log_phi_ratio(a: float, mu: float) -> float:
    """log Phi(a - mu) - log Phi(a), accurate to double precision even when it nearly cancels epsilon.

    For small mu the two logs agree in most of their digits, and at extreme (epsilon, delta) the gap
    epsilon + log Phi(a - mu) - log Phi(a) that decides delta is a millionth of either term (epsilon = 1e-6,
    delta = 1e-100), so their difference is computed as ``-int_{a - mu}^{a} h(t) dt`` with the inverse Mills
    ratio h = phi / Phi (smooth; Gauss-Legendre, 16 nodes): relative accuracy ~1e-15 on the integral.
    """
    from scipy.special import log_ndtr  # (scipy.special, scipy.optimize and dp_accounting: imported when
    # first used, so that a service starts without them)

    if mu > _QUADRATURE_MU:
        return float(log_ndtr(a - mu)) - float(log_ndtr(a))
    nodes, weights = np.polynomial.legendre.leggauss(16)
    t = a - mu / 2.0 + (mu / 2.0) * nodes
    h = np.exp(-0.5 * t * t - 0.5 * math.log(2.0 * math.pi) - log_ndtr(t))
    return -(mu / 2.0) * float(np.dot(weights, h))


def _log_gdp_delta(mu: float, epsilon: float) -> float:
    """log delta(epsilon) of mu-GDP, in log space: no overflow of e^epsilon, no underflow of delta.

    delta = Phi(a) - e^epsilon Phi(b) with a = -epsilon/mu + mu/2 and b = a - mu, so with
    l1 = log Phi(a) and gap = epsilon + log Phi(b) - log Phi(a) (<= 0): log delta = l1 + log(-expm1(gap)).
    """
    a = -epsilon / mu + mu / 2.0
    from scipy.special import log_ndtr

    l1 = float(log_ndtr(a))
    gap = epsilon + _log_phi_ratio(a, mu)
    if gap >= 0.0:  # rounding at the far tail: delta is below what double precision resolves
        return -math.inf
    return l1 + math.log(-math.expm1(gap))


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of a mu-GDP mechanism (Dong, Roth & Su 2022, Corollary 2.13), computed in log space.

    ``Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)``; strictly decreasing in epsilon, equal
    to 2 Phi(mu/2) - 1 at epsilon = 0.
    """
    mu = _number("mu", mu, positive=True)
    epsilon = _number("epsilon", epsilon, positive=False)
    return math.exp(_log_gdp_delta(mu, epsilon))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon >= 0 with ``gdp_delta(mu, epsilon) <= delta`` (1.0, 1e-5 -> 4.3772).

    Bracket: delta(epsilon) <= Phi(-epsilon/mu + mu/2) (the subtracted term is >= 0), which equals delta at
    ``epsilon_hi = mu (mu/2 + Phi^-1(1 - delta))`` (the classical Gaussian-mechanism bound), so the root
    lies in [0, epsilon_hi]. If delta(0) = 2 Phi(mu/2) - 1 <= delta already, the answer is 0. The root of
    log delta(epsilon) - log delta is found by Brent's method; the result is nudged up until delta(result)
    <= delta holds as ``gdp_delta`` reports it, so the epsilon returned is never too small.
    """
    mu = _number("mu", mu, positive=True)
    delta = _delta_arg(delta)
    log_target = math.log(delta)
    if _log_gdp_delta(mu, 0.0) <= log_target:
        return 0.0
    from scipy.optimize import brentq
    from scipy.special import ndtri

    hi = mu * (mu / 2.0 - float(ndtri(delta)))
    hi = max(hi, 1e-12)
    while _log_gdp_delta(mu, hi) > log_target:  # not reached in exact arithmetic; guards rounding
        hi = 2.0 * hi + 1e-12

    def f(eps: float) -> float:
        return _log_gdp_delta(mu, eps) - log_target

    root = float(brentq(f, 0.0, hi, xtol=1e-15 * hi, rtol=4 * np.finfo(float).eps, maxiter=200))
    step = max(1e-15 * hi, 4 * np.finfo(float).eps * root)
    while math.exp(_log_gdp_delta(mu, root)) > delta and root < hi:  # as gdp_delta reports it
        root = min(root + step, hi)
        step *= 2.0
    return root


def noise_multiplier_for(epsilon: float, delta: float) -> float:
    """The smallest noise multiplier z whose Gaussian mechanism is (epsilon, delta)-DP, verified.

    The exact ("analytic") condition of Balle & Wang (ICML 2018, Thm. 8) is delta(z) = Phi(1/(2z) - eps z)
    - e^eps Phi(-1/(2z) - eps z) <= delta, i.e. ``gdp_delta(1 / z, epsilon) <= delta`` (the same curve,
    Dong, Roth & Su 2022, Cor. 2.13). dp-accounting's bracketed root search finds z; its tolerance can land
    on either side of the root (at epsilon = 1e-6, delta = 1e-100 its z gives 1.0000142 delta), so the
    result is checked with the log-space ``gdp_delta`` and stepped up (relative steps 1e-9, doubling) until
    the condition holds with a relative margin of 1e-9 (the log-space delta agrees with 60-digit arithmetic
    to ~1e-11, ``tests/shared/test_gdp.py``). The z returned never gives more than ``delta``.
    """
    epsilon = _number("epsilon", epsilon, positive=True)
    delta = _delta_arg(delta)
    from dp_accounting.gaussian_mechanism import get_sigma_gaussian  # (imported when first used: ~1 s)

    z = float(get_sigma_gaussian(epsilon, delta))
    if not (math.isfinite(z) and z > 0):
        raise InputDataError(f"no finite Gaussian noise achieves epsilon={epsilon:g}, delta={delta:g}")
    log_target = math.log(delta) + math.log1p(-1e-9)
    step = 1e-9
    while _log_gdp_delta(1.0 / z, epsilon) > log_target:
        z *= 1.0 + step
        step *= 2.0
    return z


def compose_gdp(mus: Iterable[float]) -> float:
    """mu of the composition of mu_i-GDP mechanisms: sqrt(sum mu_i^2) (Dong, Roth & Su 2022, Cor. 3.3)."""
    values = [_number("mu", m, positive=False) for m in mus]
    return math.hypot(*values) if values else 0.0


def per_step_mu(mu: float, steps: int) -> float:
    """mu_step = mu / sqrt(T): T steps of mu_step-GDP compose to mu-GDP."""
    return _number("mu", mu, positive=True) / math.sqrt(_steps(steps))


def gibo_noise_std(clip_bound: float, n: int, mu: float, steps: int) -> float:
    """Noise std of one DP-GIBO step: 2 B sqrt(T) / (n mu) (Algorithm 1, line 8).

    The replace-one sensitivity of the clipped mean is 2B / n, so this is the Gaussian mechanism with noise
    multiplier sqrt(T) / mu, i.e. mu / sqrt(T)-GDP per step.
    """
    clip_bound = _number("clip_bound", clip_bound, positive=True)
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise InputDataError(f"n must be an integer >= 1, got {n!r}")
    return 2.0 * clip_bound / (int(n) * per_step_mu(mu, steps))


def gdp_epsilon_pld(mu: float, steps: int, delta: float) -> float:
    """epsilon at ``delta`` of T steps of mu / sqrt(T)-GDP, by dp-accounting's PLD accountant.

    Each step is ``GaussianDpEvent(noise_multiplier=sqrt(T) / mu)`` composed T times
    (``SelfComposedDpEvent``) under the default ADD_OR_REMOVE_ONE relation -- see the module docstring for
    why not REPLACE_ONE. Agrees with ``gdp_epsilon(mu, delta)`` up to the PLD discretisation.
    """
    mu = _number("mu", mu, positive=True)
    steps = _steps(steps)
    delta = _delta_arg(delta)
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(math.sqrt(steps) / mu), steps)
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))
