"""Privacy accounting of DP-FTS-DE, and the exact one-round privacy loss of the two weighting rules.

Paper: DP-FTS-DE (Dai, Low & Jaillet, NeurIPS 2021), Section 3.3 and Proposition 1: each round of
Algorithm 1 is ONE Poisson-subsampled Gaussian mechanism (sampling probability q) whose noise std
z varphi_max S / q equals z times the norm bound varphi_max S / q of one agent's joint contribution, i.e.
noise multiplier z. The paper accounts with the moments accountant (Abadi et al. 2016) at
delta = 1/N^1.1; Fig. 2c reports 5.93, 9.91, 20.12 for q = 0.15, 0.25, 0.5 at z = 1, T = 40, N = 200.

Here (issue 16): Google's dp-accounting composes ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` over the
rounds run, under the zero-out relation (``NeighboringRelation.REPLACE_SPECIAL``: an agent's submissions
replaced by nothing, i.e. by a zero contribution). For this event both accountants treat REPLACE_SPECIAL
as ADD_OR_REMOVE_ONE (dp-accounting 0.6: ``pld.privacy_loss_distribution.from_gaussian_mechanism`` and
``RdpAccountant._maybe_compose``): per round, in units of the norm bound varphi_max S / q,
(1-q) N(0, z^2) + q N(1, z^2) against N(0, z^2), in both directions (remove and add). That holds only because
the weights and the noise std come from the FROZEN agent list: see ``renormalised_round_delta``.

The replace-one epsilon (the per-patient view of a hospital: one agent's submissions replaced by other
submissions) is ``federated_epsilon_replace_one``: PLD with ``REPLACE_ONE`` ((1-q) N(0, z^2) + q N(-1, z^2)
against (1-q) N(0, z^2) + q N(1, z^2)); dp-accounting's RDP accountant does not support a
Poisson-sampled event under REPLACE_ONE, so "rdp" there is the group-privacy bound of two zero-out steps,
(2 epsilon_0, (1 + e^epsilon_0) delta_0)-DP.

The services report the implemented mechanism's epsilon: ``entries = P M`` folds in the Gaussian sampler's
margins (``federation_sampler_margins``; ~1e-8 of epsilon at the defaults). The paper comparisons below are
the ideal mechanism's.

Measured (delta = 1/200^1.1, T = 40, z = 1): PLD 3.96 / 7.05 / 15.71 and RDP 4.88 / 8.41 / 18.40 for
q = 0.15 / 0.25 / 0.5, against the paper's moments-accountant 5.93 / 9.91 / 20.12 (upper bounds);
z = 1.2 / 1.5 at q = 0.25: PLD 5.15 / 3.60, RDP 6.18 / 4.27 (paper 7.39 / 5.22). Replace-one, PLD:
6.41 / 12.18 / 31.18.

One round on a landmine-like federation (``compare_rules``: N = 29, P = 4, M = 100, q = 0.35, z = 1): the
accountant claims epsilon = 3.105 at delta = 1e-5; at that epsilon the frozen rule's exact delta is
0.99999999e-5 (the accountant is tight), the renormalised rule's is >= 0.895. At the paper's
delta = 1/29^1.1 = 0.0246 (epsilon = 0.711) the renormalised rule's delta is >= 0.959.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError
from shared.federated.coordinator import DEFAULT_A, softmax_weights
from shared.federated.regions import round_robin
from shared.privacy.lattice import SamplerMargins, sampler_margins

if TYPE_CHECKING:  # dp_accounting and scipy.stats are imported when first used (~1 s a service need not pay)
    import dp_accounting

FloatArray = npt.NDArray[np.float64]
Accountant = Literal["pld", "rdp"]

__all__ = [  # (and RDP_ORDERS, dp-accounting's default orders, computed on first use)
    "RuleComparison",
    "compare_rules",
    "federated_epsilon",
    "federated_epsilon_replace_one",
    "federation_sampler_margins",
    "frozen_round_delta",
    "renormalised_round_delta",
    "round_event",
]


# dp-accounting's default RDP orders (fractional 1.1 .. 10.9, integers to 63, 128 .. 1024). Its series for a
# fractional order below 2 may fail to converge at the q used here; dp-accounting then drops the order (sound:
# the minimum over the remaining orders is still an upper bound) and logs a warning per order and call, which
# the filter below silences (only that message, only on the "absl" logger).
@cache
def _rdp_orders() -> tuple[float, ...]:
    from dp_accounting.rdp import rdp_privacy_accountant

    return tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


def __getattr__(name: str) -> Any:  # RDP_ORDERS, computed on first use (PEP 562)
    if name == "RDP_ORDERS":
        return _rdp_orders()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _DropNonConvergedOrders(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "_compute_log_a_frac failed to converge" not in record.getMessage()


_ABSL = logging.getLogger("absl")
if not any(isinstance(f, _DropNonConvergedOrders) for f in _ABSL.filters):
    _ABSL.addFilter(_DropNonConvergedOrders())


def _args(q: float, z: float, rounds: int, delta: float) -> tuple[float, float, int, float]:
    q, z, delta = float(q), float(z), float(delta)
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise InputDataError(f"q must be in (0, 1], got {q!r}")
    if not (math.isfinite(z) and z > 0.0):
        raise InputDataError(f"z must be a finite number > 0, got {z!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int | np.integer) or rounds < 0:
        raise InputDataError(f"rounds must be an integer >= 0, got {rounds!r}")
    if not 0.0 < delta < 1.0:
        raise InputDataError(f"delta must be in (0, 1), got {delta!r}")
    return q, z, int(rounds), delta


def round_event(q: float, z: float, rounds: int) -> dp_accounting.DpEvent:
    """``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), rounds)``: Algorithm 1's rounds."""
    import dp_accounting

    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    return dp_accounting.SelfComposedDpEvent(event, rounds)


