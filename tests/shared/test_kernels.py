"""The kernel formulas written once in ``shared.bo.kernels``, and the modules that evaluate them through it
(the GP, DP-GIBO's kernels, the federation's exact SE kernel)."""

from __future__ import annotations

import numpy as np
import pytest

from shared.bo import kernels
from shared.bo.gibo.kernels import PolynomialKernel, SEKernel
from shared.bo.gp import GaussianProcess, Hyperparameters, se_kernel
from shared.federated import rff

RNG = np.random.default_rng(3)
A = RNG.normal(size=(7, 3))
B = RNG.normal(size=(11, 3))


def test_the_three_squared_distances_agree() -> None:
    diff = kernels.sqdist_from_diff(kernels.pairwise_diff(A, B))
    np.testing.assert_allclose(kernels.scaled_sqdist(A, B, 1.0), diff, rtol=1e-12)
    np.testing.assert_allclose(kernels.expanded_sqdist(A, B), diff, rtol=1e-10, atol=1e-12)
    assert (kernels.expanded_sqdist(A, A).diagonal() >= 0).all()  # clamped at 0


def test_every_se_kernel_is_the_one_formula() -> None:
    ls, s2 = 0.8, 1.7
    expected = s2 * np.exp(-0.5 * kernels.sqdist_from_diff(kernels.pairwise_diff(A, B)) / ls**2)
    hp = Hyperparameters(lengthscale=ls, signal_variance=s2)
    np.testing.assert_allclose(kernels.se_matrix(A, B, ls, s2), expected, rtol=1e-12)
    # the GP's and the federation's are se_matrix itself, bit for bit
    assert np.array_equal(se_kernel(A, B, hp), kernels.se_matrix(A, B, ls, s2))
    assert np.array_equal(rff.se_kernel(A, B, ls, s2), kernels.se_matrix(A, B, np.full(3, ls), s2))
    assert np.array_equal(SEKernel(ls, s2)(A, B), kernels.se_diff_matrix(A, B, ls, s2))
    np.testing.assert_allclose(SEKernel(ls, s2)(A, B), expected, rtol=1e-12)
    np.testing.assert_allclose(
        kernels.kernel_matrix(A, B, kind="se", lengthscale=ls), expected / s2, rtol=1e-12
    )
    gp = GaussianProcess(B, hp)  # the hot path's log-space form (se_finish_log) and the vectorised rows
    np.testing.assert_allclose(gp.kernel_row(4), se_kernel(B[4:5], B, hp)[0], rtol=1e-12)
    np.testing.assert_allclose(gp.kernel_rows([1, 4]), se_kernel(B[[1, 4]], B, hp), rtol=1e-12)


def test_se_from_sqdist_keeps_its_order_of_operations() -> None:
    sq = kernels.expanded_sqdist(A, B)
    assert np.array_equal(kernels.se_from_sqdist(sq, 2.5, sq_scale=0.49), 2.5 * np.exp(-0.5 * sq / 0.49))
    assert np.array_equal(kernels.se_from_sqdist(sq), np.exp(-0.5 * sq))
    out = sq.copy()
    assert kernels.se_from_sqdist(out, 2.0, out=out) is out
    assert np.array_equal(out, 2.0 * np.exp(-0.5 * sq))


@pytest.mark.parametrize("kernel", [SEKernel(0.9, 1.3), PolynomialKernel(2, 1.0), PolynomialKernel(3, 0.5)])
def test_the_derivatives_match_finite_differences(kernel: SEKernel | PolynomialKernel) -> None:
    theta, X, h = RNG.normal(size=3), RNG.normal(size=(5, 3)), 1e-6
    eye = np.eye(3)
    fd = np.stack(
        [(kernel(theta[None] + h * e, X) - kernel(theta[None] - h * e, X))[0] / (2 * h) for e in eye]
    )
    np.testing.assert_allclose(kernel.grad(theta, X), fd, rtol=1e-6, atol=1e-8)
    gx = kernel.grad_x(theta[None], X)[0]  # [m, d]
    np.testing.assert_allclose(gx, fd.T, rtol=1e-6, atol=1e-8)
    # H_j[a, c] = d/dz_jc of grad_a k(theta, z_j)
    H = kernel.grad_cross(theta, X)
    for c, e in enumerate(eye):
        step = (kernel.grad(theta, X + h * e) - kernel.grad(theta, X - h * e)) / (2 * h)  # [d, m]
        np.testing.assert_allclose(H[:, :, c], step.T, rtol=1e-5, atol=1e-7)
