"""The heavy-tailed / local-DP GP-UCB strategies (Zhou & Tan 2021, Algs. 1-3; Chowdhury & Gopalan 2019)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from shared.bo.kernels import kernel_matrix
from shared.bo.strategies import REGISTRY, Answer, RowRequest, get_strategy, parse_params
from shared.bo.strategies.heavy_tailed import (
    K_DEFAULT,
    LDPTGPUCBStrategy,
    MoMAGPUCBStrategy,
    Tails,
    ata_beta,
    ata_truncation,
    default_k,
    median_of_means,
    moma_beta,
    tgp_beta,
    tgp_truncation,
)
from shared.bo.strategies.heavy_tailed.common import BETA_MULTIPLIER_DEFAULT as BETA_MULTIPLIER
from shared.errors import InputDataError, StrategyError

LDP = {"epsilon": 2.0, "B": 1.0, "R": 1.0, "lengthscale": 0.2}
HT = {"B": 1.0, "v": 4.0, "alpha": 0.8, "lengthscale": 0.2}
CASES: dict[str, dict[str, Any]] = {
    "tgp-ucb": HT,
    "ata-gp-ucb": HT,
    "moma-gp-ucb": {**HT, "k": 3},
    "ldp-tgp-ucb": LDP,
    "ldp-ata-gp-ucb": LDP,
    "ldp-moma-gp-ucb": {**LDP, "k": 3},
}
Z1 = np.linspace(0.01, 1.0, 100)[:, None]


def bumps(seed: int) -> np.ndarray:
    """f = sum of 100 kernel bumps, coefficients in [-1, 1], max |f| = 1 (Zhou & Tan, Sec. 5.1)."""
    rng = np.random.default_rng(seed)
    f = kernel_matrix(Z1, Z1, kind="se", lengthscale=0.2) @ rng.uniform(-1, 1, 100)
    out: np.ndarray = f / np.abs(f).max()
    return out


def drive(
    name: str,
    raw: dict[str, Any],
    *,
    T: int,
    rounds: int,
    seed: int = 0,
    Z: np.ndarray = Z1,
    eps: float = 2.0,
) -> tuple[Any, Any, dict[str, Any], list[list[Answer]], float]:
    """Create, then play ``rounds`` rounds on Laplace-corrupted bumps; returns (strategy, params, state,
    rounds, cumulative regret)."""
    cls = get_strategy(name)
    params = parse_params(name, raw)
    state = cls.initial_state(params, n=Z.shape[0], budget=T, rng=np.random.default_rng(seed))
    s = cls(Z, params, state)
    f = bumps(seed)
    rng = np.random.default_rng(1000 + seed)
    history: list[list[Answer]] = []
    left, regret = T, 0.0
    for _ in range(rounds):
        if left == 0:
            break
        reqs = s.plan(budget=left, rng=rng)
        answers = [
            Answer(r, float(f[r.index] + rng.uniform(-1, 1) + rng.laplace(0.0, 2 * (1 + 1) / eps)))
            for r in reqs
        ]
        regret += sum(float(f.max() - f[r.index]) for r in reqs)
        s.observe(answers)
        history.append(answers)
        left -= len(reqs)
    return s, params, state, history, regret


def same_plan(a: list[RowRequest], b: list[RowRequest]) -> None:
    assert [r.index for r in a] == [r.index for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra.details.keys() == rb.details.keys()
        for key, va in ra.details.items():
            vb = rb.details[key]
            if isinstance(va, float):
                assert vb == pytest.approx(va, rel=1e-9, abs=1e-12), key
            else:
                assert va == vb, key


def test_six_names_registered() -> None:
    assert set(CASES) <= set(REGISTRY)


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_history_gives_the_same_next_plan(name: str) -> None:
    s, params, state, history, _ = drive(name, CASES[name], T=60, rounds=9)
    rebuilt = type(s).from_history(Z1, params, state, history)
    rng = np.random.default_rng(5)
    same_plan(s.plan(budget=20, rng=rng), rebuilt.plan(budget=20, rng=rng))
    if hasattr(s, "var"):
        np.testing.assert_allclose(rebuilt.var, s.var, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(rebuilt.mean, s.mean, rtol=1e-9, atol=1e-12)
        assert rebuilt.m == s.m


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_does_not_change_state(name: str) -> None:
    s, *_ = drive(name, CASES[name], T=60, rounds=4)
    snapshot = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in vars(s).items()}
    gp_before = (s.gp.t, s.gp.mean(), s.gp.variance()) if hasattr(s, "gp") else None
    first = s.plan(budget=20, rng=np.random.default_rng(1))
    second = s.plan(budget=20, rng=np.random.default_rng(2))
    same_plan(first, second)
    for key, value in vars(s).items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(value, snapshot[key]), key
        elif isinstance(value, int | float | list):
            assert value == snapshot[key], key
    if gp_before is not None:
        assert s.gp.t == gp_before[0]
        assert np.array_equal(s.gp.mean(), gp_before[1]) and np.array_equal(s.gp.variance(), gp_before[2])


def test_parse_params_errors_list_the_accepted_fields() -> None:
    with pytest.raises(InputDataError, match="it accepts: .*beta_multiplier.*epsilon"):
        parse_params("ldp-tgp-ucb", {"B": 1.0, "R": 1.0, "epsilom": 1.0})  # a misspelt field
    with pytest.raises(InputDataError, match="alpha"):
        parse_params("tgp-ucb", {"B": 1.0, "v": 2.0, "alpha": 1.5})


def test_fresh_plays_and_output_privacy() -> None:
    for name, raw in CASES.items():
        cls, params = get_strategy(name), parse_params(name, raw)
        assert cls.fresh_plays_per_row(params, budget=100) == (3 if "moma" in name else 1)
        expected = (2.0, 1.0, 1.0) if name.startswith("ldp-") else None
        assert cls.output_privacy(params) == expected
    default = parse_params("ldp-moma-gp-ucb", LDP)
    assert MoMAGPUCBStrategy.fresh_plays_per_row(default, budget=1000) == K_DEFAULT  # whatever the budget
    assert MoMAGPUCBStrategy.fresh_plays_per_row(default, budget=40) == K_DEFAULT
    theory = parse_params("ldp-moma-gp-ucb", {**LDP, "k": "theory"})
    k = MoMAGPUCBStrategy.fresh_plays_per_row(theory, budget=1000)
    assert k == math.ceil(24 * math.log(4 * math.e * 1000 / 0.05)) == default_k(1000, 0.05) == 295
    # a study stored before k had a practical default kept "k": null, which meant the paper's formula
    assert parse_params("ldp-moma-gp-ucb", {**LDP, "k": None}).k == "theory"  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------ TGP
def test_tgp_truncation_zeroes_large_rewards() -> None:
    params = parse_params("ldp-tgp-ucb", {"epsilon": 2.0, "B": 1.0, "R": 0.0, "initial_points": 0})
    s = LDPTGPUCBStrategy(Z1, params, {"T": 10})  # L = 1: b_1 = 1, b_2 = 1 + ln 2
    req = RowRequest(3)
    s.observe([Answer(req, 1.5)])  # |y| > b_1 = 1 -> 0
    s.observe([Answer(req, -1.6)])  # |y| <= b_2 = 1.693 -> kept
    s.observe([Answer(req, 2.2)])  # > b_3 = 2.0986 -> 0
    np.testing.assert_array_equal(s.gp.y, [0.0, -1.6, 0.0])
    assert s.truncated == 2


def test_tgp_b_and_beta_by_hand() -> None:
    lam, delta = 0.5, 0.1
    params = parse_params(
        "ldp-tgp-ucb",
        {
            "epsilon": 0.5,
            "B": 1.0,
            "R": 0.5,
            "lam": lam,
            "delta": delta,
            "lengthscale": 0.2,
            "initial_points": 0,
            "beta_multiplier": 1.0,
        },
    )  # the theorem's beta; fmt: skip
    s = LDPTGPUCBStrategy(Z1, params, {"T": 10})
    L = 2 * 1.5 / 0.5
    K = 1.0 + 0.25 + 2 * L * L
    s.observe([Answer(RowRequest(10), 0.3)])
    s.observe([Answer(RowRequest(60), -0.2)])
    Kt = kernel_matrix(Z1[[10, 60]], Z1[[10, 60]], kind="se", lengthscale=0.2)
    gamma2 = 0.5 * np.linalg.slogdet(np.eye(2) + Kt / lam)[1]
    b2 = 1.5 + L * math.log(2)
    beta3 = (
        1.0
        + 2 * math.sqrt(2) / math.sqrt(lam) * b2 * math.sqrt(gamma2 + math.log(1 / delta))
        + math.sqrt(K * (math.log(2) + 1) / lam)
    )
    d = s.plan(budget=5, rng=np.random.default_rng(0))[0].details
    assert d["beta"] == pytest.approx(beta3, rel=1e-12)
    assert d["info_gain"] == pytest.approx(gamma2, rel=1e-9)
    assert d["b_t"] == pytest.approx(1.5 + L * math.log(3), rel=1e-12)
    # heavy-tailed: b_t = v^(1/(1+a)) t^(1/(2(1+a))), S_t = v^(2/(1+a)) sum tau^(-a/(1+a))
    ht = Tails(private=False, B=2.0, alpha=0.5, v=3.0, c=3.0)
    assert tgp_truncation(ht, 4) == pytest.approx(3.0 ** (1 / 1.5) * 4 ** (1 / 3), rel=1e-12)
    S2 = 3.0 ** (2 / 1.5) * (1 + 2 ** (-0.5 / 1.5))
    b2h = 3.0 ** (1 / 1.5) * 2 ** (1 / 3)
    expected = 2.0 + 2 * math.sqrt(2) * b2h * math.sqrt(0.7 + math.log(20)) + math.sqrt(S2)
    assert tgp_beta(ht, 3, 0.7, lam=1.0, delta=0.05, multiplier=1.0) == pytest.approx(expected, rel=1e-12)
    assert tgp_beta(ht, 3, 0.7, lam=1.0, delta=0.05, multiplier=0.5) == pytest.approx(expected / 2, rel=1e-12)


@pytest.mark.parametrize("kernel", ["se", "matern52"])
def test_tgp_posterior_is_kernel_ridge_on_truncated_rewards(kernel: str) -> None:
    lam = 0.7
    params = parse_params("ldp-tgp-ucb", {"epsilon": 4.0, "B": 1.0, "R": 0.0, "lam": lam, "kernel": kernel,
                                          "lengthscale": 0.15, "initial_points": 0})  # fmt: skip
    s = LDPTGPUCBStrategy(Z1, params, {"T": 10})
    idx = [5, 40, 41, 90, 40, 12]
    ys = [0.2, 3.0, -0.4, 0.9, -0.1, -5.0]
    for i, y in zip(idx, ys, strict=True):
        s.observe([Answer(RowRequest(i), y)])
    b = [tgp_truncation(s.tails, t) for t in range(1, 7)]
    yhat = np.array([y if abs(y) <= bt else 0.0 for y, bt in zip(ys, b, strict=True)])
    assert yhat[1] == 0.0 and yhat[5] == 0.0 and yhat[3] == 0.9
    Kt = kernel_matrix(Z1[idx], Z1[idx], kind=kernel, lengthscale=0.15)
    kx = kernel_matrix(Z1[idx], Z1, kind=kernel, lengthscale=0.15)
    A = np.linalg.solve(Kt + lam * np.eye(6), kx)
    np.testing.assert_allclose(s.gp.mean(), A.T @ yhat, atol=1e-9)
    np.testing.assert_allclose(s.gp.variance(), 1.0 - np.einsum("ij,ij->j", kx, A), atol=1e-9)


# ------------------------------------------------------------------------------------------------ ATA
def test_ata_b_and_beta_by_hand() -> None:
    eps, B, R = 2.0, 1.0, 0.5
    v = B * B + R * R + 8 * (B + R) ** 2 / eps**2
    tails = Tails(private=True, B=B, alpha=1.0, v=v, c=v - B * B, laplace=2 * (B + R) / eps, R=R, epsilon=eps)
    T, delta, m = 100, 0.05, 3
    ln = math.log(4 * m * T / delta)
    assert ata_truncation(tails, 7, m, T=T, delta=delta) == pytest.approx(math.sqrt(v / ln), rel=1e-12)
    beta = B * (1 + 1 / math.sqrt(0.9)) + 4 * math.sqrt(ln * v * m / 0.5)
    got = ata_beta(tails, 7, m, T=T, delta=delta, lam=0.5, nystrom_eps=0.1, multiplier=1.0)
    assert got == pytest.approx(beta, rel=1e-12)
    ht = Tails(private=False, B=1.0, alpha=0.5, v=2.0, c=2.0)
    expected_b = (2.0 / ln) ** (1 / 1.5) * 7 ** (0.5 / 3)
    assert ata_truncation(ht, 7, m, T=T, delta=delta) == pytest.approx(expected_b, rel=1e-12)


def test_ata_details_and_dictionary() -> None:
    s, *_ = drive("ldp-ata-gp-ucb", LDP, T=100, rounds=12)
    d = s.plan(budget=10, rng=np.random.default_rng(0))[0].details
    assert d["t"] == 13 and d["m"] == s.m and 1 <= s.m <= 12
    assert d["q"] == pytest.approx(math.log(100) / 0.01)
    assert d["beta"] == pytest.approx(
        ata_beta(s.tails, 12, s.m, T=100, delta=0.05, lam=1.0, nystrom_eps=0.1, multiplier=BETA_MULTIPLIER)
    )
    assert d["b_prev"] == pytest.approx(ata_truncation(s.tails, 12, s.m, T=100, delta=0.05))
    assert np.all(s.var >= 0) and np.all(s.var <= 1 + 1e-9)


# ----------------------------------------------------------------------------------------------- MoMA
def test_median_of_means_by_hand() -> None:
    Theta = np.array([[0.0, 1.0, 10.0]])  # m = 1, k = 3, V = I: distances 1, 10, 9
    kstar, r = median_of_means(Theta, np.eye(1))
    np.testing.assert_allclose(r, [5.5, 5.0, 9.5])
    assert kstar == 1
    # V-norm: V = diag(4, 1) doubles the first coordinate
    Theta2 = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    _, r2 = median_of_means(Theta2, np.diag([4.0, 1.0]))
    d01, d02, d12 = 2.0, 3.0, math.sqrt(4 + 9)
    np.testing.assert_allclose(r2, [np.median([d01, d02]), np.median([d01, d12]), np.median([d02, d12])])
    # five estimates around (1, 1), one far outlier: k* is a central one
    rng = np.random.default_rng(0)
    Theta3 = 1.0 + 0.05 * rng.normal(size=(2, 5))
    Theta3[:, 2] = [40.0, -30.0]
    kstar3, _ = median_of_means(Theta3, np.eye(2))
    assert kstar3 != 2 and np.allclose(Theta3[:, kstar3], 1.0, atol=0.2)
    assert median_of_means(np.ones((2, 1)), np.eye(2))[0] == 0


def test_moma_is_robust_to_a_heavy_outlier_play() -> None:
    params = parse_params("moma-gp-ucb", {"B": 1.0, "v": 2.0, "k": 5, "lengthscale": 0.2, "lam": 0.01,
                                          "q": 1e6, "initial_points": 0})  # fmt: skip
    s = MoMAGPUCBStrategy(Z1, params, {"T": 100, "k": 5, "nystrom_seed": 1})
    f = bumps(3)
    rng = np.random.default_rng(4)
    rows = [5, 25, 45, 65, 85, 15, 55, 95]
    for e, i in enumerate(rows):
        y = f[i] + 0.01 * rng.normal(size=5)
        if e == 3:
            y[2] = 1e4  # one heavy-tailed play
        s.observe([Answer(RowRequest(i), float(v)) for v in y])
    assert s.kstar != 2
    np.testing.assert_allclose(s.mean[rows], f[rows], atol=0.05)
    plain = s.Theta.mean(axis=1)  # the mean of the k estimates = least squares on the per-epoch means
    phi = s.emb.features(s.kernel.block(s.emb.atoms, rows))
    assert np.abs(plain @ phi - f[rows]).max() > 100


def test_moma_update_is_algorithm_3_from_scratch() -> None:
    """Alg. 3 lines 9-14 recomputed naively, with a row chosen in several epochs: V~ has one term per *epoch*
    (not per play), estimate j uses the j-th play of every epoch (the paper's "row j" of Fig. 1), r_j is the
    median of the k - 1 V~-distances, mu~ uses theta~_{k*}, and
    sigma~^2 = k - |phi|^2 + lambda phi^T V^-1 phi (issue 14: audited against the paper, no deviation)."""
    lam, k = 0.5, 4
    raw = {**LDP, "k": k, "lam": lam, "q": 1e9, "initial_points": 0, "beta_multiplier": 1.0}
    params = parse_params("ldp-moma-gp-ucb", raw)
    s = get_strategy("ldp-moma-gp-ucb")(Z1, params, {"T": 40, "k": k, "nystrom_seed": 3})
    rng = np.random.default_rng(7)
    epochs = [10, 60, 10, 35, 10, 85]
    Y = [bumps(2)[i] + rng.laplace(0.0, 2.0, size=k) for i in epochs]
    for i, y in zip(epochs, Y, strict=True):
        s.observe([Answer(RowRequest(i), float(v)) for v in y])
    atoms = np.unique(epochs)  # q huge: every distinct played row is kept (p = 1)
    assert sorted(s.emb.atoms.tolist()) == atoms.tolist() and s.m == atoms.size
    K = kernel_matrix(Z1, Z1, kind="se", lengthscale=0.2)
    w, U = np.linalg.eigh(K[np.ix_(atoms, atoms)])
    W = (U / np.sqrt(w)) @ U.T  # (K_D^{1/2})^+ (full rank here)
    phi = W @ K[atoms, :]  # [m, 100]
    V = lam * np.eye(atoms.size)
    for i in epochs:
        V += np.outer(phi[:, i], phi[:, i])
    Theta = np.column_stack(
        [np.linalg.solve(V, sum(Y[e][j] * phi[:, i] for e, i in enumerate(epochs))) for j in range(k)]
    )
    np.testing.assert_allclose(s.Theta, Theta, rtol=1e-6, atol=1e-8)
    dist = [[math.sqrt((Theta[:, j] - Theta[:, i]) @ V @ (Theta[:, j] - Theta[:, i])) for i in range(k)]
            for j in range(k)]  # fmt: skip
    r = [float(np.median([dist[j][i] for i in range(k) if i != j])) for j in range(k)]
    np.testing.assert_allclose(s.r, r, rtol=1e-6)
    assert s.kstar == int(np.argmin(r))
    np.testing.assert_allclose(s.mean, phi.T @ Theta[:, s.kstar], rtol=1e-6, atol=1e-8)
    var = 1.0 - np.sum(phi * phi, 0) + lam * np.sum(phi * np.linalg.solve(V, phi), 0)
    np.testing.assert_allclose(s.var, np.maximum(var, 0.0), atol=1e-8)
    # beta_{n+1} of the next epoch: n = 6 epochs, m_n = 4 atoms (Corollary 1, times the multiplier)
    assert s.plan(budget=k, rng=rng)[0].details["beta"] == pytest.approx(
        moma_beta(s.tails, 6, 4, lam=lam, nystrom_eps=0.1, multiplier=1.0)
    )


def test_moma_plans_k_identical_rows_and_a_short_last_epoch() -> None:
    s, params, state, history, _ = drive("ldp-moma-gp-ucb", {**LDP, "k": 4}, T=10, rounds=2)
    assert [len(r) for r in history] == [4, 4]
    assert all(len({a.request.index for a in r}) == 1 for r in history)
    last = s.plan(budget=2, rng=np.random.default_rng(0))
    assert len(last) == 2 and last[0].index == last[1].index
    assert [r.details["play"] for r in last] == [0, 1] and last[0].details["epoch"] == 3
    s.observe([Answer(r, 0.1) for r in last])
    assert s.Theta.shape[1] == 2  # only the columns observed in every epoch
    rebuilt = type(s).from_history(Z1, params, state, [*history, [Answer(r, 0.1) for r in last]])
    np.testing.assert_allclose(rebuilt.mean, s.mean, rtol=1e-9, atol=1e-12)
    with pytest.raises(InputDataError, match="one same row"):
        s.observe([Answer(RowRequest(1), 0.0), Answer(RowRequest(2), 0.0)])
    with pytest.raises(StrategyError, match="short"):
        s.plan(budget=4, rng=np.random.default_rng(0))


def test_moma_refuses_a_budget_below_k() -> None:
    params = parse_params("ldp-moma-gp-ucb", {**LDP, "k": "theory"})  # ceil(24 ln(4 e 200 / 0.05)) = 257
    with pytest.raises(
        InputDataError, match=r"k = 257 times per epoch \(the paper's .*strategy_params.k.*at least 257"
    ):
        MoMAGPUCBStrategy.initial_state(params, n=100, budget=200, rng=np.random.default_rng(0))
    small = parse_params("moma-gp-ucb", {**HT, "k": 20})
    with pytest.raises(InputDataError, match="k = 20"):
        MoMAGPUCBStrategy.initial_state(small, n=100, budget=19, rng=np.random.default_rng(0))
    state = MoMAGPUCBStrategy.initial_state(small, n=100, budget=20, rng=np.random.default_rng(0))
    assert state["k"] == 20 and state["T"] == 20


def test_moma_beta_by_hand() -> None:
    eps, B, R = 1.0, 1.0, 1.0
    c = R * R + 8 * (B + R) ** 2 / eps**2
    tails = Tails(private=True, B=B, alpha=1.0, v=B * B + c, c=c, laplace=4.0, R=R, epsilon=eps)
    expected = B * (1 + 1 / math.sqrt(0.9)) + 3 * math.sqrt(9 * 4 * c)
    assert moma_beta(tails, 6, 4, lam=1.0, nystrom_eps=0.1, multiplier=1.0) == pytest.approx(expected)
    ht = Tails(private=False, B=1.0, alpha=0.5, v=2.0, c=3.0)
    exp2 = (1 + 1 / math.sqrt(0.8)) + 3 * (9 * 4 * 3.0) ** (1 / 1.5) * 6 ** (0.5 / 3) / 2.0
    assert moma_beta(ht, 6, 4, lam=4.0, nystrom_eps=0.2, multiplier=1.0) == pytest.approx(exp2)


# ------------------------------------------------------------------------------------------ regret sanity
@pytest.mark.parametrize("name", ["ldp-tgp-ucb", "ldp-ata-gp-ucb", "ldp-moma-gp-ucb"])
def test_ldp_strategies_beat_random_selection(name: str) -> None:
    """1-D bumps, uniform [-1, 1] noise (R = 1) + Laplace(2(B+R)/epsilon), epsilon = 4, T = 200, 5 seeds.

    The theorems' beta are conservative at T = 200 (pure exploration, regret ~ random): beta_multiplier 0.03.
    Random selection's expected cumulative regret is T (max f - mean f).
    """
    raw = {"epsilon": 4.0, "B": 1.0, "R": 1.0, "lengthscale": 0.2, "beta_multiplier": 0.03}
    if "moma" in name:
        raw["k"] = 5
    regrets, random_regrets = [], []
    for seed in range(5):
        *_, regret = drive(name, raw, T=200, rounds=200, seed=seed, eps=4.0)
        f = bumps(seed)
        regrets.append(regret)
        random_regrets.append(200 * (f.max() - f.mean()))
    assert np.mean(regrets) < 0.75 * np.mean(random_regrets)
