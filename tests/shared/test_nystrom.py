"""Nystrom embedding (Zhou & Tan 2021, Alg. 4) and the kernels it embeds."""

from __future__ import annotations

import numpy as np
import pytest

from shared.bo.kernels import RowKernel, kernel_matrix
from shared.bo.nystrom import NystromEmbedding, inclusion_probabilities, pinv_sqrt, sample_dictionary
from shared.errors import InputDataError


def test_kernels_by_hand() -> None:
    A = np.array([[0.0, 0.0]])
    B = np.array([[0.3, 0.4], [0.0, 0.0]])  # distances 0.5 and 0
    ell = 0.25
    d = 0.5 / ell
    se = kernel_matrix(A, B, kind="se", lengthscale=ell)
    m52 = kernel_matrix(A, B, kind="matern52", lengthscale=ell)
    assert se[0, 0] == pytest.approx(np.exp(-0.5 * d * d), rel=1e-12)
    s5 = np.sqrt(5.0) * d
    assert m52[0, 0] == pytest.approx((1 + s5 + s5 * s5 / 3) * np.exp(-s5), rel=1e-12)
    assert se[0, 1] == m52[0, 1] == 1.0
    with pytest.raises(InputDataError):
        kernel_matrix(A, B, kind="rbf", lengthscale=1.0)


def test_row_kernel_blocks_do_not_depend_on_the_other_rows() -> None:
    Z = np.random.default_rng(0).normal(size=(50, 3))
    k = RowKernel(Z, kind="matern52", lengthscale=0.7)
    full = k.block([3, 7])
    sub = k.block([3, 7], [5, 9, 11])
    assert np.array_equal(full[:, [5, 9, 11]], sub)  # bitwise: entries are functions of their two rows


@pytest.mark.parametrize("kind", ["se", "matern52"])
def test_embedding_reproduces_the_kernel_on_its_dictionary(kind: str) -> None:
    rng = np.random.default_rng(1)
    D = rng.uniform(0, 1, size=(8, 2))
    X = rng.uniform(0, 1, size=(30, 2))
    K_D = kernel_matrix(D, D, kind=kind, lengthscale=0.3)
    emb = NystromEmbedding.from_gram(np.arange(8), K_D)
    phi_D = emb.features(K_D)  # [m, m]
    np.testing.assert_allclose(phi_D.T @ phi_D, K_D, atol=1e-8)
    # one side in D is enough: phi(u)^T phi(x) = k_D(u)^T K_D^+ k_D(x) = k(u, x)
    phi_X = emb.features(kernel_matrix(D, X, kind=kind, lengthscale=0.3))
    np.testing.assert_allclose(phi_D.T @ phi_X, kernel_matrix(D, X, kind=kind, lengthscale=0.3), atol=1e-8)
    # the symmetric root: W = W^T and W K_D W = projector (identity here, K_D full rank)
    np.testing.assert_allclose(emb.W, emb.W.T, atol=1e-12)
    np.testing.assert_allclose(emb.W @ K_D @ emb.W, np.eye(8), atol=1e-7)


def test_duplicate_atoms_are_handled_by_the_pseudo_inverse() -> None:
    D = np.array([[0.1], [0.5], [0.5], [0.9]])  # a duplicated atom: K_D is singular
    K_D = kernel_matrix(D, D, kind="se", lengthscale=0.3)
    assert np.linalg.matrix_rank(K_D) == 3
    emb = NystromEmbedding.from_gram(np.arange(4), K_D)
    phi = emb.features(K_D)
    np.testing.assert_allclose(phi.T @ phi, K_D, atol=1e-8)
    assert pinv_sqrt(np.zeros((0, 0))).shape == (0, 0)


def _approx_error(q: float, seed: int) -> tuple[int, float]:
    rng = np.random.default_rng(seed)
    pts = np.linspace(0, 1, 200)[:, None]
    X = rng.uniform(0, 1, size=(40, 1))
    s2 = np.full(200, 0.01)  # the same "posterior variance" everywhere: p = min(0.01 q, 1)
    keep = sample_dictionary(s2, q, rng)
    D = pts[keep]
    emb = NystromEmbedding.from_gram(np.flatnonzero(keep), kernel_matrix(D, D, kind="se", lengthscale=0.2))
    phi = emb.features(kernel_matrix(D, X, kind="se", lengthscale=0.2))
    err = float(np.abs(phi.T @ phi - kernel_matrix(X, X, kind="se", lengthscale=0.2)).max())
    return int(keep.sum()), err


def test_embedding_approximates_the_kernel_elsewhere_when_q_is_large() -> None:
    m_large, err_large = _approx_error(q=50.0, seed=2)  # p = 0.5: ~100 atoms on [0, 1]
    m_small, err_small = _approx_error(q=0.3, seed=2)  # p = 0.003: ~0-2 atoms
    assert 70 <= m_large <= 130
    assert err_large < 1e-6
    assert m_small < m_large and err_small > 1e-2


def test_inclusion_probabilities_are_min_q_sigma2_one() -> None:
    p = inclusion_probabilities([0.0, 0.001, 0.01, 0.5, -1e-17], q=50.0)
    np.testing.assert_allclose(p, [0.0, 0.05, 0.5, 1.0, 0.0])
    with pytest.raises(InputDataError):
        inclusion_probabilities([0.1], q=0.0)
    with pytest.raises(InputDataError):
        inclusion_probabilities([np.nan], q=1.0)


def test_sampling_frequencies_match_the_probabilities() -> None:
    s2 = np.array([0.0, 0.002, 0.01, 0.03, 1.0])
    q = 20.0
    p = np.minimum(q * s2, 1.0)  # 0, 0.04, 0.2, 0.6, 1
    rng = np.random.default_rng(3)
    N = 20_000
    counts = np.zeros(5)
    for _ in range(N):
        counts += sample_dictionary(s2, q, rng)
    freq = counts / N
    tol = 5 * np.sqrt(p * (1 - p) / N) + 1e-12  # 5 standard errors; exact at p in {0, 1}
    assert np.all(np.abs(freq - p) <= tol)


def test_sampling_is_reproducible_from_the_seed() -> None:
    s2 = np.random.default_rng(4).uniform(0, 0.1, size=100)
    a = sample_dictionary(s2, 10.0, np.random.default_rng([7, 3]))
    b = sample_dictionary(s2, 10.0, np.random.default_rng([7, 3]))
    assert np.array_equal(a, b)
