"""The strategy registry and its round interface: ``gp-ucb``, ``gp-bucb`` (Desautels et al. 2014, Alg. 1) and
``random``: parameters, plans, observation, rebuilds; GP-BUCB's hallucinated variance against brute force."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from scipy import stats

from shared.bo.gp import GaussianProcess, Hyperparameters, se_kernel
from shared.bo.strategies import (
    REGISTRY,
    Answer,
    GPBUCBParams,
    GPBUCBStrategy,
    GPUCBStrategy,
    RandomRowsStrategy,
    RowRequest,
    Strategy,
    catalogue,
    get_strategy,
    gp_bucb_beta,
    gp_ucb_beta,
    parse_params,
    round_rng,
)
from shared.errors import InputDataError, StrategyError

FIXED = {"lengthscale": 0.8, "signal_variance": 1.0, "noise_variance": 1e-3}
HP = Hyperparameters(lengthscale=0.8, signal_variance=1.0, noise_variance=1e-3)


def candidates(n: int = 60, r: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2.0, 2.0, size=(n, r))


def f(Z: np.ndarray) -> np.ndarray:
    return np.sin(2.0 * Z[:, 0]) + 0.5 * np.cos(Z[:, 1:]).sum(1) - 0.1 * (Z * Z).sum(1)


def make(name: str, Z: np.ndarray, raw: dict | None = None, *, budget: int = 100, seed: int = 1) -> Strategy:
    cls = get_strategy(name)
    params = parse_params(name, raw)
    state = cls.initial_state(params, n=Z.shape[0], budget=budget, rng=np.random.default_rng(seed))
    return cls(Z, params, state)


def answer(Z: np.ndarray, requests: Sequence[RowRequest], noise_rng: np.random.Generator) -> list[Answer]:
    y = f(Z[[q.index for q in requests]]) + noise_rng.normal(0.0, 0.01, size=len(requests))
    return [Answer(q, float(v)) for q, v in zip(requests, y, strict=True)]


def play(strategy: Strategy, Z: np.ndarray, rounds: int, *, seed: int = 5) -> list[list[Answer]]:
    """``rounds`` rounds through the interface; returns the answered rounds."""
    noise = np.random.default_rng(seed)
    history = []
    for k in range(rounds):
        answers = answer(Z, strategy.plan(budget=1000, rng=round_rng(seed, k)), noise)
        strategy.observe(answers)
        history.append(answers)
    return history


def brute_force_var(Z: np.ndarray, rows: Sequence[int], hp: Hyperparameters, jitter: float) -> np.ndarray:
    """Posterior variance of f at every row of Z given noisy observations at ``rows`` (GPML eq. 2.26)."""
    X = Z[list(rows)]
    K = se_kernel(X, X, hp) + (hp.noise_variance + jitter) * np.eye(len(rows))
    Ks = se_kernel(X, Z, hp)
    var: np.ndarray = hp.signal_variance - np.einsum("ij,ij->j", Ks, np.linalg.solve(K, Ks))
    return var


# -- registry and parameters ---------------------------------------------------------------------------------
def test_catalogue_lists_the_three_strategies_with_json_schemas() -> None:
    assert {"gp-ucb", "gp-bucb", "random"} <= set(REGISTRY)
    entries = {e["name"]: e for e in catalogue()}
    for name in ("gp-ucb", "gp-bucb", "random"):
        entry = entries[name]
        assert entry["kinds"] == ["row"] and len(entry["description"]) > 40
        assert entry["params_schema"]["type"] == "object"
    bucb = entries["gp-bucb"]["params_schema"]["properties"]
    assert {"delta_prime", "hyperparameters", "initial_points", "exclude_queried"} <= set(bucb)
    assert bucb["batch_size"]["default"] == 5 and bucb["batch_size"]["minimum"] == 1
    assert bucb["batch_size"]["maximum"] == 1000 and bucb["beta_multiplier"]["minimum"] == 1.0
    assert entries["random"]["params_schema"].get("properties", {}) == {}
    assert "Desautels" in entries["gp-bucb"]["description"]
    assert get_strategy("gp-bucb") is GPBUCBStrategy and get_strategy("random") is RandomRowsStrategy


def test_parse_params_defaults() -> None:
    p = parse_params("gp-bucb", None)
    assert isinstance(p, GPBUCBParams)
    assert (p.batch_size, p.beta_multiplier, p.delta_prime, p.initial_points) == (5, 1.0, 0.05, 1)
    assert p.hyperparameters == "mle" and p.exclude_queried is True
    assert parse_params("gp-bucb", {"beta_multiplier": 4, "batch_size": 1000}).beta_multiplier == 4.0
    assert parse_params("random", {}).model_dump() == {}


@pytest.mark.parametrize(
    ("name", "raw", "problem"),
    [
        ("random", {"batch_size": 2}, "batch_size: Extra inputs are not permitted"),
        ("gp-bucb", {"bogus": 1}, "bogus: Extra inputs are not permitted"),
        ("gp-bucb", {"batch_size": 0}, "batch_size: Input should be greater than or equal to 1"),
        ("gp-bucb", {"batch_size": 1001}, "batch_size: Input should be less than or equal to 1000"),
        ("gp-bucb", {"batch_size": "5"}, "batch_size: Input should be a valid integer"),
        ("gp-bucb", {"beta_multiplier": 0.5}, "beta_multiplier: Input should be greater than or equal to 1"),
        ("gp-bucb", {"beta_multiplier": float("inf")}, "beta_multiplier: Input should be a finite number"),
        ("gp-bucb", {"delta_prime": 1.0}, "delta_prime: Input should be less than 1"),
        ("gp-ucb", {"batch_size": 5}, "batch_size: Extra inputs are not permitted"),
    ],
)
def test_parse_params_rejects_with_the_accepted_keys(name: str, raw: dict, problem: str) -> None:
    with pytest.raises(InputDataError) as err:
        parse_params(name, raw)
    message = str(err.value)
    assert problem in message and f"strategy_params for {name!r} are not valid" in message
    if name == "random":
        assert "it takes no parameters" in message
    elif name == "gp-bucb":
        accepts = "it accepts: delta_prime (default 0.05), beta_scale (default 0.1), hyperparameters"
        assert f"{accepts} (default 'mle')" in message
        assert "batch_size (default 5), beta_multiplier (default 1.0)" in message
    else:
        assert "it accepts: delta_prime" in message and "batch_size" not in message.split("it accepts")[1]


def test_unknown_strategy_lists_the_registry() -> None:
    expected = "unknown strategy 'nope'; the registry has: " + ", ".join(sorted(REGISTRY))
    with pytest.raises(InputDataError, match=expected):
        parse_params("nope", {})


def test_gp_bucb_beta() -> None:
    assert gp_bucb_beta(100, 3, 0.05) == gp_ucb_beta(100, 3, 0.05)
    assert gp_bucb_beta(100, 3, 0.05, 2.5) == pytest.approx(2.5 * 2 * math.log(100 * 9 * math.pi**2 / 0.3))
    with pytest.raises(InputDataError, match="beta_multiplier"):
        gp_bucb_beta(100, 3, 0.05, 0.5)


# -- random --------------------------------------------------------------------------------------------------
def test_random_never_repeats_covers_every_row_then_raises() -> None:
    Z = candidates(n=23)
    s = make("random", Z)
    seen = []
    for k, answers in enumerate(play(s, Z, 23)):
        (a,) = answers
        assert a.request.details == {"source": "random", "candidates": 23 - k}
        seen.append(a.request.index)
    assert sorted(seen) == list(range(23))
    with pytest.raises(StrategyError, match="every one of the 23 candidates has been queried already"):
        s.plan(budget=5, rng=round_rng(0, 99))
    rebuilt = RandomRowsStrategy.from_history(Z, s.params, s.state, [[a] for a in seen_answers(seen)])
    with pytest.raises(StrategyError):
        rebuilt.plan(budget=1, rng=round_rng(0, 0))


def seen_answers(indices: Sequence[int]) -> list[Answer]:
    return [Answer(RowRequest(i), 0.0) for i in indices]


def test_random_is_uniform_over_the_rows_left() -> None:
    """Chi-square goodness of fit: 14 000 seeded draws over the 7 rows left (expected 2000 each).

    With a correct sampler the statistic is chi2(6); the threshold p < 1e-4 would be crossed by chance with
    probability 1e-4, and a sampler off by 10 % on one row (expected shift ~ +20 in the statistic) fails."""
    Z = candidates(n=10)
    s = make("random", Z)
    s.observe([Answer(RowRequest(i), 0.0) for i in (0, 4, 9)])
    draws = np.array([s.plan(budget=1, rng=round_rng(1234, k))[0].index for k in range(14_000)])
    left = [1, 2, 3, 5, 6, 7, 8]
    assert set(draws.tolist()) == set(left)
    counts = np.array([(draws == i).sum() for i in left])
    statistic, p = stats.chisquare(counts)
    assert p > 1e-4, (counts, statistic)
    assert np.abs(counts - 2000).max() < 200  # 4.7 standard deviations of one cell (sd = 42.8)


def test_random_plan_does_not_mutate_and_uses_the_given_rng() -> None:
    Z = candidates(n=50)
    s = make("random", Z)
    first = s.plan(budget=1, rng=round_rng(7, 0))
    assert s.plan(budget=1, rng=round_rng(7, 0)) == first
    assert not s.queried.any()
    others = {s.plan(budget=1, rng=round_rng(7, k))[0].index for k in range(1, 40)}
    assert len(others) > 15


def test_random_observe_validates() -> None:
    s = make("random", candidates(n=5))
    with pytest.raises(InputDataError, match=r"observation indices must be in \[0, 4\]"):
        s.observe([Answer(RowRequest(5), 1.0)])
    with pytest.raises(InputDataError, match="y must be finite"):
        s.observe([Answer(RowRequest(1), float("nan"))])


# -- gp-bucb -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hyperparameters", ["mle", FIXED], ids=["mle", "fixed"])
def test_gp_bucb_rounds_have_k_distinct_new_rows(hyperparameters: object) -> None:
    Z = candidates()
    s = make("gp-bucb", Z, {"batch_size": 4, "initial_points": 2, "hyperparameters": hyperparameters})
    queried: set[int] = set()
    for k, answers in enumerate(play(s, Z, 8)):
        rows = [a.request.index for a in answers]
        assert len(rows) == 4 == len(set(rows)) and not queried & set(rows)
        assert [a.request.details["position"] for a in answers] == [0, 1, 2, 3]
        assert all(a.request.details["batch_size"] == 4 for a in answers)
        sources = [a.request.details["source"] for a in answers]
        assert sources == (["initial", "initial", "gp-bucb", "gp-bucb"] if k == 0 else ["gp-bucb"] * 4)
        queried |= set(rows)
    assert isinstance(s, GPBUCBStrategy) and s.engine.gp.t == 32


def test_gp_bucb_initial_rows_span_rounds_and_the_last_is_filled_up() -> None:
    Z = candidates()
    s = make("gp-bucb", Z, {"batch_size": 5, "initial_points": 7}, seed=3)
    assert isinstance(s, GPBUCBStrategy)
    initial = s.initial
    assert len(initial) == 7
    first, second = (answers for answers in play(s, Z, 2))
    assert [a.request.index for a in first] == initial[:5]
    assert [a.request.index for a in second][:2] == initial[5:]
    assert [a.request.details["source"] for a in second] == ["initial"] * 2 + ["gp-bucb"] * 3


def test_gp_bucb_first_row_of_a_round_is_gp_ucbs_choice() -> None:
    Z = candidates()
    raw = {"batch_size": 6, "initial_points": 3}
    s = make("gp-bucb", Z, raw)
    history = play(s, Z, 4)
    ucb = GPUCBStrategy(Z, parse_params("gp-ucb", {"initial_points": 3}), s.state)
    for answers in history:  # the same observations in the same order: the same floating-point posterior
        ucb.observe(answers)
    (choice,) = ucb.plan(budget=10, rng=round_rng(0, 0))
    batch = s.plan(budget=10, rng=round_rng(0, 0))
    assert batch[0].index == choice.index
    for key in ("acquisition", "beta", "mean", "std", "hyperparameters"):
        assert batch[0].details[key] == choice.details[key]
    assert batch[0].details["source"] == "gp-bucb" and choice.details["source"] == "gp-ucb"


@pytest.mark.parametrize("hyperparameters", ["mle", FIXED], ids=["mle", "fixed"])
def test_batch_size_one_reproduces_gp_ucb(hyperparameters: object) -> None:
    """15 rounds (MLE refits included): the same rows and the same audit numbers."""
    Z = candidates(n=80, r=3)
    common = {"initial_points": 2, "hyperparameters": hyperparameters}
    bucb = make("gp-bucb", Z, {**common, "batch_size": 1})
    ucb = make("gp-ucb", Z, common)
    assert bucb.state == ucb.state  # same initial rows from the same seed
    noise_a, noise_b = np.random.default_rng(9), np.random.default_rng(9)
    for k in range(15):
        (a,) = bucb.plan(budget=50, rng=round_rng(0, k))
        (b,) = ucb.plan(budget=50, rng=round_rng(0, k))
        assert a.index == b.index, k
        for key in ("acquisition", "beta", "mean", "std", "hyperparameters"):
            assert a.details[key] == b.details[key], (k, key)
        assert a.details["source"] == ("initial" if k < 2 else "gp-bucb")
        bucb.observe(answer(Z, [a], noise_a))
        ucb.observe(answer(Z, [b], noise_b))


@pytest.mark.parametrize("multiplier", [1.0, 3.0])
def test_hallucinated_std_matches_a_from_scratch_posterior(multiplier: float) -> None:
    """details["std"] at position j is the posterior std given the observed rows and the j rows chosen
    before it in the round (GPML eq. 2.26, numpy solve); the mean stays the feedback posterior mean."""
    Z = candidates(n=35)
    raw = {"batch_size": 6, "hyperparameters": FIXED, "beta_multiplier": multiplier, "beta_scale": 0.5}
    s = make("gp-bucb", Z, raw)
    play(s, Z, 2)
    assert isinstance(s, GPBUCBStrategy)
    gp = s.engine.gp
    observed = gp.indices.tolist()
    assert len(observed) == 12
    batch = s.plan(budget=100, rng=round_rng(0, 0))
    assert len(batch) == 6
    mean = gp.mean()
    X = Z[observed]
    K = se_kernel(X, X, HP) + (HP.noise_variance + gp.jitter) * np.eye(12)
    expected_mean = gp.m + se_kernel(Z, X, HP) @ np.linalg.solve(K, gp.y - gp.m)
    np.testing.assert_allclose(mean, expected_mean, atol=1e-9)
    for j, q in enumerate(batch):
        rows = observed + [p.index for p in batch[:j]]
        var = brute_force_var(Z, rows, HP, gp.jitter)
        assert q.details["std"] == pytest.approx(math.sqrt(var[q.index]), abs=1e-9)
        assert q.details["mean"] == mean[q.index]  # mu_fb: unchanged within the round
        beta = multiplier * 0.5 * gp_ucb_beta(35, 12 + j + 1, 0.05)  # exp(2C) x beta_scale x GP-UCB's
        assert q.details["beta"] == pytest.approx(beta, rel=1e-14)
        ucb_j = q.details["mean"] + math.sqrt(beta) * q.details["std"]
        assert q.details["acquisition"] == pytest.approx(ucb_j, rel=1e-14)
        # It is the argmax over the rows neither observed nor chosen before it.
        ucb = mean + math.sqrt(beta) * np.sqrt(np.maximum(var, 0.0))
        ucb[rows] = -np.inf
        assert q.index == int(np.argmax(ucb))


def test_covariance_rows_match_brute_force() -> None:
    Z = candidates(n=30)
    gp = GaussianProcess(Z, HP)
    for i, y in [(3, 0.5), (17, -1.0), (25, 0.2)]:
        gp.add(i, y)
    rows = [3, 8, 29]
    X = Z[[3, 17, 25]]
    K = se_kernel(X, X, HP) + (HP.noise_variance + gp.jitter) * np.eye(3)
    Kxz = se_kernel(X, Z, HP)
    expected = se_kernel(Z[rows], Z, HP) - Kxz[:, rows].T @ np.linalg.solve(K, Kxz)
    np.testing.assert_allclose(gp.covariance_rows(rows), expected, atol=1e-10)
    np.testing.assert_allclose(np.diag(gp.covariance_rows(rows)[:, rows]), gp.variance()[rows], atol=1e-12)
    with pytest.raises(InputDataError):
        gp.covariance_rows([30])


def test_hallucinated_batch_spreads_out() -> None:
    """With a flat posterior the hallucinated variance is what spreads a batch: plain UCB would return the
    same row k times; GP-BUCB returns far-apart rows (no two within half a lengthscale)."""
    Z = candidates(n=200)
    s = make("gp-bucb", Z, {"batch_size": 5, "hyperparameters": FIXED, "initial_points": 1})
    batch = s.plan(budget=100, rng=round_rng(0, 0))
    P = Z[[q.index for q in batch]]
    d = np.sqrt(((P[:, None] - P[None]) ** 2).sum(-1))
    assert d[np.triu_indices(5, 1)].min() > 0.4


def test_gp_bucb_plan_does_not_mutate() -> None:
    Z = candidates()
    s = make("gp-bucb", Z, {"batch_size": 5})
    play(s, Z, 3)
    assert isinstance(s, GPBUCBStrategy)
    t, mean, std = s.engine.gp.t, s.engine.gp.mean(), s.engine.gp.std()
    queried = s.engine.queried
    first = s.plan(budget=20, rng=round_rng(0, 1))
    second = s.plan(budget=20, rng=round_rng(0, 2))
    assert first == second
    assert s.engine.gp.t == t and (s.engine.queried == queried).all()
    np.testing.assert_array_equal(s.engine.gp.mean(), mean)
    np.testing.assert_array_equal(s.engine.gp.std(), std)


@pytest.mark.parametrize("hyperparameters", ["mle", FIXED], ids=["mle", "fixed"])
def test_gp_bucb_from_history_equals_live(hyperparameters: object) -> None:
    Z = candidates(n=70)
    s = make("gp-bucb", Z, {"batch_size": 3, "initial_points": 2, "hyperparameters": hyperparameters})
    history = play(s, Z, 6)  # 18 observations: refits at 3..10 and 15
    rebuilt = GPBUCBStrategy.from_history(Z, s.params, s.state, history)
    assert isinstance(s, GPBUCBStrategy)
    assert rebuilt.engine.hyperparameters == s.engine.hyperparameters
    live_plan = s.plan(budget=10, rng=round_rng(0, 6))
    rebuilt_plan = rebuilt.plan(budget=10, rng=round_rng(0, 6))
    assert [q.index for q in live_plan] == [q.index for q in rebuilt_plan]
    for a, b in zip(live_plan, rebuilt_plan, strict=True):
        for key in ("acquisition", "beta", "mean", "std"):
            assert a.details[key] == pytest.approx(b.details[key], rel=1e-7, abs=1e-9)
    # The generic replay (one observe per round) agrees too.
    replayed = Strategy.from_history.__func__(GPBUCBStrategy, Z, s.params, s.state, history)  # type: ignore[attr-defined]
    assert [q.index for q in replayed.plan(budget=10, rng=round_rng(0, 6))] == [q.index for q in live_plan]


def test_gp_bucb_round_is_truncated_to_the_budget() -> None:
    Z = candidates()
    s = make("gp-bucb", Z, {"batch_size": 5}, budget=7)
    assert isinstance(s, GPBUCBStrategy)
    full = s.plan(budget=7, rng=round_rng(0, 0))
    assert len(full) == 5
    s.observe(answer(Z, full, np.random.default_rng(0)))
    short = s.plan(budget=2, rng=round_rng(0, 1))
    assert len(short) == 2 and [q.details["position"] for q in short] == [0, 1]
    assert [q.index for q in short] == [q.index for q in s.plan(budget=5, rng=round_rng(0, 1))[:2]]
    with pytest.raises(InputDataError, match="budget must be >= 1"):
        s.plan(budget=0, rng=round_rng(0, 1))


def test_gp_bucb_runs_out_of_rows() -> None:
    Z = candidates(n=7)
    s = make("gp-bucb", Z, {"batch_size": 5, "hyperparameters": FIXED})
    first = s.plan(budget=10, rng=round_rng(0, 0))
    s.observe(answer(Z, first, np.random.default_rng(0)))
    second = s.plan(budget=10, rng=round_rng(0, 1))
    assert len(second) == 2
    assert sorted(q.index for q in first + second) == list(range(7))
    s.observe(answer(Z, second, np.random.default_rng(1)))
    with pytest.raises(StrategyError, match="every one of the 7 candidates has been queried already"):
        s.plan(budget=10, rng=round_rng(0, 2))


def test_gp_bucb_without_exclusion_repeats_across_rounds_never_within() -> None:
    Z = candidates(n=4)
    s = make("gp-bucb", Z, {"batch_size": 4, "hyperparameters": FIXED, "exclude_queried": False})
    for k in range(3):
        batch = s.plan(budget=10, rng=round_rng(0, k))
        assert sorted(q.index for q in batch) == [0, 1, 2, 3]
        s.observe(answer(Z, batch, np.random.default_rng(k)))
    assert isinstance(s, GPBUCBStrategy) and s.engine.gp.t == 12


def test_gp_bucb_rejects_foreign_params() -> None:
    with pytest.raises(InputDataError, match="GPBUCBParams"):
        GPBUCBStrategy(candidates(), parse_params("gp-ucb", {}), {})
