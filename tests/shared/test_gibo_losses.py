"""DP-GIBO loss matrices and the row-independence check (``shared.bo.gibo.losses``)."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest

from shared.bo.gibo.losses import (
    check_row_independent,
    gaussian_location,
    huber_regression,
    logistic_regression,
)
from shared.bo.gibo.private_gradient import private_gradient_diagnostics
from shared.errors import InputDataError

B_POINTS, N_USERS, D = 4, 9, 3


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20261124)
    theta = rng.standard_normal((B_POINTS, D))
    X = rng.standard_normal((N_USERS, D)) * 2.0
    y_reg = X @ np.ones(D) + rng.standard_normal(N_USERS)
    y_bin = (rng.random(N_USERS) < 0.5).astype(float)
    return theta, X, y_reg, y_bin


def huber_scalar(r: float, c: float) -> float:
    return 0.5 * r * r if abs(r) <= c else c * abs(r) - 0.5 * c * c


# --- values against a per-user loop (the reference the vectorised forms must equal) ------------------------


def test_gaussian_location_is_half_the_squared_distance(data) -> None:
    theta, X, _, _ = data
    L = gaussian_location(theta, X)
    assert L.shape == (B_POINTS, N_USERS)
    expected = np.array([[0.5 * np.sum((x - t) ** 2) for x in X] for t in theta])
    np.testing.assert_allclose(L, expected, rtol=1e-13)
    np.testing.assert_allclose(
        gaussian_location(theta, X, constant=True), expected + 0.5 * D * math.log(2 * math.pi), rtol=1e-13
    )


def test_gaussian_location_is_the_negative_log_density_with_the_constant(data) -> None:
    from scipy.stats import multivariate_normal

    theta, X, _, _ = data
    L = gaussian_location(theta, X, constant=True)
    for k, t in enumerate(theta):
        np.testing.assert_allclose(L[k], -multivariate_normal(t, np.eye(D)).logpdf(X), rtol=1e-12)


def test_huber_regression_matches_the_paper_formula(data) -> None:
    """Section 4.2: rho_c(y_i - x_i^T theta) * min(1, 2 / ||x_i||^2), c = 1 (the defaults)."""
    theta, X, y, _ = data
    L = huber_regression(theta, X, y)
    expected = np.array(
        [[huber_scalar(yi - xi @ t, 1.0) * min(1.0, 2.0 / (xi @ xi)) for xi, yi in zip(X, y)] for t in theta]
    )
    np.testing.assert_allclose(L, expected, rtol=1e-13)
    L2 = huber_regression(theta, X, y, delta_huber=0.5, clip=3.0)
    expected2 = np.array(
        [[huber_scalar(yi - xi @ t, 0.5) * min(1.0, 3.0 / (xi @ xi)) for xi, yi in zip(X, y)] for t in theta]
    )
    np.testing.assert_allclose(L2, expected2, rtol=1e-13)


def test_huber_weight_at_a_zero_row_and_quadratic_inside_the_band() -> None:
    theta = np.array([[0.0, 0.0]])
    X = np.array([[0.0, 0.0], [0.1, 0.0]])
    y = np.array([0.5, 100.0])
    with np.errstate(all="raise"):
        L = huber_regression(theta, X, y)
    assert L[0, 0] == pytest.approx(0.125)  # weight 1 at x = 0, |r| = 0.5 <= c: r^2 / 2
    assert L[0, 1] == pytest.approx(99.5)  # linear branch c |r| - c^2 / 2, weight 1 (||x||^2 = 0.01 < 2)


def test_huber_gradient_norm_is_bounded_by_c_sqrt_clip() -> None:
    """The property the paper's loss weight buys: ||grad_theta|| <= c sqrt(clip) for every row (finite
    differences over rows of every size, residuals in and out of the Huber band)."""
    rng = np.random.default_rng(7)
    d, n = 3, 400
    X = rng.standard_normal((n, d)) * np.exp(rng.uniform(-4, 4, (n, 1)))
    y = rng.standard_normal(n) * 50
    theta = rng.standard_normal((1, d))
    h = 1e-6
    grads = np.stack(
        [
            (huber_regression(theta + h * e, X, y) - huber_regression(theta - h * e, X, y))[0] / (2 * h)
            for e in np.eye(d)
        ],
        axis=1,
    )
    norms = np.linalg.norm(grads, axis=1)
    assert norms.max() <= math.sqrt(2.0) * (1 + 1e-4)
    assert norms.max() > 1.0  # the bound is nearly attained (||x||^2 near 2, |r| > c)


def test_logistic_regression_is_the_bernoulli_nll(data) -> None:
    theta, X, _, y = data
    L = logistic_regression(theta, X, y)
    z = theta @ X.T
    p = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(L, -(y * np.log(p) + (1 - y) * np.log1p(-p)), rtol=1e-9, atol=1e-14)


def test_logistic_regression_does_not_overflow_at_huge_scores() -> None:
    """|z| up to 1e300: np.logaddexp(0, z) - y z never forms exp(z)."""
    theta = np.array([[1e300], [-1e300], [1.0]])
    X = np.array([[1.0], [-1.0], [1.0], [-1.0]])
    y = np.array([1.0, 1.0, 0.0, 0.0])
    with np.errstate(all="raise"):
        L = logistic_regression(theta, X, y)
    assert np.isfinite(L).all()
    # z = 1e300, -1e300, 1e300, -1e300; the softplus of a score below -700 is taken at -700 (no underflow)
    floor = math.log1p(math.exp(-700.0))
    np.testing.assert_array_equal(L[0], [0.0, 1e300, 1e300, floor])
    np.testing.assert_array_equal(L[1], [1e300, 0.0, floor, 1e300])
    small, large = math.log1p(math.exp(-1)), math.log1p(math.e)
    np.testing.assert_allclose(L[2], [small, large, large, small], rtol=1e-14)


# --- validation: theta and shapes are checked, data values are not -----------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda X, y: gaussian_location(np.array([[np.nan, 0.0, 0.0]]), X),
        lambda X, y: gaussian_location(np.array([[np.inf, 0.0, 0.0]]), X),
        lambda X, y: gaussian_location(np.zeros(3), X),  # 1-D theta
        lambda X, y: gaussian_location(np.zeros((2, 4)), X),  # wrong d
        lambda X, y: gaussian_location(np.zeros((2, 3)), X[0]),  # 1-D X
        lambda X, y: huber_regression(np.zeros((2, 3)), X, y[:-1]),  # y too short
        lambda X, y: huber_regression(np.zeros((2, 3)), X, y[:, None]),  # 2-D y
        lambda X, y: huber_regression(np.zeros((2, 3)), X, y, delta_huber=0.0),
        lambda X, y: huber_regression(np.zeros((2, 3)), X, y, clip=-1.0),
        lambda X, y: huber_regression(np.zeros((2, 3)), X, y, clip=math.inf),
        lambda X, y: logistic_regression(np.full((2, 3), -np.inf), X, y),
        lambda X, y: logistic_regression(np.zeros((2, 3)), [["a", "b", "c"]] * len(y), y),
    ],
)
def test_bad_theta_or_shapes_are_refused(data, call) -> None:
    _, X, y, _ = data
    with pytest.raises(InputDataError):
        call(X, y)


def test_non_finite_data_stays_in_its_own_column(data) -> None:
    theta, X, y, y_bin = data
    X = X.copy()
    X[2] = [np.nan, 1.0, 1.0]
    X[5] = [np.inf, 0.0, 0.0]
    X[7] = [1e200, 1e200, 0.0]
    for L in (
        gaussian_location(theta, X),
        huber_regression(theta, X, y),
        logistic_regression(theta, X, y_bin),
    ):
        assert L.shape == (B_POINTS, N_USERS)
        assert not np.isfinite(L[:, 2]).any()
        ok = np.setdiff1d(np.arange(N_USERS), [2, 5, 7])
        assert np.isfinite(L[:, ok]).all()


# --- the registration check -------------------------------------------------------------------------------


def test_the_built_in_losses_pass_the_check(data) -> None:
    _, X, y, y_bin = data
    for seed in range(5):
        check_row_independent(gaussian_location, X, rng=np.random.default_rng(seed))
        check_row_independent(huber_regression, X, y, rng=np.random.default_rng(seed))
        check_row_independent(
            partial(huber_regression, delta_huber=0.3, clip=5.0), X, y, rng=np.random.default_rng(seed)
        )
        check_row_independent(logistic_regression, X, y_bin, rng=np.random.default_rng(seed))


def test_the_check_passes_on_bigger_batches(data) -> None:
    """Bitwise per-column results also through BLAS matmul at a less toy size."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((300, 12))
    y = rng.standard_normal(300)
    theta = rng.standard_normal((40, 12))
    check_row_independent(huber_regression, X, y, rng=rng, theta_batch=theta)
    check_row_independent(logistic_regression, X, (y > 0).astype(int), rng=rng, theta_batch=theta)


