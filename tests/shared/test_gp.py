"""The incremental exact GP against scikit-learn's GaussianProcessRegressor and a from-scratch computation.

GPML (Rasmussen & Williams 2006) Alg. 2.1 and eqs. 2.30 / 5.9 are the reference formulas; scikit-learn is an
independent implementation of the same.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from shared.bo.gp import (
    DEFAULT_JITTER,
    GaussianProcess,
    Hyperparameters,
    median_distance,
    se_kernel,
)
from shared.bo.mle import _neg_log_marginal_likelihood, fit_hyperparameters
from shared.errors import InputDataError


# -- helpers ------------------------------------------------------------------------------------------------
def candidates(n: int = 50, r: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2.0, 2.0, size=(n, r))


def objective(Z: np.ndarray) -> np.ndarray:
    return np.sin(2.0 * Z[:, 0]) + 0.5 * np.cos(Z[:, 1:]).sum(axis=1) + 3.0


def observations(n: int, t: int, seed: int = 1) -> np.ndarray:
    """t indices into n candidates: distinct ones first, then a few repeats (repeated queries are legal)."""
    rng = np.random.default_rng(seed)
    idx = rng.choice(n, size=min(t, n), replace=False)
    if t > n:
        idx = np.concatenate([idx, rng.choice(n, size=t - n)])
    if t >= 4:
        idx[-1] = idx[0]  # one repeat in every history
    return idx


def sklearn_kernel(hp: Hyperparameters):
    ls = np.asarray(hp.lengthscale, dtype=np.float64) if isinstance(hp.lengthscale, tuple) else hp.lengthscale
    return ConstantKernel(hp.signal_variance, "fixed") * RBF(ls, "fixed")


def sklearn_posterior(
    Z: np.ndarray, idx: np.ndarray, y: np.ndarray, hp: Hyperparameters
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of the latent f (zero prior mean) from scikit-learn with the same fixed kernel."""
    gpr = GaussianProcessRegressor(
        kernel=sklearn_kernel(hp), alpha=hp.noise_variance + DEFAULT_JITTER, optimizer=None, normalize_y=False
    )
    gpr.fit(Z[idx], y)
    mean, std = gpr.predict(Z, return_std=True)
    return mean, std


def batch_posterior(
    Z: np.ndarray, idx: np.ndarray, y: np.ndarray, hp: Hyperparameters, m: float
) -> tuple[np.ndarray, np.ndarray]:
    """GPML eq. 2.23-2.24 with a constant prior mean m, by dense solves (no Cholesky updates)."""
    ls = np.asarray(hp.lengthscale, dtype=np.float64)
    S = Z / ls
    D2 = ((S[:, None, :] - S[None, :, :]) ** 2).sum(-1)
    Kall = hp.signal_variance * np.exp(-0.5 * D2)
    K = Kall[np.ix_(idx, idx)] + (hp.noise_variance + DEFAULT_JITTER) * np.eye(idx.size)
    Ks = Kall[idx]  # [t, n]
    mean = m + Ks.T @ np.linalg.solve(K, y - m)
    var = hp.signal_variance - np.einsum("ij,ij->j", Ks, np.linalg.solve(K, Ks))
    return mean, np.sqrt(np.maximum(var, 0.0))


def grown(Z: np.ndarray, hp: Hyperparameters, idx: np.ndarray, y: np.ndarray, **kw) -> GaussianProcess:
    gp = GaussianProcess(Z, hp, **kw)
    for i, v in zip(idx, y, strict=True):
        gp.add(int(i), float(v))
    return gp


HPS = [
    Hyperparameters(lengthscale=0.7, signal_variance=1.0, noise_variance=1e-4),
    Hyperparameters(lengthscale=2.0, signal_variance=3.5, noise_variance=0.1),
    Hyperparameters(lengthscale=0.3, signal_variance=0.2, noise_variance=1e-2),
    Hyperparameters(lengthscale=(0.5, 2.0, 1.0), signal_variance=1.5, noise_variance=1e-3),
]
HP_IDS = ["short", "long-noisy", "tiny-signal", "anisotropic"]


