"""The Gaussian release (``shared.privacy.gaussian``): calibration, the lattice, the noise, the release.

References computed independently here: Balle & Wang's exact condition (ICML 2018, Thm. 8) written out with
scipy, the classical bound sqrt(2 ln(1.25/delta)) / epsilon (Dwork & Roth, Thm. A.1), and OpenDP's exact
discrete-Gaussian sampler for the noise distribution.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from shared.errors import InputDataError
from shared.privacy.gaussian import (
    MAX_SIGMA_STEPS,
    RELAXATION,
    calibrate,
    epsilon_for_change,
    gaussian_release,
    lattice_noise,
)
from shared.privacy.gdp import noise_multiplier_for
from shared.privacy.lattice import sampler_margins


def balle_wang_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """delta(sigma) = Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D) (Balle & Wang 2018, Thm. 8)."""
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    return float(stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b))


@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-6), (1.0, 1e-5), (math.exp(1.1), 1e-5), (8.0, 1e-3)])
@pytest.mark.parametrize("d", [1, 7, 2000])
def test_calibration_is_the_smallest_sigma_of_the_exact_condition(
    epsilon: float, delta: float, d: int
) -> None:
    cal = calibrate(epsilon, delta, d)
    m = cal.sampler
    # the margins are the sampler's at this noise (and window): recomputed independently they are no larger
    again = sampler_margins(d, cal.noise_multiplier, delta, window_bits=m.window_bits)
    assert again.epsilon == m.epsilon and again.delta <= m.delta
    assert 0 < m.epsilon < 2e-4 * epsilon and 0 < m.delta <= delta / 1024
    # the ideal mechanism is exactly (epsilon - margin, delta less margin) at the lattice's sensitivity, so
    # the implemented one is (epsilon, delta); and not more noise than needed for that (1e-6 relative)
    ideal = balle_wang_delta(cal.sigma, epsilon - m.epsilon, cal.sensitivity)
    assert math.exp(m.epsilon / 2) * ideal + m.delta <= delta
    smaller = balle_wang_delta(cal.sigma * (1 - 1e-6), epsilon - m.epsilon, cal.sensitivity)
    assert smaller > m.ideal_delta(delta)
    assert cal.sigma == pytest.approx(cal.noise_multiplier * cal.sensitivity, rel=1e-15)
    # the lattice: a power of two, public (a function of epsilon, delta, d), barely adds sensitivity
    assert cal.granularity == 2.0**cal.granularity_exponent
    assert 1.0 < cal.sensitivity <= 1.0 + RELAXATION * 1.0001
    assert cal.sigma / cal.granularity <= MAX_SIGMA_STEPS * 1.01
    if epsilon < 1:  # the classical bound is valid (and looser) for epsilon < 1
        assert cal.sigma < math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def exact_delta(z: float, epsilon: float) -> float:
    """Balle & Wang's delta of noise multiplier z, in 60-digit arithmetic (mpmath): the reference."""
    import mpmath as mp

    with mp.workdps(60):
        zz, eps = mp.mpf(z), mp.mpf(epsilon)
        return float(mp.ncdf(1 / (2 * zz) - eps * zz) - mp.e**eps * mp.ncdf(-1 / (2 * zz) - eps * zz))


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    [(1e-6, 1e-100), (1e-3, 1e-300), (1e-6, 1e-10), (50.0, 1e-100), (1.0, 1e-5), (100.0, 0.5), (1e-4, 0.9)],
)
def test_the_noise_multiplier_holds_at_extreme_epsilon_and_delta(epsilon: float, delta: float) -> None:
    """delta(z) <= delta in exact arithmetic, and z is not more than 1e-6 above the smallest such z (the
    ideal mechanism's calibration; ``calibrate`` runs it at epsilon and delta less the sampler's margins)."""
    z = noise_multiplier_for(epsilon, delta)
    assert exact_delta(z, epsilon) <= delta
    assert exact_delta(z * (1 - 1e-6), epsilon) > delta


def test_the_root_finder_alone_overshoots_delta_at_the_extreme() -> None:
    """The control for the test above: dp-accounting's z alone gives 1.0000146 delta at (1e-6, 1e-100);
    the check in log space steps it up."""
    from dp_accounting.gaussian_mechanism import get_sigma_gaussian

    assert exact_delta(get_sigma_gaussian(1e-6, 1e-100), 1e-6) > 1e-100 * (1 + 1e-5)
    assert noise_multiplier_for(1e-6, 1e-100) > get_sigma_gaussian(1e-6, 1e-100)