def loss_normalised_by_user_max(theta_batch: np.ndarray, X: np.ndarray) -> np.ndarray:
    """A bad plug-in: divides each theta's losses by their max over users (a cross-user statistic)."""
    L = gaussian_location(theta_batch, X)
    return L / L.max(axis=1, keepdims=True)


def loss_on_features_scaled_by_column_max(theta_batch: np.ndarray, X: np.ndarray) -> np.ndarray:
    """A bad plug-in: rescales each feature column of X by its max |value| over users."""
    return gaussian_location(theta_batch, X / np.abs(X).max(axis=0))


@pytest.mark.parametrize("bad", [loss_normalised_by_user_max, loss_on_features_scaled_by_column_max])
def test_a_loss_normalised_across_users_is_refused(data, bad) -> None:
    _, X, _, _ = data
    for seed in range(5):
        with pytest.raises(InputDataError, match="not row-independent.*row i"):
            check_row_independent(bad, X, rng=np.random.default_rng(seed))


def test_a_centred_or_random_loss_is_refused(data) -> None:
    _, X, y, _ = data
    noise = np.random.default_rng(0)

    def centred(theta_batch: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        return huber_regression(theta_batch, X - X.mean(axis=0), y)

    def noisy(theta_batch: np.ndarray, X: np.ndarray) -> np.ndarray:
        return gaussian_location(theta_batch, X) + noise.standard_normal((len(theta_batch), len(X)))

    with pytest.raises(InputDataError, match="not row-independent"):
        check_row_independent(centred, X, y, rng=np.random.default_rng(1))
    with pytest.raises(InputDataError, match="not row-independent"):
        check_row_independent(noisy, X, rng=np.random.default_rng(1))


def test_wrong_shapes_mutation_and_crashes_are_refused(data) -> None:
    _, X, y, _ = data

    def transposed(theta_batch: np.ndarray, X: np.ndarray) -> np.ndarray:
        return gaussian_location(theta_batch, X).T

    def summed(theta_batch: np.ndarray, X: np.ndarray) -> np.ndarray:
        return gaussian_location(theta_batch, X).sum(axis=1)

    def mutating(theta_batch: np.ndarray, X: np.ndarray) -> np.ndarray:
        X *= 2.0
        return gaussian_location(theta_batch, X)

    def crashing(theta_batch: np.ndarray, X: np.ndarray) -> np.ndarray:
        raise ZeroDivisionError("boom")

    rng = np.random.default_rng(0)
    with pytest.raises(InputDataError, match=r"shape \(b, n\)"):
        check_row_independent(transposed, X, rng=rng)
    with pytest.raises(InputDataError, match=r"shape \(b, n\)"):
        check_row_independent(summed, X, rng=rng)
    with pytest.raises(InputDataError, match="modified its input"):
        check_row_independent(mutating, X, rng=rng)
    with pytest.raises(InputDataError, match="ZeroDivisionError"):
        check_row_independent(crashing, X, rng=rng)
    with pytest.raises(InputDataError, match="same number of users"):
        check_row_independent(huber_regression, X, y[:-1], rng=rng)
    with pytest.raises(InputDataError, match="at least 2 users"):
        check_row_independent(gaussian_location, X[:1], rng=rng)
    with pytest.raises(InputDataError, match="at least one row array"):
        check_row_independent(gaussian_location, rng=rng)


# ------------------------------------------------------------------------------------- no subnormal floats


def adversarial_rows() -> tuple[np.ndarray, np.ndarray]:
    """Rows with subnormal, tiny, huge and large-score values; outcomes 0/1 and tiny."""
    X = np.array(
        [
            [1e-310, -3e-320, 0.5],  # subnormal entries
            [1e-200, 2.0**-401, -1e-300],  # tiny: their products with a tiny theta would underflow
            [720.0, 1.0, 0.0],  # a score of -720: exp underflows to a subnormal in a plain softplus
            [-720.0, -1.0, 1e300],
            [1.0, 1e-160, 1.0],
        ]
    )
    y = np.array([0.0, 1.0, 1e-310, 1.0, 0.0])
    return X, y


THETAS = np.array([[1e-200, 1e-200, 1e-200], [-1.0, 0.0, 0.0], [1.0, 1e-170, 0.0], [1e-200, 2.0**-401, 0.5]])


@pytest.mark.parametrize("loss", ["gaussian", "huber", "logistic"])
def test_no_operation_underflows_whatever_the_rows_and_theta(loss: str) -> None:
    """A subnormal float is ~100x slower to compute with: a loss or gradient that underflowed on some rows
    would tell a partner through the step's time that a row holds what its theta probes. Under
    ``np.errstate(under="raise")`` every built-in loss and the per-user gradients, clipping and sum run on
    adversarial rows and theta without one underflow."""
    X, y = adversarial_rows()
    fn = {
        "gaussian": lambda t: gaussian_location(t, X),
        "huber": lambda t: huber_regression(t, X, y),
        "logistic": lambda t: logistic_regression(t, X, y),
    }[loss]
    W = np.array([[1e-300, 1.0, -1e-250, 2.0], [0.5, 1e-200, 1.0, -1e-300], [1.0, 1.0, 1e-310, 1.0]])
    with np.errstate(under="raise"):
        L = fn(THETAS)
        diagnostics = private_gradient_diagnostics(W, L, B=1.0, T=4, mu=1.0, rng=np.random.default_rng(1))
    assert np.isfinite(diagnostics.released).all()


def test_the_controls_underflow() -> None:
    """What the test above guards against: a plain softplus at a score of -720, a product of tiny values."""
    with np.errstate(under="raise"):
        with pytest.raises(FloatingPointError):
            np.logaddexp(0.0, np.array([-720.0]))
        with pytest.raises(FloatingPointError):
            np.array([1e-200]) * np.array([1e-200])


def test_the_clamped_softplus_is_within_1e_300_of_the_exact_loss() -> None:
    z = np.array([[-1000.0, -720.0, -700.0, -1.0, 0.0, 3.0, 700.0, 720.0, 1e6]])
    X = np.eye(1)
    exact = np.logaddexp(0.0, z)  # (logistic with y = 0 is the softplus of the score)
    ours = np.concatenate([logistic_regression(z[:, [k]], X, np.zeros(1)) for k in range(z.shape[1])], axis=1)
    np.testing.assert_allclose(ours, exact, rtol=1e-15, atol=1e-300)