def _epsilon(q: float, z: float, rounds: int, delta: float, accountant: str, relation: object) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    rel = dp_accounting.NeighboringRelation
    if accountant == "pld":
        acc: dp_accounting.PrivacyAccountant = pld_privacy_accountant.PLDAccountant(relation)
    elif accountant == "rdp":
        acc = rdp_privacy_accountant.RdpAccountant(_rdp_orders(), relation)
    else:
        raise InputDataError(f"accountant must be 'pld' or 'rdp', got {accountant!r}")
    assert relation in (rel.REPLACE_SPECIAL, rel.REPLACE_ONE)  # noqa: S101 - internal
    acc.compose(round_event(q, z, rounds))
    return float(acc.get_epsilon(delta))


def federation_sampler_margins(
    z: float, rounds: int, delta: float, entries: int, *, replace: bool = True
) -> SamplerMargins:
    """The Gaussian sampler's margins over ``rounds`` rounds of ``entries`` = P M aggregate entries
    (``shared.privacy.lattice.sampler_margins``). Each round is a mixture of lattice Gaussians around the
    aggregate without the agent and with it (zero-out: 1/z noise standard deviations apart; replace-one: three
    means up to 2/z apart, so the shifted tail is counted twice); on outputs where the sampler is dense
    around every mean, each component, hence the mixture, is within the same factor of the ideal one.
    InputDataError when the delta margin would take half of ``delta`` (replace-one, the default, is the
    stricter: a federation is checked with it when created)."""
    if replace:
        half = sampler_margins(entries, z / 2.0, delta / 2.0, rounds)
        margins = SamplerMargins(half.epsilon, 2.0 * half.delta, half.window_bits)
    else:
        margins = sampler_margins(entries, z, delta, rounds)
    if margins.delta >= 0.5 * delta:
        raise InputDataError(
            f"delta = {delta:g} is too small for pobo's Gaussian sampler to back over {rounds} rounds of "
            f"{entries} noisy entries at z = {z:g} (it can differ from the ideal Gaussian mechanism with "
            f"probability up to {margins.delta:.2g}): choose a larger delta or a larger z"
        )
    return margins


