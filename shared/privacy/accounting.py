"""Composition of a population's privacy charges.

Every charge on a ledger states its (epsilon, delta) and, where the mechanism has them, its native
parameters: the Gaussian release's noise multiplier z (sigma over sensitivity; later the Laplace scale of
output noise, the mu of a Gaussian-DP gradient oracle). Two accountants read them:

* **basic composition** (Dwork & Roth 2014, Thm. 3.16): the epsilons add up and the deltas add up. This is
  what the budget enforces: simple to state, never optimistic.
* **PLD composition** (privacy loss distributions, Koskela et al. 2020 / Doroshenko et al. 2022, through
  Google's ``dp_accounting``): charges with native parameters are composed as distributions, which is much
  tighter for Gaussian noise (a Gaussian release at epsilon = e^1.1 plus a mu = 1 gradient oracle at
  delta = 1e-5 each: 7.38 summed, 5.38 composed at delta = 2e-5). Charges without native parameters are
  added on top by basic composition. Reported beside the ledger, for information. Gaussian charges compose
  exactly to one Gaussian (mu-GDP composition), whose epsilon(delta) has a closed form: a ledger of any
  number of Gaussian releases and gradient oracles is composed in milliseconds, without discretisation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (dp_accounting imports scipy.signal/stats: ~1 s, paid when first used)
    import dp_accounting

__all__ = ["Charge", "basic_composition", "pld_composition"]


@dataclass(frozen=True)
class Charge:
    """One spend: (epsilon, delta) as charged, and the mechanism's native parameters if it has any.

    ``native`` keys understood here: ``{"kind": "gaussian", "noise_multiplier": z}`` (a Gaussian mechanism
    with sensitivity 1 and noise z) and ``{"kind": "gdp", "mu": mu}`` (mu-Gaussian DP: z = 1 / mu), each with
    the implemented sampler's margins of the charged claim, ``"epsilon_margin"`` and ``"delta_margin"``
    (``shared.privacy.lattice.SamplerMargins``: the implemented mechanism is (epsilon_0 + epsilon_margin,
    e^(epsilon_margin / 2) delta_0 + delta_margin)-DP when the ideal one is (epsilon_0, delta_0)-DP). A
    charge without its margins (one recorded before they were) is composed by basic composition: its
    charged (epsilon, delta) already include them.
    """

    epsilon: float
    delta: float
    native: dict[str, Any] | None = None

    def margins(self) -> tuple[float, float] | None:
        """(epsilon, delta) margins of the implemented sampler, when the charge records them."""
        if not self.native or "epsilon_margin" not in self.native or "delta_margin" not in self.native:
            return None
        return float(self.native["epsilon_margin"]), float(self.native["delta_margin"])

    def event(self) -> dp_accounting.DpEvent | None:
        """The ideal mechanism's DpEvent, for a charge that records its native parameters and margins."""
        if not self.native or self.margins() is None:
            return None
        import dp_accounting

        kind = self.native.get("kind")
        if kind == "gaussian":
            return dp_accounting.GaussianDpEvent(float(self.native["noise_multiplier"]))
        if kind == "gdp":
            return dp_accounting.GaussianDpEvent(1.0 / float(self.native["mu"]))
        return None


def _merge_gaussians(events: Counter[Any]) -> Counter[Any]:
    """The Gaussian events (noise multipliers z_i, sensitivity 1) as the one Gaussian event they compose to
    exactly: z = (sum_i count_i / z_i^2)^(-1/2). A Gaussian mechanism's privacy loss is normal, N(mu^2 / 2,
    mu^2) with mu = 1 / z, so the losses of independent ones add up to that of mu = sqrt(sum mu_i^2): mu-GDP
    composition is exact (Dong, Roth & Su 2022, "Gaussian differential privacy", Corollary 3.3). One event
    instead of hundreds of self-compositions: a ledger of 500 releases is composed in milliseconds, not
    minutes, and with one discretisation instead of many."""
    import dp_accounting

    gaussians = {e: n for e, n in events.items() if isinstance(e, dp_accounting.GaussianDpEvent)}
    if len(gaussians) == 0 or (len(gaussians) == 1 and next(iter(gaussians.values())) == 1):
        return events
    mu_squared = sum(n / float(e.noise_multiplier) ** 2 for e, n in gaussians.items())
    merged: Counter[Any] = Counter({e: n for e, n in events.items() if e not in gaussians})
    merged[dp_accounting.GaussianDpEvent(1.0 / mu_squared**0.5)] += 1
    return merged


def basic_composition(charges: Sequence[Charge]) -> tuple[float, float]:
    """(sum of epsilons, sum of deltas)."""
    return sum(c.epsilon for c in charges), sum(c.delta for c in charges)


def pld_composition(charges: Sequence[Charge], delta: float) -> float | None:
    """Epsilon of all ``charges`` together at total ``delta``: PLD for those with native parameters, plus the
    basic sum of the rest (whose deltas are taken out of ``delta`` first). None when that leaves no delta.

    The implemented samplers' margins are folded in as for one mechanism (``shared.privacy.lattice``; they
    add up over draws and entries): the ideal mechanisms are composed at delta_0 = (delta - the rest's
    deltas - the sum of the delta margins) e^(-E / 2), E the sum of the epsilon margins, and E is added.

    Equal events are composed together (``compose(event, count)``: one self-composition instead of ``count``
    convolutions), and results are remembered per set of charges: a ledger page asks again for the same
    charges until a new one is added, and the composition of many charges takes seconds.
    """
    key = tuple(
        (float(c.epsilon), float(c.delta), tuple(sorted(c.native.items())) if c.native else None)
        for c in charges
    )
    return _pld_composition(key, float(delta))


@lru_cache(maxsize=256)
def _pld_composition(
    key: tuple[tuple[float, float, tuple[tuple[str, Any], ...] | None], ...], delta: float
) -> float | None:
    charges = [Charge(eps, dl, dict(native) if native else None) for eps, dl, native in key]
    events = [(c, c.event()) for c in charges]
    rest = [c for c, e in events if e is None]
    eps_rest, delta_rest = basic_composition(rest)
    composed = Counter(e for _, e in events if e is not None)  # DpEvents are frozen, hashable dataclasses
    composed = _merge_gaussians(composed)
    if not composed:
        return eps_rest if delta_rest <= delta * (1 + 1e-9) else None
    margins = [m for c, e in events if e is not None and (m := c.margins()) is not None]
    eps_margin = math.fsum(m[0] for m in margins)
    target = (delta - delta_rest - math.fsum(m[1] for m in margins)) * math.exp(-0.5 * eps_margin)
    if target <= 0:
        return None
    eps_rest += eps_margin
    import dp_accounting

    (only, count), *others = composed.items()
    if not others and count == 1 and isinstance(only, dp_accounting.GaussianDpEvent):
        # one Gaussian (every Gaussian charge merged): its epsilon(delta) in closed form, exactly what the
        # PLD accountant approximates by discretisation (Balle & Wang 2018, Theorem 8; ``gdp_epsilon``)
        from shared.privacy.gdp import gdp_epsilon

        return gdp_epsilon(1.0 / float(only.noise_multiplier), target) + eps_rest
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    for event, count in composed.items():
        accountant.compose(event, count)
    return float(accountant.get_epsilon(target)) + eps_rest
