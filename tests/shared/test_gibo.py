"""DP-GIBO numerics (shared.bo.gibo) against finite differences, brute force and hand computations.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO): Section 2.4 (gradient GP), Section 3.1 / Alg. 1
line 4 (alpha = Tr Sigma), Alg. 2 line 4 (adaptive b), Alg. 1 lines 6-8 + Lemma 3.1 (clipping, noise
2 B sqrt(T) / (n mu)), Remark 4.1 (AdaGrad), Section 3.4 (sigma^2 I in line 6), Section 4.1 (normal location).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from shared.bo.gibo.acquisition import _Acq, acquisition, choose_adaptive_batch, optimize_batch
from shared.bo.gibo.gp import GradientGP
from shared.bo.gibo.kernels import PolynomialKernel, SEKernel
from shared.bo.gibo.loop import run_dp_gibo
from shared.bo.gibo.private_gradient import (
    clip_rows,
    noise_std,
    per_user_gradients,
    private_gradient,
    private_gradient_diagnostics,
    step_mechanism,
)
from shared.bo.gibo.updates import AdaGrad, GradientDescent, make_updater, project_to_bounds
from shared.errors import InputDataError

KERNELS = [SEKernel(lengthscale=0.7, signal_variance=1.3), PolynomialKernel(degree=2, offset=1.0)]
KERNEL_IDS = ["se", "poly2"]


def fd_grad(f, x: np.ndarray, h: float = 1e-5) -> np.ndarray:
    out = np.zeros_like(x)
    for k in range(x.shape[0]):
        e = np.zeros_like(x)
        e[k] = h
        out[k] = (f(x + e) - f(x - e)) / (2 * h)
    return out


def fd_mixed(kern, x: np.ndarray, y: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """d^2 k(x, y) / (dx_i dy_j) by central differences."""
    d = x.shape[0]
    out = np.zeros((d, d))
    for i in range(d):
        for j in range(d):
            ei, ej = np.eye(d)[i] * h, np.eye(d)[j] * h

            def k(a, b):
                return float(kern(a[None, :], b[None, :])[0, 0])

            out[i, j] = (k(x + ei, y + ej) - k(x + ei, y - ej) - k(x - ei, y + ej) + k(x - ei, y - ej)) / (
                4 * h * h
            )
    return out


# -- kernels and the gradient GP --------------------------------------------------------------------
@pytest.mark.parametrize("kern", KERNELS, ids=KERNEL_IDS)
def test_kernel_derivatives_match_finite_differences(kern) -> None:
    rng = np.random.default_rng(0)
    theta = rng.normal(size=3) * 0.5
    X = rng.normal(size=(4, 3)) * 0.5
    G = kern.grad(theta, X)
    assert G.shape == (3, 4)
    for j in range(4):
        fd = fd_grad(lambda t, j=j: float(kern(t[None, :], X[j : j + 1])[0, 0]), theta)
        np.testing.assert_allclose(G[:, j], fd, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(kern.grad_grad(theta), fd_mixed(kern, theta, theta), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kern", [*KERNELS, PolynomialKernel(degree=3, offset=0.5)], ids=[*KERNEL_IDS, "poly3"]
)
def test_kernel_second_derivatives_match_finite_differences(kern) -> None:
    rng = np.random.default_rng(5)
    theta = rng.normal(size=3) * 0.5
    A, B = rng.normal(size=(2, 3)) * 0.5, rng.normal(size=(4, 3)) * 0.5
    GX = kern.grad_x(A, B)
    assert GX.shape == (2, 4, 3)
    for i in range(2):
        for j in range(4):
            fd = fd_grad(lambda a, j=j: float(kern(a[None, :], B[j : j + 1])[0, 0]), A[i])
            np.testing.assert_allclose(GX[i, j], fd, rtol=1e-6, atol=1e-9)
    H = kern.grad_cross(theta, B)
    assert H.shape == (4, 3, 3)
    for j in range(4):
        np.testing.assert_allclose(H[j], fd_mixed(kern, theta, B[j]), rtol=1e-5, atol=1e-6)


def test_se_prior_gradient_covariance_is_s2_over_l2_identity() -> None:
    kern = SEKernel(lengthscale=0.5, signal_variance=2.0)
    np.testing.assert_allclose(kern.grad_grad(np.array([0.3, -1.0])), 8.0 * np.eye(2))


@pytest.mark.parametrize("kern", KERNELS, ids=KERNEL_IDS)
def test_grad_mean_matches_central_differences_of_the_mean(kern) -> None:
    rng = np.random.default_rng(1)
    D = rng.uniform(-1, 1, size=(8, 3))
    y = rng.normal(size=8)
    gp = GradientGP(kern, D)
    theta = np.array([0.1, -0.2, 0.3])
    fd = fd_grad(lambda t: float(gp.mean(t, y)), theta, h=1e-5)
    np.testing.assert_allclose(gp.grad_mean(theta, y), fd, rtol=1e-5, atol=1e-8)
    Y = rng.normal(size=(8, 4))  # several users at once
    np.testing.assert_allclose(gp.grad_mean(theta, Y)[:, 2], gp.grad_mean(theta, Y[:, 2]), rtol=1e-12)


@pytest.mark.parametrize("kern", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize("noise_var", [0.0, 0.05])
def test_grad_cov_matches_brute_force(kern, noise_var) -> None:
    rng = np.random.default_rng(2)
    D = rng.uniform(-1, 1, size=(5, 3))
    theta = np.array([0.2, 0.0, -0.4])
    gp = GradientGP(kern, D, noise_var=noise_var, jitter=1e-10)
    # independent: FD derivatives of the kernel and an explicit inverse
    G = np.column_stack(
        [fd_grad(lambda t, j=j: float(kern(t[None, :], D[j : j + 1])[0, 0]), theta) for j in range(5)]
    )
    K = kern(D, D) + (noise_var + 1e-10) * np.eye(5)
    brute = fd_mixed(kern, theta, theta) - G @ np.linalg.inv(K) @ G.T
    np.testing.assert_allclose(gp.grad_cov(theta), brute, rtol=1e-4, atol=1e-5)
    y = rng.normal(size=5)  # Section 3.4: the noise variance enters line 6 as K + sigma^2 I
    np.testing.assert_allclose(gp.grad_mean(theta, y), G @ np.linalg.solve(K, y), rtol=1e-5, atol=1e-7)


def test_empty_design_gives_the_prior() -> None:
    kern = SEKernel(lengthscale=2.0)
    gp = GradientGP(kern, np.zeros((0, 2)))
    np.testing.assert_allclose(gp.grad_cov(np.zeros(2)), 0.25 * np.eye(2))
    assert gp.grad_weights(np.zeros(2)).shape == (2, 0)


# -- acquisition ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kern", KERNELS, ids=KERNEL_IDS)
def test_acquisition_equals_trace_of_the_refitted_gp_and_decreases(kern) -> None:
    rng = np.random.default_rng(3)
    D = rng.uniform(-1, 1, size=(3, 3))
    theta = np.array([0.1, 0.2, -0.1])
    gp = GradientGP(kern, D)
    Z = rng.uniform(-1, 1, size=(3, 3))
    for b in (1, 2, 3):
        full = GradientGP(kern, np.vstack([D, Z[:b]])).grad_cov_trace(theta)
        np.testing.assert_allclose(acquisition(Z[:b], gp, theta), full, rtol=1e-7, atol=1e-9)
    values = [gp.grad_cov_trace(theta)] + [acquisition(Z[:b], gp, theta) for b in (1, 2, 3)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))


@pytest.mark.parametrize("kern", KERNELS, ids=KERNEL_IDS)
@pytest.mark.parametrize(("m", "noise_var"), [(0, 0.0), (4, 0.0), (4, 0.05)])
def test_acquisition_gradient_matches_central_differences(kern, m, noise_var) -> None:
    """The analytic d alpha / dZ the batch optimiser uses, against central differences of alpha."""
    rng = np.random.default_rng(6)
    gp = GradientGP(kern, rng.uniform(-1, 1, size=(m, 3)), noise_var=noise_var)
    theta = np.array([0.2, -0.1, 0.3])
    acq = _Acq(gp, theta)
    Z = rng.uniform(-1, 1, size=(3, 3))
    value, grad = acq.value_and_grad(Z)
    assert value == acquisition(Z, gp, theta)
    fd = fd_grad(lambda z: acq(z.reshape(3, 3)), Z.ravel(), h=1e-6).reshape(3, 3)
    assert np.abs(fd).max() > 1e-3  # (a gradient that is not trivially zero)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)


def test_acquisition_by_hand_one_dimension() -> None:
    s2, ell, r = 1.5, 0.8, 0.5
    kern = SEKernel(lengthscale=ell, signal_variance=s2)
    gp = GradientGP(kern, np.zeros((0, 1)), jitter=0.0)
    theta = np.array([0.3])
    # Sigma = s2/l^2 - (dk)^2 / k(z, z),  dk = -(theta - z)/l^2 s2 exp(-r^2 / (2 l^2))
    hand = s2 / ell**2 * (1.0 - r**2 / ell**2 * math.exp(-(r**2) / ell**2))
    assert acquisition(np.array([[0.3 + r]]), gp, theta) == pytest.approx(hand, rel=1e-12)
    # optimum over one point: r = l, alpha = s2 / l^2 (1 - 1/e)
    Z, alpha = optimize_batch(gp, theta, 1, [[-3.0, 3.0]], np.random.default_rng(0))
    assert alpha == pytest.approx(s2 / ell**2 * (1 - math.exp(-1)), rel=1e-6)
    assert abs(abs(Z[0, 0] - 0.3) - ell) < 1e-3


def test_optimize_batch_stays_in_bounds_and_beats_its_start() -> None:
    kern = SEKernel(lengthscale=1.0)
    gp = GradientGP(kern, np.array([[0.0, 0.0]]))
    theta = np.array([0.9, 0.9])
    bounds = np.array([[0.0, 1.0], [0.5, 1.0]])
    Z, alpha = optimize_batch(gp, theta, 3, bounds, np.random.default_rng(4))
    assert Z.shape == (3, 2)
    assert (Z >= bounds[:, 0]).all() and (Z <= bounds[:, 1]).all()
    assert alpha < gp.grad_cov_trace(theta)
    with pytest.raises(InputDataError, match="outside the bounds"):
        optimize_batch(gp, np.array([2.0, 0.9]), 1, bounds, np.random.default_rng(0))


def test_algorithm2_picks_the_smallest_sufficient_batch() -> None:
    kern = SEKernel(lengthscale=1.0, signal_variance=1.0)  # d = 1: prior trace 1, best b=1 leaves 1 - 1/e
    gp = GradientGP(kern, np.zeros((0, 1)))
    theta, bounds = np.array([0.0]), [[-3.0, 3.0]]
    choice = choose_adaptive_batch(gp, theta, bounds, 0.5, np.random.default_rng(5))
    assert choice.b == 2 and choice.reached_tolerance and choice.alpha <= 0.5
    assert choice.Z.shape == (2, 1)
    _, alpha1 = optimize_batch(gp, theta, 1, bounds, np.random.default_rng(5))
    assert alpha1 > 0.5  # b = 1 is not enough
    easy = choose_adaptive_batch(gp, theta, bounds, 1.5, np.random.default_rng(5))  # above the prior trace
    assert easy.b == 1 and easy.reached_tolerance
    capped = choose_adaptive_batch(gp, theta, bounds, 0.5, np.random.default_rng(5), max_b=1)
    assert capped.b == 1 and not capped.reached_tolerance


def test_algorithm2_in_two_dimensions() -> None:
    kern = SEKernel(lengthscale=1.0)
    gp = GradientGP(kern, np.zeros((0, 2)))
    # one point reduces the trace 2 by at most 1/e; two points can remove most of both directions
    choice = choose_adaptive_batch(gp, np.zeros(2), [[-3, 3], [-3, 3]], 1.5, np.random.default_rng(6))
    assert choice.b == 2 and choice.alpha <= 1.5


# -- private gradient -------------------------------------------------------------------------------
def _w_and_l(seed: int = 7, m: int = 6, n: int = 40, d: int = 3):
    rng = np.random.default_rng(seed)
    gp = GradientGP(SEKernel(lengthscale=0.8), rng.uniform(-1, 1, size=(m, d)))
    W = gp.grad_weights(np.zeros(d))
    L = rng.normal(size=(m, n)) * 3.0
    return W, L


def test_per_user_gradients_equal_a_row_loop() -> None:
    W, L = _w_and_l()
    G = per_user_gradients(W, L)
    loop = np.array([W @ L[:, i] for i in range(L.shape[1])])
    np.testing.assert_allclose(G, loop, rtol=1e-12, atol=1e-12)


def test_clipping_and_non_finite_rows() -> None:
    W, L = _w_and_l()
    L[2, 5] = np.nan
    L[0, 9] = np.inf
    diag = private_gradient_diagnostics(W, L, B=0.5, T=4, mu=math.inf, rng=np.random.default_rng(0))
    assert diag.n_nonfinite == 2
    assert (diag.G[[5, 9]] == 0).all() and (diag.G_clipped[[5, 9]] == 0).all()
    norms = np.linalg.norm(diag.G_clipped, axis=1)
    assert (norms <= 0.5 * (1 + 1e-12)).all()
    raw = np.linalg.norm(diag.G, axis=1)
    assert (raw > 0.5).sum() > 5  # the bound binds on some users
    small = raw <= 0.5
    np.testing.assert_allclose(diag.G_clipped[small], diag.G[small])
    np.testing.assert_allclose(
        diag.clean_average, diag.G_clipped.sum(axis=0) / L.shape[1]
    )  # zeros count in n
    np.testing.assert_allclose(clip_rows(np.array([[3.0, 4.0], [0.0, 0.0]]), 1.0), [[0.6, 0.8], [0.0, 0.0]])
    assert diag.sigma == 0 and np.array_equal(diag.released, diag.clean_average)


def test_noise_std_and_its_distribution() -> None:
    """sigma = 2 B sqrt(T) / (n mu), plus the lattice's at most 2^-20 of it; the released gradient is the
    clean one snapped to the lattice plus integer noise: N(0, sigma^2) per entry, and on the lattice."""
    W, L = _w_and_l(n=40)
    B, T, mu, n = 0.7, 9, 1.5, 40
    sigma = 2 * B * math.sqrt(T) / (n * mu)
    d = W.shape[0]
    assert sigma <= noise_std(B, T, n, mu, d) <= sigma * (1 + 2.0**-20)
    mechanism = step_mechanism(B, T, n, mu, d)
    assert mechanism is not None and mechanism.sigma == noise_std(B, T, n, mu, d)
    rng = np.random.default_rng(8)
    clean = private_gradient_diagnostics(W, L, B=B, T=T, mu=math.inf).clean_average
    released = np.stack([private_gradient(W, L, B=B, T=T, mu=mu, rng=rng) for _ in range(3000)])
    g = mechanism.granularity
    assert np.array_equal(released / g, np.rint(released / g))  # every output on the lattice g Z^d
    draws = (released - clean).ravel()
    assert stats.kstest(draws, "norm", args=(0.0, sigma)).pvalue > 1e-6
    assert stats.kstest(draws, "norm", args=(0.0, sigma / 2)).pvalue < 1e-6  # the control must fail


def test_private_gradient_input_errors() -> None:
    W, L = _w_and_l()
    with pytest.raises(InputDataError, match="same m"):
        per_user_gradients(W, L[:-1])
    with pytest.raises(InputDataError, match="mu"):
        private_gradient(W, L, B=1.0, T=1, mu=0.0, rng=np.random.default_rng(0))
    with pytest.raises(InputDataError, match="B"):
        private_gradient(W, L, B=-1.0, T=1, mu=1.0, rng=np.random.default_rng(0))


# -- updates ----------------------------------------------------------------------------------------
def test_gradient_descent_and_projection_by_hand() -> None:
    bounds = np.array([[-1.0, 1.0], [0.0, 2.0]])
    gd = GradientDescent(lr=0.5)
    np.testing.assert_allclose(gd.step([0.0, 1.0], [0.4, -1.0], bounds), [-0.2, 1.5])
    np.testing.assert_allclose(gd.step([0.0, 1.0], [4.0, -4.0], bounds), [-1.0, 2.0])  # projected
    np.testing.assert_allclose(project_to_bounds([5.0, -3.0], bounds), [1.0, 0.0])
    assert make_updater(json.loads(json.dumps(gd.to_state()))) == gd


def test_adagrad_by_hand_and_json_state() -> None:
    bounds = np.tile([-10.0, 10.0], (2, 1))
    ada = AdaGrad(lr=0.1, eps=1e-8)
    t1 = ada.step([0.0, 0.0], [3.0, -4.0], bounds)
    np.testing.assert_allclose(t1, [-0.1, 0.1], rtol=1e-7)  # g / sqrt(g^2) = sign(g)
    state = json.loads(json.dumps(ada.to_state()))
    assert state["accum"] == [9.0, 16.0]
    again = make_updater(state)
    t2 = again.step(t1, [4.0, 3.0], bounds)
    np.testing.assert_allclose(t2, t1 - 0.1 * np.array([4.0 / 5.0, 3.0 / 5.0]), rtol=1e-7)
    assert again.to_state()["accum"] == [25.0, 25.0]


def test_update_input_errors() -> None:
    with pytest.raises(InputDataError, match="finite"):
        GradientDescent(lr=0.1).step([np.nan, 0.0], [1.0, 1.0], [[0, 1], [0, 1]])
    with pytest.raises(InputDataError, match="shape"):
        GradientDescent(lr=0.1).step([0.0, 0.0], [1.0], [[0, 1], [0, 1]])
    with pytest.raises(InputDataError):
        GradientDescent(lr=-1.0)
    with pytest.raises(InputDataError, match="kind"):
        make_updater({"kind": "adam"})


# -- Section 4.1: location of the normal model ------------------------------------------------------
def _normal_location(n: int, seed: int = 0):
    x = 1.0 + np.random.default_rng(seed).standard_normal((n, 5))  # theta* = 1 in R^5

    def loss_matrix(Z: np.ndarray) -> np.ndarray:  # [b, n]: ||x_i - z||^2 / 2
        return 0.5 * ((Z[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)

    return x, loss_matrix


def _run_41(mu: float, B: float, T: int, n: int):
    x, loss_matrix = _normal_location(n)
    return x.mean(axis=0), run_dp_gibo(
        loss_matrix,
        np.zeros(5),
        np.tile([-5.0, 5.0], (5, 1)),
        T=T,
        B=B,
        mu=mu,
        kernel=PolynomialKernel(degree=2, offset=1.0),
        updater=GradientDescent(lr=0.5),
        rng=np.random.default_rng(2),
        noise_rng=np.random.default_rng(1),
        batch_size=3,
    )


def test_section_4_1_non_private_converges_to_the_mle() -> None:
    mle, res = _run_41(mu=math.inf, B=10.0, T=30, n=50)  # B large: clipping inactive
    assert res.thetas.shape == (31, 5) and res.batch_sizes == [3] * 30
    assert np.abs(res.theta - mle).max() < 1e-4
    assert res.alphas[-1] < 1e-6  # the quadratic is in the RKHS: the gradient is learned exactly


def test_section_4_1_private_mu_2_ends_near_the_mle() -> None:
    mle, res = _run_41(mu=2.0, B=1.0, T=60, n=50)  # the paper's B = 1, n = 50, b = 3
    assert res.sigma == pytest.approx(2 * 1.0 * math.sqrt(60) / (50 * 2.0))
    assert np.abs(res.theta - mle).max() < 4 * res.sigma
    assert np.abs(res.thetas[0] - mle).max() > 4 * res.sigma  # it did move there


def test_algorithm2_loop_and_loop_errors() -> None:
    x, loss_matrix = _normal_location(20)
    res = run_dp_gibo(
        loss_matrix,
        np.zeros(5),
        np.tile([-5.0, 5.0], (5, 1)),
        T=6,
        B=10.0,
        mu=math.inf,
        kernel=PolynomialKernel(degree=2),
        updater=AdaGrad(lr=0.5),
        rng=np.random.default_rng(3),
        noise_rng=np.random.default_rng(0),
        tolerance=1.0,
    )
    assert all(1 <= b <= 6 for b in res.batch_sizes)
    assert all(a <= 1.0 for a in res.alphas)
    assert res.design.shape == (sum(res.batch_sizes), 5)
    kw = {"T": 2, "B": 1.0, "mu": 1.0, "kernel": SEKernel(), "updater": GradientDescent(0.1)}
    kw["noise_rng"] = np.random.default_rng(0)
    with pytest.raises(InputDataError, match="exactly one"):
        run_dp_gibo(
            loss_matrix, np.zeros(5), np.tile([-5.0, 5.0], (5, 1)), rng=np.random.default_rng(0), **kw
        )
    with pytest.raises(InputDataError, match="outside"):
        run_dp_gibo(
            loss_matrix,
            np.full(5, 9.0),
            np.tile([-5.0, 5.0], (5, 1)),
            rng=np.random.default_rng(0),
            batch_size=1,
            **kw,
        )
    with pytest.raises(InputDataError, match="finite"):
        run_dp_gibo(
            loss_matrix,
            np.full(5, np.nan),
            np.tile([-5.0, 5.0], (5, 1)),
            rng=np.random.default_rng(0),
            batch_size=1,
            **kw,
        )
    with pytest.raises(InputDataError, match="loss_matrix_fn"):
        run_dp_gibo(
            lambda Z: np.zeros((Z.shape[0] + 1, 3)),
            np.zeros(5),
            np.tile([-5.0, 5.0], (5, 1)),
            rng=np.random.default_rng(0),
            batch_size=1,
            **kw,
        )


def test_section_3_4_noisy_observations_enter_line_6_only() -> None:
    x, clean_loss = _normal_location(50)
    obs_rng = np.random.default_rng(11)

    def noisy_loss(Z: np.ndarray) -> np.ndarray:  # f + v, v ~ N(0, 0.1^2) per evaluation
        return clean_loss(Z) + 0.1 * obs_rng.standard_normal((Z.shape[0], 1))

    def run(obs_noise_var: float):
        return run_dp_gibo(
            noisy_loss,
            np.zeros(5),
            np.tile([-5.0, 5.0], (5, 1)),
            T=30,
            B=10.0,
            mu=math.inf,
            kernel=PolynomialKernel(degree=2),
            updater=GradientDescent(lr=0.5),
            rng=np.random.default_rng(2),
            noise_rng=np.random.default_rng(0),
            batch_size=3,
            obs_noise_var=obs_noise_var,
        )

    res = run(0.01)
    assert np.abs(res.theta - x.mean(axis=0)).max() < 0.1
    obs_rng = np.random.default_rng(11)
    plain = run(0.0)
    np.testing.assert_array_equal(res.design[:3], plain.design[:3])  # line 4 (acquisition) unchanged
    assert not np.allclose(res.gradients[0], plain.gradients[0])  # line 6 uses K + sigma^2 I