def federated_epsilon(
    q: float,
    z: float,
    rounds: int,
    delta: float = 1e-5,
    accountant: Accountant = "pld",
    *,
    entries: int | None = None,
) -> float:
    """epsilon at ``delta`` after ``rounds`` rounds of Algorithm 1 (zero-out relation, REPLACE_SPECIAL).

    The Poisson-subsampled Gaussian (rate q, noise multiplier z) composed ``rounds`` times, by dp-accounting's
    PLD (tight up to discretisation, pessimistic) or RDP accountant (an upper bound). 0 for 0 rounds.
    ``entries`` (P M, the aggregate's size): the implemented mechanism's epsilon, with the Gaussian sampler's
    margins folded in (``federation_sampler_margins``); None: the ideal mechanism's (the paper's comparisons).
    Issue 16 fixes this name and ``shared.accounting.federated_epsilon`` as its import path.
    """
    import dp_accounting

    q, z, rounds, delta = _args(q, z, rounds, delta)
    if rounds == 0:
        return 0.0
    relation = dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    if entries is None:
        return _epsilon(q, z, rounds, delta, accountant, relation)
    margins = federation_sampler_margins(z, rounds, delta, entries, replace=False)
    return _epsilon(q, z, rounds, margins.ideal_delta(delta), accountant, relation) + margins.epsilon


def federated_epsilon_replace_one(
    q: float,
    z: float,
    rounds: int,
    delta: float = 1e-5,
    accountant: Accountant = "pld",
    *,
    entries: int | None = None,
) -> float:
    """epsilon at ``delta`` when one agent's submissions are REPLACED by arbitrary others (replace-one).

    "pld": dp-accounting's PLD with ``REPLACE_ONE`` (the replaced agent is sampled with the same coin in both
    worlds: (1-q) N(0, z^2) + q N(-1, z^2) against (1-q) N(0, z^2) + q N(1, z^2) per round). "rdp": the
    group-privacy bound through the zero-out world in between, 2 epsilon_0 where epsilon_0 is the RDP
    zero-out epsilon at delta_0 with (1 + e^epsilon_0) delta_0 = delta (found by a few fixed-point steps).
    ``entries``: as for ``federated_epsilon``.
    """
    q, z, rounds, delta = _args(q, z, rounds, delta)
    if rounds == 0:
        return 0.0
    if entries is None:
        return _replace_one(q, z, rounds, delta, accountant)
    margins = federation_sampler_margins(z, rounds, delta, entries, replace=True)
    return _replace_one(q, z, rounds, margins.ideal_delta(delta), accountant) + margins.epsilon


def _replace_one(q: float, z: float, rounds: int, delta: float, accountant: Accountant) -> float:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    if accountant == "pld":
        return _epsilon(q, z, rounds, delta, "pld", dp_accounting.NeighboringRelation.REPLACE_ONE)
    if accountant != "rdp":
        raise InputDataError(f"accountant must be 'pld' or 'rdp', got {accountant!r}")
    # f(delta0) = delta / (1 + e^{eps(delta0)}) is increasing and nearly flat, with one fixed point
    # delta*; iterating delta0 <- f(delta0) (1 - 1e-3) from above stops at the first delta0 <= f(delta0),
    # i.e. the first pair with (1 + e^{eps_0}) delta_0 <= delta.
    acc = rdp_privacy_accountant.RdpAccountant(
        _rdp_orders(), dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    )
    acc.compose(round_event(q, z, rounds))
    delta0 = delta / 2.0
    for _ in range(200):
        eps0 = float(acc.get_epsilon(delta0))
        target = delta / (1.0 + math.exp(eps0))
        if delta0 <= target:
            break
        delta0 = target * (1.0 - 1e-3)
    else:  # pragma: no cover - f is flat, so a handful of steps suffice
        raise InputDataError("the replace-one RDP bound did not converge")
    return 2.0 * eps0


