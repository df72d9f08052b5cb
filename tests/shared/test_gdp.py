"""mu-GDP accounting and the DP-GIBO noise (``shared.privacy.gdp``)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.gaussian_mechanism import get_epsilon_gaussian
from dp_accounting.pld import pld_privacy_accountant
from scipy.stats import norm

from shared.errors import InputDataError
from shared.privacy.accounting import Charge, pld_composition
from shared.privacy.gdp import (
    compose_gdp,
    gdp_delta,
    gdp_epsilon,
    gdp_epsilon_pld,
    gibo_noise_std,
    per_step_mu,
)

DELTA = 1e-5


# --- closed form -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mu", [0.1, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("epsilon", [0.0, 0.3, 1.0, 4.0])
def test_delta_matches_the_naive_formula_where_that_is_safe(mu: float, epsilon: float) -> None:
    naive = norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
    assert gdp_delta(mu, epsilon) == pytest.approx(naive, rel=1e-9, abs=1e-300)


def test_delta_at_zero_is_the_total_variation_of_the_two_gaussians() -> None:
    assert gdp_delta(1.0, 0.0) == pytest.approx(2 * norm.cdf(0.5) - 1, rel=1e-12)


def test_delta_is_stable_far_in_the_tail() -> None:
    """Where e^epsilon overflows and both Phi terms underflow, the log-space form still answers (and the
    naive one would give nan or 0 - inf)."""
    for mu, eps in [(1.0, 800.0), (1.0, 1e4), (1e-3, 1e3), (50.0, 1e3), (1e3, 1e6)]:
        value = gdp_delta(mu, eps)
        assert math.isfinite(value) and 0.0 <= value <= 1.0
    # delta(eps) ~ phi(a)/|a| - ... : at mu = 1, eps = 30, well below 1e-100 but representable
    tiny = gdp_delta(1.0, 30.0)
    assert 0.0 < tiny < 1e-100
    # monotone and positive through the range where it is representable
    eps = np.linspace(0.0, 35.0, 200)
    values = np.array([gdp_delta(1.0, e) for e in eps])
    assert (np.diff(values) < 0).all() and (values > 0).all()


def test_epsilon_of_mu_one_at_1e_5_is_4_38() -> None:
    assert gdp_epsilon(1.0, DELTA) == pytest.approx(4.3772, abs=1e-4)


@pytest.mark.parametrize("mu", [0.05, 0.5, 1.0, 2.0, 10.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10, 1e-100])
def test_epsilon_inverts_delta_and_is_never_too_small(mu: float, delta: float) -> None:
    eps = gdp_epsilon(mu, delta)
    assert gdp_delta(mu, eps) <= delta
    if eps > 0:
        assert gdp_delta(mu, eps) == pytest.approx(delta, rel=1e-8)
        assert gdp_delta(mu, max(eps - 1e-9 * max(eps, 1.0), 0.0)) > delta  # the smallest such epsilon


def test_epsilon_agrees_with_the_exact_gaussian_mechanism_of_dp_accounting() -> None:
    """A Gaussian mechanism with noise multiplier sigma is (1/sigma)-GDP (Dong, Roth & Su, Thm. 2.7)."""
    for mu in (0.5, 1.0, 2.0):
        assert gdp_epsilon(mu, DELTA) == pytest.approx(get_epsilon_gaussian(1 / mu, DELTA), rel=1e-9)


def test_epsilon_is_zero_when_delta_covers_the_whole_tradeoff() -> None:
    assert gdp_epsilon(0.01, 0.5) == 0.0  # delta(0) = 2 Phi(0.005) - 1 ~ 0.004


@pytest.mark.parametrize(
    "call",
    [
        lambda: gdp_delta(0.0, 1.0),
        lambda: gdp_delta(-1.0, 1.0),
        lambda: gdp_delta(1.0, -0.1),
        lambda: gdp_delta(math.nan, 1.0),
        lambda: gdp_epsilon(1.0, 0.0),
        lambda: gdp_epsilon(1.0, 1.0),
        lambda: gdp_epsilon(math.inf, 1e-5),
        lambda: per_step_mu(1.0, 0),
        lambda: per_step_mu(1.0, 2.5),  # type: ignore[arg-type]
        lambda: compose_gdp([1.0, -1.0]),
        lambda: gibo_noise_std(1.0, 0, 1.0, 10),
    ],
)
def test_bad_parameters_are_refused(call) -> None:
    with pytest.raises(InputDataError):
        call()


# --- composition -----------------------------------------------------------------------------------------


def test_composition_and_per_step_mu_are_inverse() -> None:
    assert compose_gdp([0.3, 0.4]) == pytest.approx(0.5)
    assert compose_gdp([]) == 0.0
    for mu, steps in [(1.0, 1), (1.0, 30), (0.5, 7), (2.0, 1000)]:
        assert compose_gdp([per_step_mu(mu, steps)] * steps) == pytest.approx(mu, rel=1e-12)


def test_gibo_noise_is_the_gaussian_mechanism_at_the_replace_one_sensitivity() -> None:
    """Algorithm 1, line 8: std 2 B sqrt(T) / (n mu); sensitivity 2B/n (proof of Lemma 3.1)."""
    B, n, mu, T = 1.5, 200, 1.0, 30
    std = gibo_noise_std(B, n, mu, T)
    assert std == pytest.approx(2 * B * math.sqrt(T) / (n * mu))
    assert (2 * B / n) / std == pytest.approx(per_step_mu(mu, T))


# --- PLD cross-check and the REPLACE_ONE trap --------------------------------------------------------------


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("steps", [1, 30])
def test_closed_form_and_add_or_remove_pld_agree(mu: float, steps: int) -> None:
    closed = gdp_epsilon(mu, DELTA)
    assert gdp_epsilon_pld(mu, steps, DELTA) == pytest.approx(closed, rel=1e-2)


def test_pld_composed_step_by_step_agrees_too() -> None:
    """Not through SelfComposedDpEvent (which dp-accounting folds into one Gaussian) but 30 real PLD
    convolutions: the discretisation error stays far below 1e-2."""
    mu, steps = 1.0, 30
    accountant = pld_privacy_accountant.PLDAccountant()
    event = dp_accounting.GaussianDpEvent(math.sqrt(steps) / mu)
    for _ in range(steps):
        accountant.compose(event)
    assert accountant.get_epsilon(DELTA) == pytest.approx(gdp_epsilon(mu, DELTA), rel=1e-2)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_replace_one_would_double_the_sensitivity_and_overcharge(mu: float) -> None:
    """The trap, pinned so nobody "fixes" the accounting the wrong way: the DP-GIBO noise is already
    calibrated to the replace-one sensitivity 2B/n, so GaussianDpEvent(sqrt(T)/mu) belongs under the default
    ADD_OR_REMOVE_ONE relation. Under REPLACE_ONE, dp-accounting doubles the sensitivity again and charges
    the epsilon of 2 mu (about 10.0 instead of 4.38 at mu = 1, delta = 1e-5)."""
    steps = 30
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(math.sqrt(steps) / mu), steps)
    replace = pld_privacy_accountant.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    replace.compose(event)
    doubled = replace.get_epsilon(DELTA)
    assert doubled == pytest.approx(gdp_epsilon(2 * mu, DELTA), rel=1e-2)
    assert doubled > 2 * gdp_epsilon_pld(mu, steps, DELTA)
    if mu == 1.0:
        assert doubled == pytest.approx(10.0, abs=0.01)
        assert gdp_epsilon_pld(mu, steps, DELTA) == pytest.approx(4.38, abs=0.01)


def test_ledger_convention_matches() -> None:
    """A ``{"kind": "gdp", "mu": mu}`` charge of ``shared.privacy.accounting`` costs the same epsilon."""
    ideal = {"epsilon_margin": 0.0, "delta_margin": 0.0}  # the ideal mechanism: no sampler margins
    charge = Charge(gdp_epsilon(1.0, DELTA), DELTA, {"kind": "gdp", "mu": 1.0, **ideal})
    assert pld_composition([charge], DELTA) == pytest.approx(gdp_epsilon_pld(1.0, 30, DELTA), rel=1e-6)


# --- the OpenDP sampler ----------------------------------------------------------------------------------


def test_opendp_privacy_map_is_the_per_step_mu() -> None:
    """OpenDP charges zCDP rho = (s/std)^2 / 2 at sensitivity s = 2B/n; for a Gaussian that is
    mu_step^2 / 2 (mu-GDP and mu^2/2-zCDP describe the same mechanism), and T steps sum to mu^2 / 2."""
    import opendp.prelude as dp

    B, n, mu, steps, d = 1.0, 1000, 1.0, 30, 5
    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=d)
    measurement = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=gibo_noise_std(B, n, mu, steps))
    rho = measurement.map(2 * B / n)
    assert rho == pytest.approx(per_step_mu(mu, steps) ** 2 / 2, rel=1e-9)
    assert steps * rho == pytest.approx(mu**2 / 2, rel=1e-9)
    # OpenDP's zCDP -> (eps, delta) conversion is an upper bound on the exact GDP curve, and not far off
    eps_opendp, delta_opendp = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(measurement), DELTA).map(
        2 * B / n
    )
    exact = gdp_epsilon(per_step_mu(mu, steps), DELTA)
    assert delta_opendp == DELTA and exact <= eps_opendp <= 1.2 * exact
