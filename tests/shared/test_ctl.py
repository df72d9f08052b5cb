"""CTL(epsilon), the output mechanism (LDP-BO, Lemma 1): clipping, the Laplace scale, what one answer
costs, and the empirical audit on the two outcomes furthest apart.

OpenDP draws the noise from an OS-seeded generator that cannot be seeded, so the statistical tests use
tolerances that a correct sampler fails with probability below 1e-6 (and controls that must fail)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from shared.errors import InputDataError
from shared.privacy.audit import AUDITS
from shared.privacy.ctl import CTL


def test_clipping_then_noise_has_the_declared_laplace_scale() -> None:
    ctl = CTL(0.5, B=2.0, R=1.0)
    assert (ctl.bound, ctl.sensitivity, ctl.scale) == (3.0, 6.0, 12.0)
    y = np.linspace(-50.0, 50.0, 20_000)  # most outcomes far outside [-3, 3]: clipping must bring them in
    noise = ctl.privatise(y) - np.clip(y, -3.0, 3.0)
    assert stats.kstest(noise, "laplace", args=(0.0, 12.0)).pvalue > 1e-6
    assert stats.kstest(noise, "laplace", args=(0.0, 6.0)).pvalue < 1e-6  # control: half the scale
    assert stats.kstest(ctl.privatise(y) - y, "laplace", args=(0.0, 12.0)).pvalue < 1e-6  # unclipped: no
    # the variance GP-UCB's fit takes as its noise floor: 2 x 12^2 (the sample's s.d. is ~1.6 % of it)
    assert ctl.noise_variance == 288.0 and abs(float(np.var(noise)) / 288.0 - 1.0) < 0.1


def test_a_scalar_answer_is_a_float_and_answers_are_fresh() -> None:
    ctl = CTL(1.0, B=1.0, R=0.5)
    a, b = ctl.privatise(0.2), ctl.privatise(0.2)
    assert isinstance(a, float) and a != b  # a fresh draw per answer (P(equal) is negligible)
    assert ctl.privatise(np.zeros((3, 2))).shape == (3, 2) and ctl.privatise([]).shape == (0,)


def test_the_charged_epsilon_is_opendps_map_a_hair_above_the_nominal_one() -> None:
    for eps in (0.1, 0.5, 1.0, 2.0):
        charged = CTL(eps, B=1.0, R=1.0).charged_epsilon
        assert eps <= charged <= eps * (1 + 1e-6)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"epsilon": 0.0, "B": 1.0, "R": 1.0}, "epsilon must be a finite number > 0"),
        ({"epsilon": math.inf, "B": 1.0, "R": 1.0}, "epsilon"),
        ({"epsilon": 1.0, "B": -1.0, "R": 1.0}, "B must be a finite number >= 0"),
        ({"epsilon": 1.0, "B": 1.0, "R": math.nan}, "R must be"),
        ({"epsilon": 1.0, "B": 0.0, "R": 0.0}, "B + R must be > 0"),
    ],
)
def test_bad_parameters_say_what_is_wrong(kwargs: dict[str, float], words: str) -> None:
    with pytest.raises(InputDataError, match=words.replace("+", r"\+")):
        CTL(**kwargs)


def test_a_non_finite_outcome_is_refused_not_answered() -> None:
    with pytest.raises(InputDataError, match="finite"):
        CTL(1.0, B=1.0, R=1.0).privatise([0.0, math.nan])


def test_ctl_is_registered_for_pobo_audit_privacy() -> None:
    mechanism, *controls = AUDITS["ctl (output privacy)"]()
    assert mechanism.claimed_epsilon == CTL(1.0, B=1.0, R=1.0).charged_epsilon
    assert mechanism.claim.kind == "pure" and [c.control for c in controls] == [
        "sensitivity x1.5",
        "float addition",
    ]
    # the audit itself (CTL within its claim and tight, both controls caught) is in tests/shared/test_audit.py