def _mixture_hockey_stick(q: float, s: float, epsilon: float) -> float:
    """max of H_eps(P || Q) and H_eps(Q || P) for P = (1-q) N(0,1) + q N(s,1), Q = N(0,1), exactly.

    H_eps(A || B) = int max(0, a(x) - e^eps b(x)) dx. The likelihood ratio is monotone in x, so each is a
    difference of normal tails at the threshold where the privacy loss crosses eps:
    P||Q: loss log(1 - q + q e^{s x - s^2/2}) > eps  iff x > x_A = (log((e^eps - 1 + q) / q) + s^2/2) / s;
    Q||P: loss > eps iff x < x_B = (log((e^-eps - 1 + q) / q) + s^2/2) / s (only when e^-eps > 1 - q).
    """
    from scipy.special import ndtr

    e = math.exp(epsilon)
    x_a = (math.log((e - 1.0 + q) / q) + s * s / 2.0) / s
    d_a = (1.0 - q) * ndtr(-x_a) + q * ndtr(s - x_a) - e * ndtr(-x_a)
    d_b = 0.0
    if math.exp(-epsilon) > 1.0 - q:
        x_b = (math.log((math.exp(-epsilon) - 1.0 + q) / q) + s * s / 2.0) / s
        d_b = ndtr(x_b) - e * ((1.0 - q) * ndtr(x_b) + q * ndtr(x_b - s))
    return float(max(d_a, d_b, 0.0))


def frozen_round_delta(q: float, z: float, epsilon: float) -> float:
    """Exact delta(epsilon) of ONE round of Algorithm 1 with the frozen list, zero-out relation.

    Construction: worlds D (agent k present) and D' (k's submission replaced by nothing). The output is
    A + B_k c_k + N(0, sigma^2 I) against A + N(0, sigma^2 I), where A (the others, sampled and noised
    identically) is common to both, B_k ~ Bernoulli(q) is k's sampling coin and c_k = (varphi_k^(i)
    hat omega_k / q)_i has ||c_k|| <= varphi_max S / q = sigma / z, because the weights and sigma depend on
    the frozen list only. Dropping the common A can only increase the divergence (post-processing), and
    rotating c_k onto the first axis and maximising ||c_k|| leaves the 1-D pair
    (1-q) N(0,1) + q N(1/z, 1) against N(0,1) (noise units), attained when the others submit nothing.
    Its hockey-stick divergence has the closed form of ``_mixture_hockey_stick`` (both directions).
    The PLD accountant's epsilon at delta must give back at most delta here.
    """
    q, z, _, _ = _args(q, z, 1, 0.5)
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise InputDataError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return _mixture_hockey_stick(q, 1.0 / z, epsilon)


def _scale_hockey_stick(dim: int, s1: FloatArray, s2: FloatArray, epsilon: float) -> FloatArray:
    """H_eps(N(0, s1^2 I_dim) || N(0, s2^2 I_dim)), elementwise over arrays s1, s2, exactly (chi-square).

    The privacy loss L(y) = dim log(s2/s1) - ||y||^2 (1/s1^2 - 1/s2^2) / 2 depends on y only through
    ||y||^2, which is s^2 chi^2_dim under N(0, s^2 I): with c = (dim log(s2/s1) - eps) / k and
    k = (1/s1^2 - 1/s2^2) / 2, L > eps iff ||y||^2 < c (k > 0) or > c (k < 0), so
    delta = F(c / s1^2) - e^eps F(c / s2^2) with F the chi^2_dim CDF (or survival function).
    """
    from scipy import stats

    k = 0.5 * (1.0 / s1**2 - 1.0 / s2**2)
    out = np.zeros_like(k)
    nz = k != 0
    c = (dim * np.log(s2[nz] / s1[nz]) - epsilon) / k[nz]
    lower = k[nz] > 0
    F1 = np.where(lower, stats.chi2.cdf(c / s1[nz] ** 2, dim), stats.chi2.sf(c / s1[nz] ** 2, dim))
    F2 = np.where(lower, stats.chi2.cdf(c / s2[nz] ** 2, dim), stats.chi2.sf(c / s2[nz] ** 2, dim))
    out[nz] = np.maximum(F1 - math.exp(epsilon) * F2, 0.0)
    return out