@pytest.mark.parametrize(
    ("epsilon", "delta", "d", "what"),
    [
        (
            1.0,
            1e-100,
            3,
            "delta = 1e-100 is too small",
        ),  # beyond the sampler's reach: no window is dense enough
        (50.0, 1e-6, 40, "delta = 1e-06 is too small"),  # the neighbour's mean lies 6.4 sigma away
        (1e-9, 1e-5, 10**6, "epsilon = 1e-09 is too small"),
    ],
)
def test_a_claim_the_sampler_cannot_back_is_refused_with_what_to_change(
    epsilon: float, delta: float, d: int, what: str
) -> None:
    with pytest.raises(InputDataError, match=what) as err:
        calibrate(epsilon, delta, d)
    assert "choose" in str(err.value).lower()


def test_the_largest_epsilon_backed_at_delta_1e_6_is_above_27() -> None:
    """What a release can claim at all (docs/privacy.md): epsilon 27 at delta 1e-6 for 50 features."""
    assert calibrate(27.0, 1e-6, 50).noise_multiplier > 0
    with pytest.raises(InputDataError):
        calibrate(29.0, 1e-6, 50)


def test_the_issue_number_sigma_139_at_e_to_the_1_1() -> None:
    assert calibrate(math.exp(1.1), 1e-5, 2).sigma == pytest.approx(1.389, abs=1e-3)


def test_larger_changes_cost_more_epsilon() -> None:
    cal = calibrate(1.0, 1e-5, 7)
    assert epsilon_for_change(cal, 1.0) == pytest.approx(1.0, rel=1e-6)
    assert epsilon_for_change(cal, 1.0) <= 1.0
    eps = [epsilon_for_change(cal, c) for c in (1.0, 2.0, 5.0)]
    assert eps[0] < eps[1] < eps[2]
    # a change of norm 2 is a unit change under half the noise multiplier: Balle & Wang again, at that
    # change's sampler margins
    m = sampler_margins(7, cal.noise_multiplier / 2, 1e-5)
    assert balle_wang_delta(cal.noise_multiplier, eps[1] - m.epsilon, 2.0) == pytest.approx(
        m.ideal_delta(1e-5), rel=1e-4
    )
    # a person's three rows: three rows' entries can differ, a larger margin (and never a smaller epsilon)
    assert epsilon_for_change(cal, 2.0, rows=3) >= eps[1]
    # a change of 20 moves the mean by ~5.4 sigma: no epsilon is proven at delta 1e-5 there
    with pytest.raises(InputDataError, match="not covered by a proven epsilon"):
        epsilon_for_change(cal, 20.0)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_bad_epsilon_is_refused(bad: object) -> None:
    with pytest.raises(InputDataError, match="epsilon"):
        calibrate(bad, 1e-5, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, 1, 1.5, -1e-9, float("nan")])
def test_bad_delta_is_refused(bad: float) -> None:
    with pytest.raises(InputDataError, match="delta"):
        calibrate(1.0, bad, 3)


# ------------------------------------------------------------------------------------------------ noise


def test_noise_is_gaussian_ks_test_with_a_control_that_fails() -> None:
    """KS test at alpha = 1e-6 against N(0, steps^2); the same test rejects noise at half the scale."""
    steps = 123456.7
    rng = np.random.default_rng(20261123)
    E = lattice_noise((200_000,), steps, rng)
    assert E.dtype == np.float64 and np.array_equal(E, np.rint(E))  # integers (exact below 2^53)
    assert stats.kstest(E / steps, "norm").pvalue > 1e-6
    half = lattice_noise((200_000,), steps / 2, rng)
    assert stats.kstest(half / steps, "norm").pvalue < 1e-6


