"""Composition of a population's charges (``shared.privacy.accounting``)."""

from __future__ import annotations

import math

import pytest
from dp_accounting.gaussian_mechanism import get_epsilon_gaussian

from shared.privacy.accounting import Charge, basic_composition, pld_composition
from shared.privacy.gaussian import calibrate


def gaussian_charge(epsilon: float, delta: float, d: int = 7) -> Charge:
    """A Gaussian release's charge as the ledger keeps it: z and the sampler's margins of its claim."""
    cal = calibrate(epsilon, delta, d)
    native = {
        "kind": "gaussian",
        "noise_multiplier": cal.noise_multiplier,
        "epsilon_margin": cal.sampler.epsilon,
        "delta_margin": cal.sampler.delta,
    }
    return Charge(epsilon, delta, native)


def gdp_charge(mu: float, delta: float) -> Charge:
    """A mu-GDP charge with no sampler margins recorded as zero (an ideal mechanism)."""
    native = {"kind": "gdp", "mu": mu, "epsilon_margin": 0.0, "delta_margin": 0.0}
    return Charge(get_epsilon_gaussian(1 / mu, delta), delta, native)


def test_pld_is_much_tighter_than_the_sum_for_gaussian_charges() -> None:
    """A Gaussian release at e^1.1 and a mu = 1 Gaussian-DP oracle, each at delta = 1e-5: 7.38 summed, and
    exactly the epsilon of the composed GDP mechanism (mu = sqrt(mu1^2 + mu2^2)) at delta = 2e-5: 5.38."""
    release = gaussian_charge(math.exp(1.1), 1e-5)
    oracle = gdp_charge(1.0, 1e-5)
    eps_sum, delta_sum = basic_composition([release, oracle])
    assert eps_sum == pytest.approx(7.38, abs=0.01) and delta_sum == pytest.approx(2e-5)
    composed = pld_composition([release, oracle], 2e-5)
    assert composed == pytest.approx(5.38, abs=0.01)
    mu = math.hypot(1 / release.native["noise_multiplier"], 1.0)  # type: ignore[index]
    assert composed == pytest.approx(get_epsilon_gaussian(1 / mu, 2e-5), abs=1e-3)  # PLD is near-exact here


def test_charges_without_native_parameters_add_up_on_top() -> None:
    gaussian = gaussian_charge(1.0, 1e-6)
    alg1 = Charge(2.0, 1e-6)  # the paper's Algorithm 1: no native parameters (and no guarantee)
    total = pld_composition([gaussian, alg1], 2e-6)
    assert total == pytest.approx(pld_composition([gaussian], 1e-6) + 2.0)  # type: ignore[operator]
    assert pld_composition([alg1], 1e-6) == 2.0
    assert pld_composition([gaussian, alg1], 1e-6) is None  # no delta left for the Gaussian part


def test_one_gaussian_charge_composes_to_itself() -> None:
    assert pld_composition([gaussian_charge(1.0, 1e-5)], 1e-5) == pytest.approx(1.0, abs=2e-3)


def test_equal_charges_composed_together_match_one_by_one_and_are_remembered() -> None:
    """``pld_composition`` composes equal events with one self-composition, and remembers its answers; the
    epsilon is the one dp_accounting gives when the events are composed one at a time."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from shared.privacy import accounting

    ideal = {"epsilon_margin": 0.0, "delta_margin": 0.0}  # ideal mechanisms: no sampler margins
    charges = [Charge(1.0, 1e-6, {"kind": "gaussian", "noise_multiplier": 3.0, **ideal})] * 12 + [
        Charge(0.5, 1e-6, {"kind": "gdp", "mu": 0.5, **ideal})
    ] * 3
    one_by_one = pld_privacy_accountant.PLDAccountant()
    for c in charges:
        one_by_one.compose(c.event())
    expected = one_by_one.get_epsilon(15e-6)
    before = accounting._pld_composition.cache_info().hits
    got = pld_composition(charges, 15e-6)
    assert got == pytest.approx(expected, rel=1e-3)
    assert pld_composition(list(charges), 15e-6) == got
    assert accounting._pld_composition.cache_info().hits == before + 1
    assert isinstance(charges[0].event(), dp_accounting.GaussianDpEvent)


def test_many_gaussian_charges_compose_in_closed_form_as_the_pld_accountant_does() -> None:
    """Gaussian charges compose exactly to one Gaussian (mu = sqrt(sum mu_i^2)): the ledger's epsilon is that
    mechanism's, in closed form, and agrees with dp_accounting's PLD accountant composing them one by one;
    the samplers' margins are folded in as for one mechanism (delta_0 = (delta - sum of delta margins)
    e^(-E / 2), plus E, the sum of the epsilon margins)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    charges = [gaussian_charge(1.0, 1e-6)] * 12 + [gdp_charge(0.5, 1e-6)] * 5
    total_delta = 17e-6
    margins = [c.margins() for c in charges]
    e_margin = math.fsum(m[0] for m in margins if m)
    ideal_delta = (total_delta - math.fsum(m[1] for m in margins if m)) * math.exp(-0.5 * e_margin)
    composed = pld_composition(charges, total_delta)
    accountant = pld_privacy_accountant.PLDAccountant()
    for charge in charges:
        accountant.compose(charge.event())  # type: ignore[arg-type]
    assert composed == pytest.approx(accountant.get_epsilon(ideal_delta) + e_margin, rel=5e-3)
    mu = math.sqrt(sum(1 / c.event().noise_multiplier ** 2 for c in charges))  # type: ignore[union-attr]
    assert composed == pytest.approx(get_epsilon_gaussian(1 / mu, ideal_delta) + e_margin, rel=1e-6)
    assert e_margin > 0 and isinstance(charges[0].event(), dp_accounting.GaussianDpEvent)
    # 1000 charges: composed as one (the ledger of an audit's releases reads in milliseconds)
    many = [gaussian_charge(4.0, 1e-5, d=2)] * 1000
    cal = calibrate(4.0, 1e-5, 2)
    e_many = 1000 * cal.sampler.epsilon
    ideal_many = (1e-2 - 1000 * cal.sampler.delta) * math.exp(-0.5 * e_many)
    mu_many = math.sqrt(1000) / cal.noise_multiplier
    assert pld_composition(many, 1e-2) == pytest.approx(
        get_epsilon_gaussian(1 / mu_many, ideal_many) + e_many, rel=1e-6
    )


def test_one_release_composes_to_its_own_charge_and_charges_without_margins_add_up() -> None:
    """With its sampler's margins folded in, one release's composed epsilon is its charge (the calibration
    met it, with its margins, from below); a charge recorded without margins is composed by basic
    composition (its charged epsilon already includes them)."""
    one = gaussian_charge(1.0, 1e-5, d=6)
    composed = pld_composition([one], 1e-5)
    assert composed is not None and 1.0 - 1e-6 <= composed <= 1.0 + 1e-12
    legacy = Charge(1.0, 1e-5, {"kind": "gaussian", "noise_multiplier": one.native["noise_multiplier"]})  # type: ignore[index]
    assert legacy.event() is None and pld_composition([legacy], 1e-5) == 1.0
    assert pld_composition([legacy, one], 2e-5) == pytest.approx(1.0 + composed, rel=1e-12)