def renormalised_round_delta(
    N: int,
    P: int,
    M: int,
    q: float,
    z: float,
    epsilon: float,
    *,
    a: float = DEFAULT_A,
    temperature: float = 1.0,
) -> float:
    """delta(epsilon) of ONE round of the paper-as-written rule, for its worst neighbouring pair below.

    The rule: the softmax weights varphi and the noise std z varphi_max S / q are computed over the agents
    PRESENT (add/remove relation of the paper's Definition 1). World D: N agents, round-robin regions
    n mod P; world D': the same minus one agent k (the others keep their regions). Let every agent submit
    the zero vector (allowed: a vector of norm <= S / sqrt(P)). Then in both worlds the sampled sum is 0 and
    the output is pure noise, N(0, sigma^2 I_{PM}) against N(0, sigma'^2 I_{PM}) with
    sigma'/sigma = varphi'_max / varphi_max: removing an agent from a sub-region with the fewest agents
    raises that region's weights from ~1/n_i to ~1/(n_i - 1), whatever the sampling did. Subsampling
    cannot hide this: it happens in every round, sampled or not. The hockey-stick divergence of the pair is
    computed exactly through the chi-square law of ||y||^2 (``_scale_hockey_stick``), in both directions and
    for every choice of the removed agent's region; the maximum is a LOWER bound on the rule's delta.
    """
    q, z, _, _ = _args(q, z, 1, 0.5)
    for name, v, low in (("N", N, 2), ("P", P, 1), ("M", M, 1)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < low:
            raise InputDataError(f"{name} must be an integer >= {low}, got {v!r}")
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise InputDataError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    assign = round_robin(int(N), int(P))
    phi_max = float(softmax_weights(assign, int(P), temperature, a=a).max())
    ratios = []
    for i in np.unique(assign):  # remove one agent of region i (P cases, not N)
        k = int(np.flatnonzero(assign == i)[0])
        rest = np.delete(assign, k)
        ratios.append(float(softmax_weights(rest, int(P), temperature, a=a).max()) / phi_max)
    r = np.asarray(ratios)
    ones = np.ones_like(r)
    dim = int(P) * int(M)
    both = np.concatenate(
        [_scale_hockey_stick(dim, ones, r, epsilon), _scale_hockey_stick(dim, r, ones, epsilon)]
    )
    return float(both.max())


@dataclass(frozen=True)
class RuleComparison:
    """One round, frozen list vs paper-as-written (renormalised) weights, at the accountant's epsilon."""

    epsilon_claimed: float  # PLD accountant, one round, at delta_target
    delta_target: float
    delta_frozen: float  # exact worst case, frozen list (<= delta_target)
    delta_renormalised: float  # exact for the zero-vector pair, renormalised rule (a lower bound)
    delta_accountant: float  # dp-accounting's PLD get_delta at epsilon_claimed


def compare_rules(
    N: int = 29,
    P: int = 4,
    M: int = 100,
    q: float = 0.35,
    z: float = 1.0,
    delta: float = 1e-5,
    *,
    a: float = DEFAULT_A,
    temperature: float = 1.0,
) -> RuleComparison:
    """The issue-16 computation on a landmine-like federation (defaults: N = 29, P = 4, M = 100, q = 0.35,
    z = 1): epsilon claimed by the accountant after one round at ``delta``, then the exact delta of each
    rule at that epsilon (``frozen_round_delta``, ``renormalised_round_delta``)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    eps = federated_epsilon(q, z, 1, delta, "pld")
    acc = pld_privacy_accountant.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(round_event(q, z, 1))
    return RuleComparison(
        epsilon_claimed=eps,
        delta_target=float(delta),
        delta_frozen=frozen_round_delta(q, z, eps),
        delta_renormalised=renormalised_round_delta(N, P, M, q, z, eps, a=a, temperature=temperature),
        delta_accountant=float(acc.get_delta(eps)),
    )