def test_noise_matches_opendps_exact_discrete_gaussian_sampler() -> None:
    """Two-sample KS test (alpha = 1e-6) between our integer noise and OpenDP's exact sampler at the same
    scale (OpenDP: ~13 microseconds per draw, which is why the release does not call it per entry)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    scale = 40.0
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=float)
    exact = np.array(dp.m.make_gaussian(*space, scale=scale)([0] * 20_000), dtype=float)
    ours = lattice_noise((20_000,), scale, np.random.default_rng(7)).astype(float)
    assert stats.ks_2samp(ours, exact).pvalue > 1e-6
    assert stats.ks_2samp(ours * 0.8, exact).pvalue < 1e-6  # control: a 20% narrower sampler is caught


# ---------------------------------------------------------------------------------------------- release


def data(n: int = 500, d: int = 4, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(loc=50.0, scale=10.0, size=(n, d))


def test_release_is_centred_features_plus_noise_of_the_claimed_scale() -> None:
    X = data(n=20_000, d=3)
    rel = gaussian_release(X, epsilon=1.0, delta=1e-6, rng=np.random.default_rng(3))
    assert rel.Z.shape == X.shape and not rel.projected
    noise = rel.Z - (X - X.mean(axis=0))
    sigma = rel.calibration.sigma
    # centring after the noise removes its column means: per-entry variance sigma^2 (1 - 1/n)
    np.testing.assert_allclose(rel.Z.mean(axis=0), 0.0, atol=1e-9 * sigma)
    assert stats.kstest(noise.ravel() / (sigma * math.sqrt(1 - 1 / X.shape[0])), "norm").pvalue > 1e-6
    assert stats.kstest(noise.ravel() / (sigma / 2), "norm").pvalue < 1e-6  # control


def test_outputs_lie_on_a_lattice_that_does_not_depend_on_the_data() -> None:
    """Before centring every output is an integer multiple of g (the floating-point defence): checked by
    undoing the centring, on two datasets that differ in the low-order bits of one value."""
    X = data(n=50, d=2)
    X2 = X.copy()
    X2[0, 0] = np.nextafter(X2[0, 0], np.inf)
    for A in (X, X2):
        rel = gaussian_release(A, epsilon=2.0, delta=1e-6, rng=np.random.default_rng(5))
        g = rel.calibration.granularity
        # Z = Y - mean(Y); the mean of Y is not stored, but differences of rows are lattice differences
        diffs = (rel.Z[1:] - rel.Z[0]) / g
        np.testing.assert_allclose(diffs, np.round(diffs), atol=1e-6)


def test_blocks_do_not_change_the_result() -> None:
    """Each noise block draws from its own streams, keyed from the generator (``noise_blocks``: boundaries
    from (n, d) only): the same generator gives the same release whatever the rows read at a time
    (streaming is an implementation detail, not a different mechanism)."""
    X = data(n=1001, d=5)
    a = gaussian_release(X, epsilon=1.0, delta=1e-6, r=3, rng=np.random.default_rng(9), block_rows=10)
    b = gaussian_release(X, epsilon=1.0, delta=1e-6, r=3, rng=np.random.default_rng(9), block_rows=10**6)
    assert a.Z.shape == (1001, 3) and a.projected
    np.testing.assert_allclose(a.Z, b.Z, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.Z.mean(axis=0), 0.0, atol=1e-9)


def test_memmap_input_streams(tmp_path) -> None:
    X = data(n=3000, d=4)
    path = tmp_path / "x.npy"
    np.save(path, X)
    mm = np.load(path, mmap_mode="r")
    rel = gaussian_release(mm, epsilon=1.0, delta=1e-6, rng=np.random.default_rng(2), block_rows=256)
    noise = rel.Z - (X - X.mean(axis=0))
    assert abs(noise.std() / rel.calibration.sigma - 1) < 0.05


def test_projection_is_post_processing_of_the_noisy_rows() -> None:
    """With r < d, Z = Yc M / sqrt(r): pairwise distances of Z approximate those of the noisy rows (JL)."""
    X = data(n=300, d=40, seed=4)
    rel = gaussian_release(X, epsilon=25.0, delta=1e-6, r=30, rng=np.random.default_rng(8))
    assert rel.Z.shape == (300, 30) and rel.projected
    i, j = np.triu_indices(300, 1)
    Xc = X - X.mean(axis=0)
    ratio = np.linalg.norm(rel.Z[i] - rel.Z[j], axis=1) / np.linalg.norm(Xc[i] - Xc[j], axis=1)
    assert 0.9 < np.median(ratio) < 1.1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"r": 4}, "r = 4 is not below d = 4"),
        ({"r": 0}, "r must be an integer >= 1"),
        ({"r": 2.0}, "r must be an integer >= 1"),
        ({"epsilon": -1.0}, "epsilon must be a finite number > 0"),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict, message: str) -> None:
    params = {"epsilon": 1.0, "delta": 1e-6} | kwargs
    with pytest.raises(InputDataError, match=message):
        gaussian_release(data(n=10, d=4), **params)


def test_non_finite_and_huge_values_are_refused_by_position_not_value() -> None:
    X = data(n=10, d=3)
    X[4, 2] = np.nan
    with pytest.raises(InputDataError, match="row 4, column 2 is NaN or infinite"):
        gaussian_release(X, epsilon=1.0, delta=1e-6)
    X[4, 2] = 1e30
    with pytest.raises(InputDataError, match="rescale the features") as err:
        gaussian_release(X, epsilon=1.0, delta=1e-6)
    assert "1e+30" not in str(err.value)


def test_default_randomness_is_fresh() -> None:
    X = data(n=5, d=2)
    assert not np.array_equal(
        gaussian_release(X, epsilon=1.0, delta=1e-6).Z, gaussian_release(X, epsilon=1.0, delta=1e-6).Z
    )
