"""The empirical privacy audit (``shared.privacy.audit``) on every mechanism pobo ships.

* the Gaussian release stays within its claimed epsilon, and the audit has power: its bound is not
  trivially far below the claim;
* a broken Gaussian mechanism (half the noise its claim needs) is caught: the control that gives the audit
  its teeth;
* the paper's Algorithm 1 (both lift modes) meets a perfect distinguisher: no error in either direction,
  a bound above the claim that only the number of trials limits (the finding of docs/privacy.md).

Fixed seeds; the bounds are one-sided Clopper-Pearson at 95 %.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.privacy.audit import (
    AUDITS,
    Mechanism,
    broken_gaussian_mechanism,
    clopper_pearson_upper,
    epsilon_lower_bound,
    gaussian_mechanism,
    po_gp_ucb_mechanism,
    run_all,
    run_audit,
)


def test_clopper_pearson_upper_bound() -> None:
    # no event in n trials: the bound solves (1 - p)^n = alpha
    assert clopper_pearson_upper(0, 1000, 0.025) == pytest.approx(1 - 0.025 ** (1 / 1000), rel=1e-9)
    assert clopper_pearson_upper(1000, 1000, 0.025) == 1.0
    # 300 of 1000: the bound sits above the estimate by ~2 standard errors
    assert 0.32 < clopper_pearson_upper(300, 1000, 0.025) < 0.33
    with pytest.raises(ValueError):
        clopper_pearson_upper(5, 4, 0.05)


def test_epsilon_lower_bound_formula() -> None:
    assert epsilon_lower_bound(0.01, 0.5, 0.0) == pytest.approx(math.log(0.5 / 0.01))
    assert epsilon_lower_bound(0.5, 0.01, 0.0) == pytest.approx(math.log(0.5 / 0.01))  # the mirror
    assert epsilon_lower_bound(0.5, 0.5, 1e-5) == 0.0  # a coin flip proves nothing
    assert epsilon_lower_bound(0.2, 0.7, 0.0) == pytest.approx(math.log(0.3 / 0.2))  # max of both


def test_the_gaussian_release_stays_within_its_claim_and_the_audit_has_power() -> None:
    result = run_audit(
        gaussian_mechanism(), trials=50_000, calibration_trials=10_000, rng=np.random.default_rng(1)
    )
    assert result.formal_guarantee and result.claimed_epsilon == 1.0
    assert result.within_claim, result.row()
    assert result.empirical_epsilon_lower_bound >= 0.4 * result.claimed_epsilon, result.row()
    row = result.row()
    assert {"mechanism", "claimed_epsilon", "delta", "trials", "empirical_epsilon_lower_bound"} <= set(row)


def test_the_audit_catches_a_mechanism_with_half_the_noise() -> None:
    result = run_audit(
        broken_gaussian_mechanism(), trials=50_000, calibration_trials=10_000, rng=np.random.default_rng(2)
    )
    assert not result.within_claim, result.row()
    assert result.empirical_epsilon_lower_bound > 1.1 * result.claimed_epsilon


@pytest.mark.parametrize("lift", ["auto", "always"])
def test_algorithm_1_meets_a_perfect_distinguisher(lift: str) -> None:
    mechanism = po_gp_ucb_mechanism(lift=lift)  # type: ignore[arg-type]
    result = run_audit(mechanism, trials=1000, calibration_trials=300, rng=np.random.default_rng(3))
    assert not result.formal_guarantee
    assert result.perfect_distinguisher and result.false_positives == result.false_negatives == 0
    assert not result.within_claim
    # zero errors in T trials: the bound is ln((1 - delta - u) / u) with u ~ 3.7 / T, growing without limit
    u = 1 - 0.025 ** (1 / 1000)
    assert result.empirical_epsilon_lower_bound == pytest.approx(math.log((1 - 1e-5 - u) / u), rel=1e-9)
    assert result.empirical_epsilon_lower_bound > 5 * result.claimed_epsilon


def test_every_shipped_mechanism_is_registered() -> None:
    names = {make().name for make in AUDITS.values()}
    assert names == {"gaussian", "ctl (output privacy)", "po-gp-ucb (lift=auto)", "po-gp-ucb (lift=always)"}


def test_run_all_takes_another_registry() -> None:
    # how pobo audit privacy adds mechanisms of shared.bo, which shared.privacy may not import
    def coin(neighbour: bool, trials: int, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_normal(trials)

    registry = {"coin": lambda: Mechanism("coin", 1.0, 1e-5, True, "none", coin)}
    (result,) = run_all(trials=100, calibration_trials=100, registry=registry)
    assert result.mechanism == "coin" and result.within_claim
    with pytest.raises(ValueError, match="unknown mechanism"):
        run_all(["gaussian"], registry=registry)