# -- kernel and helpers -------------------------------------------------------------------------------------
@pytest.mark.parametrize("hp", HPS, ids=HP_IDS)
def test_se_kernel_matches_sklearn(hp: Hyperparameters) -> None:
    A, B = candidates(7, seed=2), candidates(5, seed=3)
    np.testing.assert_allclose(se_kernel(A, B, hp), sklearn_kernel(hp)(A, B), rtol=1e-12, atol=1e-14)
    gp = GaussianProcess(A, hp)
    np.testing.assert_allclose(gp.kernel_row(4), se_kernel(A[4:5], A, hp)[0], rtol=1e-12, atol=1e-14)


def test_se_kernel_by_hand() -> None:
    hp = Hyperparameters(lengthscale=2.0, signal_variance=3.0)
    K = se_kernel(np.array([[0.0, 0.0]]), np.array([[0.0, 0.0], [3.0, 4.0]]), hp)
    np.testing.assert_allclose(K, [[3.0, 3.0 * math.exp(-25.0 / 8.0)]], rtol=1e-14)


def test_median_distance_by_hand() -> None:
    # pairwise distances 1, 3, 2 (and a duplicate point whose zero distance is ignored)
    Z = np.array([[0.0], [1.0], [3.0], [3.0]])
    # distances without the zero: 1, 3, 3, 2, 2 -> median 2
    assert median_distance(Z) == pytest.approx(2.0)
    assert median_distance(np.array([[3.0, 4.0], [0.0, 0.0]])) == pytest.approx(5.0)
    assert median_distance(np.ones((5, 2))) == 1.0  # all identical: fallback 1
    assert median_distance(np.ones((1, 2))) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lengthscale": 0.0}, "lengthscale must be a finite number > 0"),
        ({"lengthscale": -1.0}, "lengthscale must be a finite number > 0"),
        ({"lengthscale": float("nan")}, "lengthscale must be a finite number > 0"),
        ({"lengthscale": (1.0, 0.0)}, "lengthscale must be a finite number > 0"),
        ({"lengthscale": (1.0, float("inf"))}, "lengthscale must be finite"),
        ({"lengthscale": 1.0, "signal_variance": 0.0}, "signal_variance must be a finite number > 0"),
        (
            {"lengthscale": 1.0, "signal_variance": float("inf")},
            "signal_variance must be a finite number > 0",
        ),
        ({"lengthscale": 1.0, "noise_variance": -1e-3}, "noise_variance must be a finite number > 0"),
    ],
)
def test_hyperparameters_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(InputDataError, match=match):
        Hyperparameters(**kwargs)


def test_hyperparameters_as_dict() -> None:
    assert Hyperparameters(lengthscale=(1.0, 2.0), signal_variance=2.0, noise_variance=0.5).as_dict() == {
        "lengthscale": [1.0, 2.0],
        "signal_variance": 2.0,
        "noise_variance": 0.5,
    }
    assert Hyperparameters(lengthscale=3.0).as_dict()["lengthscale"] == 3.0


