"""GP-UCB (PO-GP-UCB Alg. 2, the modeler part): beta_t, the acquisition by hand, tie-breaking, rebuilds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.bo.gp import Hyperparameters, median_distance
from shared.bo.mle import fit_hyperparameters
from shared.bo.strategies import (
    GPUCB,
    Suggestion,
    default_refit_schedule,
    gp_ucb_beta,
    random_initial_indices,
)
from shared.errors import InputDataError, StrategyError


def candidates(n: int = 60, r: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2.0, 2.0, size=(n, r))


def f(z: np.ndarray) -> float:
    return float(np.sin(2.0 * z[0]) + 0.5 * np.cos(z[1:]).sum() - 0.1 * (z @ z))


def run(strategy: GPUCB, Z: np.ndarray, steps: int, noise_seed: int = 3) -> list[Suggestion]:
    rng = np.random.default_rng(noise_seed)
    out = []
    for _ in range(steps):
        s = strategy.suggest()
        out.append(s)
        strategy.observe(s.index, f(Z[s.index]) + rng.normal(0.0, 0.01))
    return out


# -- beta_t -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "t", "delta_prime", "expected"),
    [
        # 2 ln(100 * 9 * pi^2 / 0.3) = 2 ln(3000 pi^2)
        (100, 3, 0.05, 2 * (math.log(3000.0) + 2 * math.log(math.pi))),
        # 2 ln(1 * 1 * pi^2 / (6 * 0.5)) = 2 ln(pi^2 / 3)
        (1, 1, 0.5, 2 * math.log(math.pi**2 / 3)),
        (10000, 50, 0.025, 2 * math.log(10000 * 2500 * math.pi**2 / 0.15)),
    ],
)
def test_beta_by_hand(n: int, t: int, delta_prime: float, expected: float) -> None:
    assert gp_ucb_beta(n, t, delta_prime) == pytest.approx(expected, rel=1e-14)


def test_beta_value_literal() -> None:
    # 2 ln(3000 pi^2) = 2 (8.00636757 + 2.28945977) = 20.59165468...
    assert gp_ucb_beta(100, 3, 0.05) == pytest.approx(20.591654677, rel=1e-9)


@pytest.mark.parametrize("delta_prime", [0.0, 1.0, -0.5, 1.5, float("nan")])
def test_beta_rejects_bad_delta_prime(delta_prime: float) -> None:
    with pytest.raises(InputDataError, match="delta_prime must lie strictly between 0 and 1"):
        gp_ucb_beta(10, 1, delta_prime)
    with pytest.raises(ValueError, match="delta_prime"):
        GPUCB(candidates(), delta_prime=delta_prime)


@pytest.mark.parametrize(("n", "t"), [(0, 1), (5, 0), (-1, 3)])
def test_beta_rejects_bad_n_t(n: int, t: int) -> None:
    with pytest.raises(InputDataError, match="n and t must be >= 1"):
        gp_ucb_beta(n, t, 0.1)


# -- helpers ------------------------------------------------------------------------------------------------
def test_default_refit_schedule() -> None:
    expected = [*range(3, 11), 15, 20, 25, 30, 35, 40]
    assert [t for t in range(1, 41) if default_refit_schedule(t)] == expected


def test_random_initial_indices() -> None:
    a = random_initial_indices(20, 5, np.random.default_rng(0))
    assert a == random_initial_indices(20, 5, np.random.default_rng(0))
    assert len(set(a)) == 5 and all(0 <= i < 20 for i in a)
    assert all(isinstance(i, int) for i in a)
    assert sorted(random_initial_indices(4, 4, np.random.default_rng(1))) == [0, 1, 2, 3]
    assert random_initial_indices(4, 0, np.random.default_rng(1)) == []
    for k in (-1, 5):
        with pytest.raises(InputDataError, match=rf"initial points must be in \[0, 4\], got {k}"):
            random_initial_indices(4, k, np.random.default_rng(1))


# -- the acquisition by hand --------------------------------------------------------------------------------
HP = Hyperparameters(lengthscale=1.0, signal_variance=1.0, noise_variance=0.01)
TINY = np.array([[0.0], [1.0], [3.0]])


def _hand_ucb(y0: float) -> tuple[list[float], list[float], float]:
    """After observing y0 at z = 0: k(0, z) = exp(-z^2 / 2), K = 1 + 0.01 + jitter (zero prior mean)."""
    kdiag = 1.0 + 0.01 + 1e-10
    k = [1.0, math.exp(-0.5), math.exp(-4.5)]
    mean = [ki * y0 / kdiag for ki in k]
    std = [math.sqrt(1.0 - ki * ki / kdiag) for ki in k]
    beta = 2.0 * math.log(3 * 2**2 * math.pi**2 / (6 * 0.05))  # n = 3, t = 2
    return mean, std, beta


@pytest.mark.parametrize("exclude_queried", [True, False])
def test_acquisition_by_hand(exclude_queried: bool) -> None:
    s = GPUCB(TINY, hyperparameters=HP, prior_mean="zero", exclude_queried=exclude_queried)
    first = s.suggest()
    beta1 = 2.0 * math.log(3 * math.pi**2 / (6 * 0.05))
    # the prior is flat: mean 0, std 1 everywhere; ties go to index 0
    assert first == Suggestion(
        index=0, acquisition=math.sqrt(beta1), beta=pytest.approx(beta1), mean=0.0, std=1.0, t=1
    )

    s.observe(0, 0.5)
    mean, std, beta = _hand_ucb(0.5)
    ucb = [m + math.sqrt(beta) * sd for m, sd in zip(mean, std, strict=True)]
    # by hand: ucb ~ [0.839, 2.988, 3.465]; row 2 (farthest from the data) wins
    assert ucb[2] > ucb[1] > ucb[0]
    values, beta_s, t = s.acquisition()
    assert t == 2 and beta_s == pytest.approx(beta, rel=1e-14)
    expected = np.array(ucb)
    if exclude_queried:
        expected[0] = -np.inf
    np.testing.assert_allclose(values, expected, rtol=1e-12)
    sug = s.suggest()
    assert sug.index == 2 == int(np.argmax(expected))
    assert sug.t == 2
    assert sug.beta == pytest.approx(beta, rel=1e-14)
    assert sug.mean == pytest.approx(mean[2], rel=1e-12)
    assert sug.std == pytest.approx(std[2], rel=1e-12)
    assert sug.acquisition == pytest.approx(sug.mean + math.sqrt(sug.beta) * sug.std, rel=1e-14)
    assert sug.acquisition == pytest.approx(ucb[2], rel=1e-12)


def test_acquisition_exploits_a_high_observation() -> None:
    """y0 = 20 makes the observed row the maximiser: ucb ~ [20.14, 14.89, 3.68]."""
    s = GPUCB(TINY, hyperparameters=HP, prior_mean="zero", exclude_queried=False)
    s.observe(0, 20.0)
    mean, std, beta = _hand_ucb(20.0)
    ucb = [m + math.sqrt(beta) * sd for m, sd in zip(mean, std, strict=True)]
    assert int(np.argmax(ucb)) == 0
    sug = s.suggest()
    assert sug.index == 0
    assert sug.acquisition == pytest.approx(ucb[0], rel=1e-12)
    # so a repeat is suggested when allowed; the GP accepts the repeated observation
    s.observe(0, 20.0)
    assert s.observations == [(0, 20.0), (0, 20.0)]
    assert s.suggest().t == 3


# -- tie-breaking and exclusion -----------------------------------------------------------------------------
FAR = np.arange(6, dtype=np.float64)[:, None] * 100.0  # kernel values underflow to exactly 0 between rows


def test_flat_prior_ties_go_to_index_0() -> None:
    for prior_mean in ("zero", "empirical"):
        assert GPUCB(candidates(), hyperparameters=HP, prior_mean=prior_mean).suggest().index == 0


def test_ties_go_to_the_smallest_unqueried_index() -> None:
    s = GPUCB(FAR, hyperparameters=HP, prior_mean="zero", exclude_queried=True)
    for i in (0, 2):
        s.observe(i, 0.0)
    # rows 1, 3, 4, 5 have identical UCB (mean 0, std 1): the first of them
    values, _, _ = s.acquisition()
    assert values[1] == values[3] == values[4] == values[5]
    assert s.suggest().index == 1
    s.observe(1, 0.0)
    assert s.suggest().index == 3


def test_exclude_queried_never_repeats_then_raises() -> None:
    Z = candidates(n=12)
    s = GPUCB(Z, hyperparameters=HP, exclude_queried=True)
    chosen = [sug.index for sug in run(s, Z, 12)]
    assert sorted(chosen) == list(range(12))
    with pytest.raises(StrategyError, match="every one of the 12 candidates has been queried already"):
        s.suggest()
    with pytest.raises(RuntimeError):
        s.suggest()


def test_exclude_queried_false_can_repeat() -> None:
    # a sharply peaked objective at row 0 and a low beta (large delta') pin the suggestion there
    Z = np.array([[0.0], [0.3], [0.6], [5.0]])
    s = GPUCB(Z, hyperparameters=HP, prior_mean="zero", exclude_queried=False, delta_prime=0.9)
    s.observe(0, 10.0)
    chosen = []
    for _ in range(3):
        i = s.suggest().index
        chosen.append(i)
        s.observe(i, 10.0 if i == 0 else 0.0)
    assert chosen.count(0) >= 2


# -- Suggestion.t and the live loop -------------------------------------------------------------------------
def test_suggestion_t_is_observations_plus_one() -> None:
    Z = candidates()
    s = GPUCB(Z, hyperparameters=HP)
    for k, sug in enumerate(run(s, Z, 6)):
        assert sug.t == k + 1
        assert sug.beta == pytest.approx(gp_ucb_beta(Z.shape[0], k + 1, 0.05), rel=1e-14)
    assert len(s.observations) == 6
    assert s.suggest().t == 7


def test_mle_refits_on_schedule() -> None:
    Z = candidates()
    s = GPUCB(Z)  # "mle"
    initial = s.hyperparameters
    run(s, Z, 2)
    assert s.hyperparameters == initial  # no refit before t = 3
    run(s, Z, 1)
    assert s.hyperparameters != initial


@pytest.mark.parametrize("prior_mean", ["empirical", "zero"])
def test_mle_refit_uses_the_prior_mean(prior_mean: str) -> None:
    """The refit at t = 3 is the MLE on y minus the prior mean in use (mean of y, or 0)."""
    Z = candidates()
    idx = [4, 17, 33]
    y = np.array([f(Z[i]) for i in idx]) + 100.0  # a large offset: centred and raw y fit very differently
    s = GPUCB(Z, prior_mean=prior_mean)
    initial = s.hyperparameters
    assert initial == Hyperparameters(
        lengthscale=median_distance(Z), signal_variance=1.0, noise_variance=1e-2
    )
    for i, v in zip(idx, y, strict=True):
        s.observe(i, float(v))
    target = y - y.mean() if prior_mean == "empirical" else y
    assert s.hyperparameters == fit_hyperparameters(Z, np.array(idx), target)
    other = y if prior_mean == "empirical" else y - y.mean()
    assert s.hyperparameters != fit_hyperparameters(Z, np.array(idx), other)


def test_each_refit_is_the_mle_of_its_observations_alone() -> None:
    """A refit starts from the observations' own scale, never from the previous fit: at t = 15 the
    hyper-parameters are those of a fit on the 15 observations alone (what a rebuild computes)."""
    Z = candidates()
    rng = np.random.default_rng(5)
    idx = [int(i) for i in rng.choice(Z.shape[0], size=15, replace=False)]
    y = np.array([50.0 * f(Z[i]) for i in idx]) + rng.normal(0.0, 20.0, size=15)
    s = GPUCB(Z)
    for i, v in zip(idx, y, strict=True):
        s.observe(i, float(v))
    assert s.hyperparameters == fit_hyperparameters(Z, np.array(idx), y - y.mean())


def test_the_noise_floor_bounds_the_fitted_noise() -> None:
    """``noise_variance_floor``: the fit never assumes less noise than the output mechanism adds."""
    Z = candidates()
    idx = list(range(0, 60, 3))
    y = np.array([f(Z[i]) for i in idx])  # noiseless: the unbounded fit takes almost no noise
    free, floored = GPUCB(Z), GPUCB(Z, noise_variance_floor=0.5)
    for i, v in zip(idx, y, strict=True):
        free.observe(i, float(v))
        floored.observe(i, float(v))
    assert free.hyperparameters.noise_variance < 0.01
    assert floored.hyperparameters.noise_variance >= 0.5
    with pytest.raises(InputDataError, match="noise_variance_floor"):
        GPUCB(Z, noise_variance_floor=-1.0)


def test_custom_refit_schedule_never() -> None:
    Z = candidates()
    s = GPUCB(Z, refit_schedule=lambda t: False)
    initial = s.hyperparameters
    run(s, Z, 5)
    assert s.hyperparameters == initial


def test_bad_hyperparameters_option() -> None:
    with pytest.raises(InputDataError, match='hyperparameters must be "mle" or Hyperparameters'):
        GPUCB(candidates(), hyperparameters="map")


def test_observe_bad_input() -> None:
    s = GPUCB(candidates(n=5), hyperparameters=HP)
    with pytest.raises(InputDataError, match=r"index must be in \[0, 4\], got 5"):
        s.observe(5, 1.0)
    with pytest.raises(InputDataError, match="y must be finite"):
        s.observe(0, float("nan"))
    assert s.observations == []


# -- rebuilding from history --------------------------------------------------------------------------------
OPTIONS = [
    pytest.param({}, id="mle-empirical"),
    pytest.param({"prior_mean": "zero"}, id="mle-zero"),
    pytest.param({"hyperparameters": HP}, id="fixed-empirical"),
    pytest.param(
        {"hyperparameters": HP, "prior_mean": "zero", "exclude_queried": False}, id="fixed-zero-repeats"
    ),
    pytest.param({"delta_prime": 0.2, "refit_schedule": lambda t: t % 4 == 0}, id="mle-custom-schedule"),
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("steps", [0, 1, 9, 23])
def test_from_history_reproduces_live_state(options: dict, steps: int) -> None:
    Z = candidates()
    live = GPUCB(Z, **options)
    run(live, Z, steps)
    rebuilt = GPUCB.from_history(Z, live.observations, **options)
    assert isinstance(rebuilt, GPUCB)
    assert rebuilt.observations == live.observations
    assert rebuilt.hyperparameters == live.hyperparameters
    np.testing.assert_allclose(rebuilt.gp.mean(), live.gp.mean(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(rebuilt.gp.std(), live.gp.std(), rtol=0, atol=1e-9)
    a, b = live.suggest(), rebuilt.suggest()
    assert a.index == b.index and a.t == b.t == steps + 1
    assert b.acquisition == pytest.approx(a.acquisition, rel=1e-9)
    # both continue identically
    y = f(Z[a.index])
    live.observe(a.index, y)
    rebuilt.observe(b.index, y)
    assert live.suggest().index == rebuilt.suggest().index
    assert rebuilt.hyperparameters == live.hyperparameters


def test_from_history_equals_generic_replay() -> None:
    """GPUCB's batch rebuild vs a generic replay (observe one at a time)."""
    Z = candidates()
    live = GPUCB(Z)
    run(live, Z, 17)
    replayed = GPUCB(Z)
    for i, y in live.observations:
        replayed.observe(i, y)
    rebuilt = GPUCB.from_history(Z, live.observations)
    assert replayed.hyperparameters == rebuilt.hyperparameters
    np.testing.assert_allclose(replayed.gp.mean(), rebuilt.gp.mean(), rtol=0, atol=1e-9)
    assert replayed.suggest().index == rebuilt.suggest().index


def test_from_history_marks_queried_rows() -> None:
    Z = candidates(n=4)
    s = GPUCB.from_history(Z, [(0, 1.0), (1, 2.0), (2, 0.5)], hyperparameters=HP)
    assert s.suggest().index == 3
    s.observe(3, 0.0)
    with pytest.raises(StrategyError):
        s.suggest()


@pytest.mark.parametrize("index", [-1, 4])
def test_from_history_bad_index(index: int) -> None:
    with pytest.raises(InputDataError, match=r"observation indices must be in \[0, 3\]"):
        GPUCB.from_history(candidates(n=4), [(0, 1.0), (index, 1.0)], hyperparameters=HP)


@pytest.mark.parametrize("y", [float("nan"), float("inf")])
@pytest.mark.parametrize("options", [{"hyperparameters": HP}, {}], ids=["fixed", "mle"])
def test_from_history_non_finite_y(y: float, options: dict) -> None:
    """The rebuild validates like the live path (observe -> GaussianProcess.add)."""
    obs = [(0, 1.0), (1, 2.0), (2, y), (3, 0.5)]
    with pytest.raises(InputDataError, match="y must be finite"):
        GPUCB.from_history(candidates(n=6), obs, **options)
