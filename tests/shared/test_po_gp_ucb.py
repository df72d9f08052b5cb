"""Algorithm 1 (PO-GP-UCB, the curator part) against the textbook SVD formula and the paper's lemmas.

The reference throughout is the formula of Kharkovskii et al. (2020), Alg. 1, computed the obvious way with
``numpy.linalg.svd`` of the column-centred X::

    Z = X~ M / sqrt(r)                                   (line 7, not lifted)
    Z = U sqrt(S^2 + omega^2) V^T M / sqrt(r)            (lines 9-10, lifted)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from shared.errors import InputDataError
from shared.privacy.po_gp_ucb import (
    Release,
    centred_sigma_min,
    centred_spectrum,
    largest_feasible_r,
    omega,
    privacy_table,
    release_projection,
)

DELTA = 1e-5
HUGE_EPSILON = 1e12  # omega ~ 1e-8: never lifted when sigma_min is O(1)


# -- helpers ------------------------------------------------------------------------------------------------
def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Relative Frobenius error ||a - b|| / ||b||."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def textbook_svd(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    Xc = np.asarray(X, dtype=np.float64) - np.asarray(X, dtype=np.float64).mean(axis=0)
    U, s, Vt = np.linalg.svd(Xc, full_matrices=False)
    return U, s, Vt


def textbook_release(X: np.ndarray, M: np.ndarray, w: float, lifted: bool) -> np.ndarray:
    """``U sqrt(S^2 + omega^2) V^T M / sqrt(r)`` (or ``U S V^T M / sqrt(r)``), thin SVD of the centred X."""
    U, s, Vt = textbook_svd(X)
    if lifted:
        s = np.sqrt(s**2 + w**2)
    return (U * s) @ Vt @ M / math.sqrt(M.shape[1])


def textbook_range_part(X: np.ndarray, M: np.ndarray, w: float) -> tuple[np.ndarray, np.ndarray]:
    """(``U+ sqrt(S+^2 + omega^2) V+^T M / sqrt(r)``, ``U+``): the lifted release on range(X~) only."""
    U, s, Vt = textbook_svd(X)
    pos = s > 1e-10 * s[0]
    Up, sp, Vpt = U[:, pos], s[pos], Vt[pos]
    return (Up * np.sqrt(sp**2 + w**2)) @ Vpt @ M / math.sqrt(M.shape[1]), Up


def epsilon_for(w: float, r: int, delta: float = DELTA) -> float:
    """The epsilon at which omega(r, epsilon, delta) == w (omega is proportional to 1/epsilon)."""
    return omega(r, 1.0, delta) / w


def gaussian_data(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # anisotropic columns and nonzero means, so centring and the spectrum both matter
    return rng.standard_normal((n, d)) * np.linspace(0.5, 2.0, d) + rng.uniform(-3, 3, d)


def with_singular_values(n: int, s: np.ndarray, seed: int) -> np.ndarray:
    """An n x d matrix whose centred version has exactly the singular values s (plus arbitrary means)."""
    rng = np.random.default_rng(seed)
    d = s.size
    W = rng.standard_normal((n, d))
    W -= W.mean(axis=0)  # columns orthogonal to the all-ones vector
    U, _ = np.linalg.qr(W)  # orthonormal and still centred
    V, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return (U * s) @ V.T + rng.uniform(-5, 5, d)


# -- omega (Alg. 1, line 5) ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("r", "epsilon", "delta", "expected"),
    [
        # 16 sqrt(10) ln(2e5) ln(1.6e7) / e^1.1, evaluated to 40 digits with decimal (natural logs)
        (10, math.exp(1.1), 1e-5, 3410.111889447612913),
        # 16 * 1 * ln(200) * ln(1600) / 1
        (1, 1.0, 0.01, 625.4353303946915231),
        # 16 * 10 * ln(2e6) * ln(1.6e9) / 2
        (100, 2.0, 1e-6, 24598.87144362381936),
    ],
)
def test_omega_by_hand(r: int, epsilon: float, delta: float, expected: float) -> None:
    assert omega(r, epsilon, delta) == pytest.approx(expected, rel=1e-12)
    formula = 16 * math.sqrt(r) * math.log(2 / delta) * math.log(16 * r / delta) / epsilon
    assert omega(r, epsilon, delta) == pytest.approx(formula, rel=1e-14)


def test_omega_is_increasing_in_r_and_decreasing_in_epsilon_and_delta() -> None:
    values = [omega(r, 2.0, DELTA) for r in range(1, 201)]
    assert all(b > a for a, b in zip(values, values[1:], strict=False))
    assert omega(10, 4.0, DELTA) == pytest.approx(omega(10, 2.0, DELTA) / 2, rel=1e-14)
    assert omega(10, 2.0, 1e-3) < omega(10, 2.0, 1e-5)


def test_omega_accepts_numpy_scalars() -> None:
    assert omega(np.int64(10), np.float64(3.0), np.float64(1e-5)) == pytest.approx(omega(10, 3.0, 1e-5))


# -- exactness against the textbook SVD ---------------------------------------------------------------------
N, D, R = 40, 6, 4


def _case(kind: str) -> tuple[np.ndarray, np.ndarray, float, str, bool]:
    """(X, M, epsilon, lift, expected lifted) for each branch of Alg. 1."""
    X = gaussian_data(N, D, seed=1)
    M = np.random.default_rng(2).standard_normal((D, R))
    s = textbook_svd(X)[1]
    if kind == "unlifted":  # sigma_min >= omega: line 7
        return X, M, HUGE_EPSILON, "auto", False
    if kind == "lifted-small-epsilon":  # omega >> s_max: the lift dominates
        return X, M, 0.5, "auto", True
    if kind == "lifted-comparable":  # sigma_min < omega < s_max: every gain sqrt(1 + omega^2/s^2) differs
        return X, M, epsilon_for(float(np.median(s)), R), "auto", True
    if kind == "always":  # omega = sigma_min / 2: "auto" would not lift, "always" must
        return X, M, epsilon_for(float(s[-1]) / 2, R), "always", True
    raise AssertionError(kind)


KINDS = ["unlifted", "lifted-small-epsilon", "lifted-comparable", "always"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block_rows", [None, 7, 1])
def test_release_matches_textbook_formula(kind: str, block_rows: int | None) -> None:
    X, M, epsilon, lift, lifted = _case(kind)
    rel = release_projection(
        X, epsilon=epsilon, delta=DELTA, r=R, lift=lift, projection=M, block_rows=block_rows
    )
    assert isinstance(rel, Release)
    assert rel.lifted is lifted
    assert rel.omega == omega(R, epsilon, DELTA)
    assert rel.sigma_min == pytest.approx(textbook_svd(X)[1][-1], rel=1e-10)
    assert rel.Z.shape == (N, R)
    assert rel_err(rel.Z, textbook_release(X, M, rel.omega, lifted)) < 1e-8


def test_always_lift_differs_from_auto_when_sigma_min_exceeds_omega() -> None:
    X, M, epsilon, _, _ = _case("always")
    auto = release_projection(X, epsilon=epsilon, delta=DELTA, r=R, projection=M)
    always = release_projection(X, epsilon=epsilon, delta=DELTA, r=R, lift="always", projection=M)
    assert auto.lifted is False and always.lifted is True
    assert auto.sigma_min >= auto.omega
    assert rel_err(auto.Z, textbook_release(X, M, auto.omega, lifted=False)) < 1e-8
    # the lift is visible: the textbook lifted and unlifted releases differ by far more than the tolerance
    assert rel_err(always.Z, auto.Z) > 1e-3


@pytest.mark.parametrize("kind", ["unlifted", "lifted-comparable"])
@pytest.mark.parametrize("block_rows", [None, 9])
def test_release_from_memmap(tmp_path, kind: str, block_rows: int | None) -> None:
    X, M, epsilon, lift, lifted = _case(kind)
    np.save(tmp_path / "X.npy", X)
    Xm = np.load(tmp_path / "X.npy", mmap_mode="r")
    assert isinstance(Xm, np.memmap)
    rel = release_projection(
        Xm, epsilon=epsilon, delta=DELTA, r=R, lift=lift, projection=M, block_rows=block_rows
    )
    assert rel.lifted is lifted
    assert rel_err(rel.Z, textbook_release(X, M, rel.omega, lifted)) < 1e-8
    in_memory = release_projection(X, epsilon=epsilon, delta=DELTA, r=R, lift=lift, projection=M)
    np.testing.assert_allclose(rel.Z, in_memory.Z, rtol=1e-10, atol=1e-10 * np.abs(in_memory.Z).max())


@pytest.mark.parametrize("offset", [1e4, 1e6])
@pytest.mark.parametrize("kind", ["unlifted", "lifted-comparable"])
@pytest.mark.parametrize("block_rows", [None, 7])
def test_large_column_means_are_centred_stably(offset: float, kind: str, block_rows: int | None) -> None:
    X, M, epsilon, lift, lifted = _case(kind)
    shifted = X + offset * np.linspace(1.0, -2.0, D)  # huge, differently signed column means
    rel = release_projection(
        shifted, epsilon=epsilon, delta=DELTA, r=R, lift=lift, projection=M, block_rows=block_rows
    )
    assert rel.lifted is lifted
    # reference on the unshifted data: the centred matrix is the same, without any cancellation
    assert rel_err(rel.Z, textbook_release(X, M, rel.omega, lifted)) < 1e-8
    assert rel.sigma_min == pytest.approx(textbook_svd(X)[1][-1], rel=1e-8)


def test_integer_and_list_input_is_accepted() -> None:
    rng = np.random.default_rng(5)
    Xi = rng.integers(-50, 50, size=(30, 4))
    M = rng.standard_normal((4, 3))
    expected = textbook_release(Xi.astype(np.float64), M, 0.0, lifted=False)
    for X in (Xi, Xi.tolist()):
        rel = release_projection(X, epsilon=HUGE_EPSILON, delta=DELTA, r=3, projection=M)
        assert rel.lifted is False
        assert rel_err(rel.Z, expected) < 1e-8


# -- centring -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_release_is_invariant_to_translation_and_has_centred_columns(kind: str) -> None:
    X, M, epsilon, lift, _ = _case(kind)
    base = release_projection(X, epsilon=epsilon, delta=DELTA, r=R, lift=lift, projection=M)
    moved = release_projection(
        X + np.array([3.0, -7.0, 100.0, 0.5, -0.25, 42.0]),
        epsilon=epsilon,
        delta=DELTA,
        r=R,
        lift=lift,
        projection=M,
    )
    assert moved.lifted is base.lifted
    assert rel_err(moved.Z, base.Z) < 1e-9
    np.testing.assert_allclose(base.Z.mean(axis=0), 0.0, atol=1e-12 * np.abs(base.Z).max())


# -- lifting ------------------------------------------------------------------------------------------------
def test_lifting_raises_every_singular_value_to_sqrt_s2_plus_omega2() -> None:
    d = r = 5
    s = np.array([40.0, 20.0, 9.0, 3.0, 0.5])
    X = with_singular_values(60, s, seed=3)
    Q, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((d, d)))
    M = Q * math.sqrt(r)  # M / sqrt(r) orthogonal: Z has exactly the singular values of the (lifted) X~
    epsilon = epsilon_for(10.0, r)
    rel = release_projection(X, epsilon=epsilon, delta=DELTA, r=r, projection=M)
    assert rel.omega == pytest.approx(10.0, rel=1e-12)
    assert rel.sigma_min == pytest.approx(0.5, rel=1e-9)
    assert rel.lifted is True
    got = np.linalg.svd(rel.Z, compute_uv=False)
    np.testing.assert_allclose(got, np.sqrt(s**2 + 100.0), rtol=1e-8)
    # without the lift the singular values are those of X~ itself
    plain = release_projection(X, epsilon=epsilon_for(0.4, r), delta=DELTA, r=r, projection=M)
    assert plain.lifted is False
    np.testing.assert_allclose(np.linalg.svd(plain.Z, compute_uv=False), s, rtol=1e-8)


def test_lifting_a_zero_singular_value_gives_omega() -> None:
    """A constant column has singular value 0; lifted, it becomes exactly omega."""
    d = r = 4
    X = with_singular_values(50, np.array([30.0, 12.0, 4.0]), seed=8)
    X = np.hstack([X, np.full((50, 1), 2.5)])
    Q, _ = np.linalg.qr(np.random.default_rng(9).standard_normal((d, d)))
    rel = release_projection(X, epsilon=epsilon_for(5.0, r), delta=DELTA, r=r, projection=Q * math.sqrt(r))
    assert rel.sigma_min == 0.0 and rel.lifted is True
    np.testing.assert_allclose(
        np.linalg.svd(rel.Z, compute_uv=False), np.sqrt(np.array([900.0, 144.0, 16.0, 0.0]) + 25.0), rtol=1e-8
    )


# -- rank-deficient X ---------------------------------------------------------------------------------------
def _rank_deficient(kind: str) -> np.ndarray:
    X = gaussian_data(30, 6, seed=11)
    if kind in ("duplicate", "both"):
        X[:, 4] = X[:, 1]
    if kind in ("constant", "both"):
        X[:, 2] = 3.7
    if kind == "both":
        X[:, 5] = -2.0 * X[:, 0] + X[:, 3]  # a third zero singular value (linear combination)
    return X


@pytest.mark.parametrize(("kind", "zeros"), [("duplicate", 1), ("constant", 1), ("both", 3)])
@pytest.mark.parametrize("block_rows", [None, 4])
@pytest.mark.parametrize("lift", ["auto", "always"])
def test_rank_deficient_n_greater_than_d(kind: str, zeros: int, block_rows: int | None, lift: str) -> None:
    X = _rank_deficient(kind)
    r = 5
    M = np.random.default_rng(12).standard_normal((X.shape[1], r))
    s = textbook_svd(X)[1]
    assert np.sum(s < 1e-10 * s[0]) == zeros  # the construction does what it says
    epsilon = epsilon_for(float(np.median(s[s > 1e-10 * s[0]])), r)
    rel = release_projection(
        X,
        epsilon=epsilon,
        delta=DELTA,
        r=r,
        lift=lift,
        projection=M,
        rng=np.random.default_rng(0),
        block_rows=block_rows,
    )
    assert rel.sigma_min == 0.0
    assert rel.lifted is True
    assert rel.Z.shape == (30, r) and np.isfinite(rel.Z).all()
    ref = textbook_release(X, M, rel.omega, lifted=True)
    # Z itself depends on the orthonormal completion of range(X~);
    # Z^T Z = M^T V (S^2 + w^2) V^T M / r does not
    assert rel_err(rel.Z.T @ rel.Z, ref.T @ ref) < 1e-6
    # the component on range(X~) is unique
    range_part, Up = textbook_range_part(X, M, rel.omega)
    assert rel_err(Up @ (Up.T @ rel.Z), range_part) < 1e-8


def test_rank_deficient_spectrum_reports_exact_zeros() -> None:
    X = _rank_deficient("both")
    spec = centred_spectrum(X)
    assert spec.rank == 3
    assert (spec.singular_values[3:] == 0.0).all()
    np.testing.assert_allclose(spec.singular_values[:3], textbook_svd(X)[1][:3], rtol=1e-9)
    assert centred_sigma_min(X) == 0.0


@pytest.mark.parametrize("duplicate_rows", [False, True])
def test_n_not_greater_than_d(duplicate_rows: bool) -> None:
    """n <= d: rank(X~) <= n - 1 < min(n, d), so sigma_min = 0 and the release is always lifted."""
    n, d, r = 7, 12, 5
    X = gaussian_data(n, d, seed=13)
    if duplicate_rows:  # rank n - 2: the completion U0 needs a random direction besides 1/sqrt(n)
        X[5] = X[2]
    M = np.random.default_rng(14).standard_normal((d, r))
    s = textbook_svd(X)[1]
    epsilon = epsilon_for(float(np.median(s)), r)
    rel = release_projection(X, epsilon=epsilon, delta=DELTA, r=r, projection=M, rng=np.random.default_rng(1))
    assert rel.Z.shape == (n, r)
    assert np.isfinite(rel.Z).all()
    assert rel.sigma_min == 0.0
    assert rel.lifted is True
    range_part, Up = textbook_range_part(X, M, rel.omega)
    assert Up.shape[1] == (n - 2 if duplicate_rows else n - 1)
    assert rel_err(Up @ (Up.T @ rel.Z), range_part) < 1e-8
    if not duplicate_rows:
        # range(X~) is the whole complement of the all-ones vector here
        centred = rel.Z - rel.Z.mean(axis=0)
        assert rel_err(centred, range_part) < 1e-8
    # the part off range(X~) is the lifted zero singular values: omega times orthonormal directions
    off = rel.Z - Up @ (Up.T @ rel.Z)
    assert np.linalg.norm(off) > 1e-3 * np.linalg.norm(rel.Z)


# -- Lemma 1: distances preserved by the unlifted release ---------------------------------------------------
def _pairwise_sq(A: np.ndarray) -> np.ndarray:
    sq = (A * A).sum(1)
    return np.maximum(sq[:, None] + sq[None, :] - 2.0 * A @ A.T, 0.0)


def test_unlifted_release_preserves_pairwise_distances_lemma_1() -> None:
    """Lemma 1: for the unlifted release, ||z - z'||^2 / ||x - x'||^2 = ||u M||^2 / r with u a unit vector,
    which is exactly chi^2_r / r distributed for every pair (M has i.i.d. N(0, 1) entries).

    * All pairs (correlated): band nu = 0.45. The per-pair failure probability is p(0.45) = 3.3e-5 (exact
      chi^2 tail), so by Markov's inequality, whatever the correlations, P(more than 1% of pairs outside) <=
      p / 0.01 = 0.33% for a random seed.
    * Independent pairs (x_{2k+1} - x_{2k} mutually orthogonal, so their projections are i.i.d. N(0, I_r)):
      band nu = 0.3 (p = 3.2e-3) with the exact binomial bound P(count > k) <= 1e-6, and a KS test against
      chi^2_r / r at alpha = 1e-6 with a control (lengths scaled by 0.9) that must be rejected.
    """
    r, d, half = 200, 300, 300
    rng = np.random.default_rng(20240601)
    base = rng.standard_normal((half, d)) * 3.0
    Q, _ = np.linalg.qr(rng.standard_normal((d, half)))  # orthonormal difference directions
    X = np.empty((2 * half, d))
    X[0::2] = base
    X[1::2] = base + Q.T * rng.uniform(0.5, 2.0, half)[:, None]
    rel = release_projection(X, epsilon=HUGE_EPSILON, delta=DELTA, r=r, rng=np.random.default_rng(7))
    assert rel.lifted is False and rel.sigma_min >= rel.omega  # Lemma 1 is about the plain projection

    iu = np.triu_indices(X.shape[0], k=1)
    ratio = _pairwise_sq(rel.Z)[iu] / _pairwise_sq(X)[iu]
    p_wide = stats.chi2.cdf(r * (1 - 0.45), r) + stats.chi2.sf(r * (1 + 0.45), r)
    assert p_wide / 0.01 < 5e-3  # the Markov bound quoted above
    assert np.mean(np.abs(ratio - 1) >= 0.45) <= 0.01

    diff_x = X[1::2] - X[0::2]
    diff_z = rel.Z[1::2] - rel.Z[0::2]
    iid = (diff_z * diff_z).sum(1) / (diff_x * diff_x).sum(1)
    p = stats.chi2.cdf(r * (1 - 0.3), r) + stats.chi2.sf(r * (1 + 0.3), r)
    k = int(stats.binom.isf(1e-6, half, p))  # P(Binomial(300, p) > k) <= 1e-6
    assert k <= 0.03 * half  # so the assertion below means ">= 97% of the pairs within (0.7, 1.3)"
    assert np.sum(np.abs(iid - 1) >= 0.3) <= k
    reference = stats.chi2(df=r, scale=1.0 / r)
    assert stats.kstest(iid, reference.cdf).pvalue > 1e-6
    # their sum is exactly chi^2 with 300 r degrees of freedom: P(|mean - 1| >= 0.03) = 2e-7
    total = stats.chi2(df=half * r)
    assert total.cdf(half * r * 0.97) + total.sf(half * r * 1.03) < 1e-6
    assert abs(iid.mean() - 1) < 0.03
    assert stats.kstest(0.9 * iid, reference.cdf).pvalue < 1e-6  # control: a 10% distortion is detected


# -- sigma_min, largest_feasible_r, privacy_table -----------------------------------------------------------
def test_centred_spectrum_matches_numpy() -> None:
    X = gaussian_data(50, 5, seed=21)
    spec = centred_spectrum(X, block_rows=8)
    U, s, Vt = textbook_svd(X)
    assert spec.n == 50 and spec.rank == 5
    np.testing.assert_allclose(spec.mean, X.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(spec.singular_values, s, rtol=1e-10)
    np.testing.assert_allclose(np.abs(spec.V.T @ Vt.T), np.eye(5), atol=1e-8)  # same vectors up to sign
    assert spec.sigma_min == centred_sigma_min(X, block_rows=8) == pytest.approx(s[-1], rel=1e-10)
    assert centred_sigma_min(X) == pytest.approx(s[-1], rel=1e-10)


@pytest.mark.parametrize("epsilon", [math.exp(1.1), 3.0, 10.0])
def test_largest_feasible_r_consistent_with_omega(epsilon: float) -> None:
    # sigma_min halfway between omega(10) and omega(11): r = 10 is the largest feasible value
    w10, w11 = omega(10, epsilon, DELTA), omega(11, epsilon, DELTA)
    sigma_min = 0.5 * (w10 + w11)
    X = with_singular_values(80, np.array([50.0, 10.0, 1.0]) * sigma_min, seed=22)
    assert centred_sigma_min(X) == pytest.approx(sigma_min, rel=1e-9)
    assert largest_feasible_r(X, epsilon, DELTA) == 10
    assert largest_feasible_r(X, epsilon, DELTA, r_max=7) == 7  # capped by r_max
    # halving epsilon doubles omega: the feasible prefix shrinks to omega(r, epsilon / 2) <= sigma_min
    smaller = [r for r in range(1, 101) if omega(r, epsilon / 2, DELTA) <= sigma_min]
    assert largest_feasible_r(X, epsilon / 2, DELTA) == (max(smaller) if smaller else None)
    assert (max(smaller) if smaller else 0) < 10

    table = privacy_table(sigma_min, epsilon, DELTA, r_max=30)
    assert [row[0] for row in table] == list(range(1, 31))
    for r, w, ok in table:
        assert w == omega(r, epsilon, DELTA)
        assert ok is (r <= 10)
    # the release agrees: r = 10 is not lifted, r = 11 is
    for r, lifted in [(10, False), (11, True)]:
        rel = release_projection(X, epsilon=epsilon, delta=DELTA, r=r, rng=np.random.default_rng(0))
        assert rel.lifted is lifted


def test_largest_feasible_r_none_when_even_r_1_is_infeasible() -> None:
    epsilon = 2.0
    sigma_min = 0.9 * omega(1, epsilon, DELTA)
    X = with_singular_values(40, np.array([5.0, 1.0]) * sigma_min, seed=23)
    assert largest_feasible_r(X, epsilon, DELTA) is None
    assert not any(ok for _, _, ok in privacy_table(sigma_min, epsilon, DELTA))
    assert len(privacy_table(sigma_min, epsilon, DELTA)) == 100
    # rank-deficient data is never feasible
    assert largest_feasible_r(gaussian_data(5, 8, seed=1), 1e9, DELTA) is None


# -- randomness ---------------------------------------------------------------------------------------------
def test_projection_drawn_from_rng() -> None:
    X = gaussian_data(30, 4, seed=31)
    kw = {"epsilon": HUGE_EPSILON, "delta": DELTA, "r": 3}
    a = release_projection(X, rng=np.random.default_rng(42), **kw)
    b = release_projection(X, rng=np.random.default_rng(42), **kw)
    c = release_projection(X, rng=np.random.default_rng(43), **kw)
    np.testing.assert_array_equal(a.Z, b.Z)
    assert rel_err(a.Z, c.Z) > 1e-2
    # the draw is M ~ N(0, 1) [d, r] from the generator, nothing else
    M = np.random.default_rng(42).standard_normal((4, 3))
    assert rel_err(a.Z, textbook_release(X, M, 0.0, lifted=False)) < 1e-8


def test_rng_none_draws_from_os_entropy() -> None:
    X = gaussian_data(30, 4, seed=32)
    kw = {"epsilon": HUGE_EPSILON, "delta": DELTA, "r": 3}
    a = release_projection(X, **kw)
    b = release_projection(X, **kw)
    assert rel_err(a.Z, b.Z) > 1e-2


def test_completion_is_reproducible_from_rng() -> None:
    X = gaussian_data(7, 12, seed=33)
    X[5] = X[2]  # the completion needs a random direction
    M = np.random.default_rng(34).standard_normal((12, 4))
    kw = {"epsilon": 1.0, "delta": DELTA, "r": 4, "projection": M}
    a = release_projection(X, rng=np.random.default_rng(1), **kw)
    b = release_projection(X, rng=np.random.default_rng(1), **kw)
    np.testing.assert_array_equal(a.Z, b.Z)


# -- validation ---------------------------------------------------------------------------------------------
GOOD = {"epsilon": 1.0, "delta": DELTA, "r": 2}


def _x() -> np.ndarray:
    return gaussian_data(10, 3, seed=41)


@pytest.mark.parametrize(
    ("row", "value", "block_rows"), [(0, np.nan, None), (7, np.inf, 3), (9, -np.inf, None)]
)
def test_non_finite_x_names_the_row(row: int, value: float, block_rows: int | None) -> None:
    X = _x()
    X[row, 1] = value
    with pytest.raises(InputDataError, match=rf"X must be finite: row {row}, column 1"):
        release_projection(X, block_rows=block_rows, **GOOD)
    with pytest.raises(InputDataError, match=rf"row {row}\b"):
        centred_sigma_min(X, block_rows=block_rows)


@pytest.mark.parametrize(
    ("X", "match"),
    [
        (np.arange(5.0), "X must be 2-D"),
        (np.ones((2, 2, 2)), "X must be 2-D"),
        (np.ones((1, 3)), "X needs at least 2 rows, got 1"),
        (np.ones((0, 3)), "X needs at least 2 rows, got 0"),
        (np.ones((4, 0)), "X needs at least 1 column"),
        (np.array([["a", "b"], ["c", "d"]]), "X must hold real numbers"),
        ([[1.0, "x"], [2.0, 3.0]], "X must be a 2-D array of numbers"),
    ],
)
def test_bad_x_shape(X, match: str) -> None:
    with pytest.raises(InputDataError, match=match):
        release_projection(X, **GOOD)


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_bad_epsilon(epsilon: float) -> None:
    with pytest.raises(InputDataError, match="epsilon must be a finite number > 0"):
        release_projection(_x(), epsilon=epsilon, delta=DELTA, r=2)
    with pytest.raises(ValueError, match="epsilon"):
        omega(2, epsilon, DELTA)


@pytest.mark.parametrize("epsilon", [True, "1.0", None])
def test_epsilon_must_be_a_number(epsilon) -> None:
    with pytest.raises(InputDataError, match="epsilon must be a number"):
        release_projection(_x(), epsilon=epsilon, delta=DELTA, r=2)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_bad_delta(delta: float) -> None:
    with pytest.raises(InputDataError, match="delta must lie strictly between 0 and 1"):
        release_projection(_x(), epsilon=1.0, delta=delta, r=2)
    with pytest.raises(ValueError, match="delta"):
        privacy_table(1.0, 1.0, delta)


@pytest.mark.parametrize("r", [0, -3, 2.5, 2.0, True, "2", None])
def test_bad_r(r) -> None:
    with pytest.raises(InputDataError, match="r must be an integer >= 1"):
        release_projection(_x(), epsilon=1.0, delta=DELTA, r=r)
    with pytest.raises(ValueError, match="r must be an integer"):
        omega(r, 1.0, DELTA)


@pytest.mark.parametrize("shape", [(3, 3), (2, 2), (2, 3), (3,)])
def test_bad_projection_shape(shape: tuple[int, ...]) -> None:
    with pytest.raises(InputDataError, match=r"projection must have shape \(d, r\) = \(3, 2\)"):
        release_projection(_x(), projection=np.ones(shape), **GOOD)


def test_non_finite_projection() -> None:
    M = np.ones((3, 2))
    M[1, 1] = np.nan
    with pytest.raises(InputDataError, match="projection must be finite"):
        release_projection(_x(), projection=M, **GOOD)


def test_bad_lift() -> None:
    with pytest.raises(InputDataError, match=r'lift must be "auto" or "always", got \'sometimes\''):
        release_projection(_x(), lift="sometimes", **GOOD)
    assert issubclass(InputDataError, ValueError)  # callers may catch the plain ValueError


def test_values_too_large_to_square() -> None:
    X = _x()
    X[6, 2] = 1e200
    with pytest.raises(InputDataError, match="too large to square in float64 .* around row 6"):
        release_projection(X, **GOOD)


def test_bad_r_max() -> None:
    with pytest.raises(InputDataError, match="r must be an integer >= 1, got 0"):
        largest_feasible_r(_x(), 1.0, DELTA, r_max=0)