# -- posterior against scikit-learn -------------------------------------------------------------------------
@pytest.mark.parametrize("hp", HPS, ids=HP_IDS)
@pytest.mark.parametrize("t", [1, 5, 20])
def test_posterior_matches_sklearn(hp: Hyperparameters, t: int) -> None:
    Z = candidates()
    idx = observations(Z.shape[0], t)
    y = objective(Z)[idx] + np.random.default_rng(5).normal(0.0, 0.1, t)
    gp = grown(Z, hp, idx, y, prior_mean="zero")
    mean, std = sklearn_posterior(Z, idx, y, hp)
    np.testing.assert_allclose(gp.mean(), mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gp.std(), std, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(gp.indices, idx)
    np.testing.assert_array_equal(gp.y, y)
    assert gp.t == t


def test_prior_before_any_observation() -> None:
    hp = Hyperparameters(lengthscale=1.0, signal_variance=2.25)
    for prior_mean in ("zero", "empirical"):
        gp = GaussianProcess(candidates(), hp, prior_mean=prior_mean)
        assert gp.t == 0 and gp.m == 0.0
        np.testing.assert_array_equal(gp.mean(), 0.0)
        np.testing.assert_allclose(gp.std(), 1.5, rtol=1e-15)


@pytest.mark.parametrize("hp", HPS, ids=HP_IDS)
def test_refit_matches_sklearn_with_new_hyperparameters(hp: Hyperparameters) -> None:
    Z = candidates()
    idx = observations(Z.shape[0], 12)
    y = objective(Z)[idx]
    gp = grown(Z, Hyperparameters(lengthscale=5.0, signal_variance=9.0, noise_variance=0.5), idx, y)
    gp.refit(hp)
    assert gp.hp == hp
    mean, std = sklearn_posterior(Z, idx, y, hp)
    np.testing.assert_allclose(gp.mean(), mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gp.std(), std, rtol=0, atol=1e-6)
    # further incremental updates after a refit continue from the refitted state
    gp.add(3, 1.25)
    mean, std = sklearn_posterior(Z, np.append(idx, 3), np.append(y, 1.25), hp)
    np.testing.assert_allclose(gp.mean(), mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(gp.std(), std, rtol=0, atol=1e-6)


# -- incremental == from scratch ----------------------------------------------------------------------------
@pytest.mark.parametrize("prior_mean", ["zero", "empirical"])
@pytest.mark.parametrize("hp", HPS, ids=HP_IDS)
def test_incremental_equals_from_scratch(prior_mean: str, hp: Hyperparameters) -> None:
    """40 add() calls (past the initial capacity of 16, so the buffers grow twice) vs a batch rebuild."""
    Z = candidates(n=60)
    t = 40
    idx = observations(Z.shape[0], t, seed=7)
    y = objective(Z)[idx] + np.random.default_rng(8).normal(0.0, 0.05, t)
    live = grown(Z, hp, idx, y, prior_mean=prior_mean)
    assert live.t == t

    rebuilt = grown(Z, hp, idx, y, prior_mean=prior_mean)
    rebuilt.refit(hp)  # from-scratch Cholesky of the same observations
    m = float(y.mean()) if prior_mean == "empirical" else 0.0
    assert live.m == pytest.approx(m, rel=1e-15)
    fresh_mean, fresh_std = batch_posterior(Z, idx, y, hp, m)
    for gp in (live, rebuilt):
        np.testing.assert_allclose(gp.mean(), fresh_mean, rtol=0, atol=1e-9)
        np.testing.assert_allclose(gp.std(), fresh_std, rtol=0, atol=1e-9)
    np.testing.assert_allclose(live.mean(), rebuilt.mean(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(live.std(), rebuilt.std(), rtol=0, atol=1e-9)


@pytest.mark.parametrize("prior_mean", ["zero", "empirical"])
def test_every_prefix_matches_batch(prior_mean: str) -> None:
    hp = HPS[0]
    Z = candidates(n=40)
    idx = observations(Z.shape[0], 20, seed=9)
    y = objective(Z)[idx]
    gp = GaussianProcess(Z, hp, prior_mean=prior_mean)
    for t in range(1, idx.size + 1):
        gp.add(int(idx[t - 1]), float(y[t - 1]))
        m = float(y[:t].mean()) if prior_mean == "empirical" else 0.0
        mean, std = batch_posterior(Z, idx[:t], y[:t], hp, m)
        np.testing.assert_allclose(gp.mean(), mean, rtol=0, atol=1e-9)
        np.testing.assert_allclose(gp.std(), std, rtol=0, atol=1e-9)


def test_empirical_prior_mean_shifts_the_far_field() -> None:
    """Far from the data the posterior mean reverts to the prior mean: 0 or the mean of y."""
    Z = np.array([[0.0], [0.1], [100.0]])
    hp = Hyperparameters(lengthscale=1.0, noise_variance=1e-2)
    zero = grown(Z, hp, np.array([0, 1]), np.array([4.0, 6.0]), prior_mean="zero")
    emp = grown(Z, hp, np.array([0, 1]), np.array([4.0, 6.0]), prior_mean="empirical")
    assert zero.mean()[2] == pytest.approx(0.0, abs=1e-12)
    assert emp.mean()[2] == pytest.approx(5.0, abs=1e-12)


@pytest.mark.parametrize("index", [-1, 50, 10**6])
def test_bad_index(index: int) -> None:
    gp = GaussianProcess(candidates(), HPS[0])
    with pytest.raises(InputDataError, match=rf"index must be in \[0, 49\], got {index}"):
        gp.add(index, 1.0)
    assert gp.t == 0


@pytest.mark.parametrize("y", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_y(y: float) -> None:
    gp = GaussianProcess(candidates(), HPS[0])
    gp.add(0, 1.0)
    with pytest.raises(InputDataError, match="y must be finite"):
        gp.add(1, y)
    assert gp.t == 1
    np.testing.assert_array_equal(gp.y, [1.0])


@pytest.mark.parametrize(
    ("Z", "kwargs", "match"),
    [
        (np.arange(5.0), {}, "Z must be a non-empty 2-D array"),
        (np.ones((0, 2)), {}, "Z must be a non-empty 2-D array"),
        (np.array([[0.0, np.nan]]), {}, "Z must be finite"),
        (np.ones((3, 2)), {"prior_mean": "median"}, 'prior_mean must be "zero" or "empirical"'),
    ],
)
def test_gaussian_process_validation(Z: np.ndarray, kwargs: dict, match: str) -> None:
    with pytest.raises(InputDataError, match=match):
        GaussianProcess(Z, HPS[0], **kwargs)


# -- maximum likelihood -------------------------------------------------------------------------------------
def gp_sample(seed: int = 11, n: int = 45) -> tuple[np.ndarray, np.ndarray]:
    """y ~ GP(0, 2 exp(-|z - z'|^2 / 2)) + N(0, 0.05) on n points of [0, 5]^2, centred."""
    rng = np.random.default_rng(seed)
    Z = rng.uniform(0.0, 5.0, size=(n, 2))
    K = se_kernel(Z, Z, Hyperparameters(lengthscale=1.0, signal_variance=2.0)) + 1e-10 * np.eye(n)
    y = np.linalg.cholesky(K) @ rng.standard_normal(n) + rng.normal(0.0, math.sqrt(0.05), n)
    return Z, y - y.mean()


def sklearn_lml(Z: np.ndarray, y: np.ndarray, hp: Hyperparameters) -> float:
    kernel = ConstantKernel(hp.signal_variance, "fixed") * RBF(hp.lengthscale, "fixed") + WhiteKernel(
        hp.noise_variance, "fixed"
    )
    gpr = GaussianProcessRegressor(kernel=kernel, alpha=DEFAULT_JITTER, optimizer=None, normalize_y=False)
    return float(gpr.fit(Z, y).log_marginal_likelihood_value_)


def _d2(Z: np.ndarray) -> np.ndarray:
    return ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1)


def test_fit_hyperparameters_at_least_as_good_as_sklearn() -> None:
    Z, y = gp_sample()
    idx = np.arange(Z.shape[0])
    hp = fit_hyperparameters(Z, idx, y)

    med, var_y = median_distance(Z), float(np.var(y))
    # the optimum is inside our bounds (otherwise the comparison below would not be fair)
    assert 0.05 * med < hp.lengthscale < 20 * med
    assert 1e-3 * var_y < hp.signal_variance < 1e3 * var_y
    assert 1e-6 * var_y < hp.noise_variance < var_y

    kernel = ConstantKernel(var_y, (1e-3 * var_y, 1e3 * var_y)) * RBF(
        med, (0.05 * med, 20 * med)
    ) + WhiteKernel(1e-2 * var_y, (1e-6 * var_y, var_y))
    gpr = GaussianProcessRegressor(
        kernel=kernel, alpha=DEFAULT_JITTER, normalize_y=False, n_restarts_optimizer=5, random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning from bounds that are not hit anyway
        gpr.fit(Z, y)
    ours = sklearn_lml(Z, y, hp)
    assert ours >= gpr.log_marginal_likelihood_value_ - 1e-3
    # the value our optimiser minimised is the same function
    theta = np.log([hp.lengthscale, hp.signal_variance, hp.noise_variance])
    nll, _ = _neg_log_marginal_likelihood(theta, _d2(Z), y, DEFAULT_JITTER)
    assert -nll == pytest.approx(ours, rel=1e-9)
    # the generating hyper-parameters are recovered roughly (45 points: a loose sanity check)
    assert 0.5 < hp.lengthscale < 2.0


def test_fit_hyperparameters_is_deterministic_and_uses_subset() -> None:
    Z, y_all = gp_sample(seed=12, n=60)
    idx = np.arange(0, 60, 2)
    y = y_all[idx] - y_all[idx].mean()
    a = fit_hyperparameters(Z, idx, y)
    b = fit_hyperparameters(Z, idx, y)
    assert a == b
    # only the observed rows enter the likelihood: the same data as a stand-alone Z gives the same optimum
    # of the likelihood (bounds differ through the median distance, so compare likelihoods, not parameters)
    alone = fit_hyperparameters(Z[idx], np.arange(30), y)
    assert sklearn_lml(Z[idx], y, a) >= sklearn_lml(Z[idx], y, alone) - 1e-3


def test_fit_hyperparameters_respects_bounds() -> None:
    """Pure noise: the likelihood wants a vanishing signal; the result stays inside the box."""
    rng = np.random.default_rng(13)
    Z = rng.uniform(size=(30, 2))
    y = rng.standard_normal(30)
    y -= y.mean()
    hp = fit_hyperparameters(Z, np.arange(30), y)
    med, var_y = median_distance(Z), float(np.var(y))
    eps = 1e-9
    assert 0.05 * med * (1 - eps) <= hp.lengthscale <= 20 * med * (1 + eps)
    assert 1e-3 * var_y * (1 - eps) <= hp.signal_variance <= 1e3 * var_y * (1 + eps)
    assert 1e-6 * var_y * (1 - eps) <= hp.noise_variance <= var_y * (1 + eps)


@pytest.mark.parametrize(
    "theta", [np.log([1.0, 2.0, 0.05]), np.log([0.3, 0.5, 1e-3]), np.log([3.0, 10.0, 0.5])]
)
def test_nll_gradient_matches_finite_differences(theta: np.ndarray) -> None:
    Z, y = gp_sample(seed=14, n=25)
    D2 = _d2(Z)
    nll, grad = _neg_log_marginal_likelihood(theta, D2, y, DEFAULT_JITTER)
    h = 1e-5
    fd = np.empty(3)
    for k in range(3):
        e = np.zeros(3)
        e[k] = h
        fd[k] = (
            _neg_log_marginal_likelihood(theta + e, D2, y, DEFAULT_JITTER)[0]
            - _neg_log_marginal_likelihood(theta - e, D2, y, DEFAULT_JITTER)[0]
        ) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6 * max(1.0, abs(nll)))
    # and the value is scikit-learn's -log p(y | theta)
    ell, s2, sn2 = np.exp(theta)
    hp = Hyperparameters(lengthscale=float(ell), signal_variance=float(s2), noise_variance=float(sn2))
    assert -nll == pytest.approx(sklearn_lml(Z, y, hp), rel=1e-9)
