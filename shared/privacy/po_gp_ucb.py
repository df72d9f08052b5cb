"""PO-GP-UCB, the curator part: the paper's random projection of the dataset (kept to reproduce the paper).

**Not differentially private when n > d + 1.** Z = X~ B for a d x r matrix B, so every column of Z lies in
span(X~, 1), a d-dimensional subspace of R^n that moves when one row moves: the column-space test tells
neighbouring datasets apart with certainty (``shared.privacy.audit``), and with r >= d anyone who knows d + 1
rows recovers B and then every row. Blocki et al.'s proof covers the *record*-side sketch R X~ (R of size
r x n), not this feature-side product. pobo's default release is ``shared.privacy.gaussian``; this one is
served only to a curator who acknowledges that it has no guarantee (``docs/privacy.md``).

Implements Algorithm 1 of Kharkovskii, Dai & Low, "Private Outsourced Bayesian Optimization" (ICML 2020),
with the singular-value lifting of Blocki et al. (2012, "The Johnson-Lindenstrauss transform itself preserves
differential privacy", Alg. 3) as the ``lift="always"`` mode.

Notation (shapes in brackets)::

    X        [n, d]  the curator's rows (may be a numpy.memmap; read in row blocks, never copied whole)
    mu       [d]     column means; X~ = X - 1 mu^T is the centred dataset (Alg. 1, line 2)
    M        [d, r]  i.i.d. N(0, 1) projection matrix (line 3)
    X~ = U S V^T     thin SVD (line 4); k = min(n, d) singular values s_1 >= ... >= s_k >= 0
    G        [d, d]  Gram matrix X~^T X~ = V S^2 V^T (what we actually compute, in one streaming pass)
    omega            16 sqrt(r) ln(2/delta) ln(16 r/delta) / epsilon (line 5)
    Z        [n, r]  r^{-1/2} X~ M (line 7), or r^{-1/2} U sqrt(S^2 + omega^2) V^T M (lines 9-10)

U is never materialised. On the directions with s_i > 0, U_i = X~ V_i / s_i, so the lifted release is
``Z = X~ V+ diag(sqrt(1 + omega^2 / s^2)) V+^T M / sqrt(r)`` (one [d, r] matrix applied to the rows). Zero
singular values (rank-deficient X, n <= d) get ``U0 omega V0^T M / sqrt(r)`` with U0 any orthonormal
completion of range(X~): ``1/sqrt(n)`` first (X~ has centred columns, so it is orthogonal to range(X~)), then
Gaussian directions projected off range(X~) and orthonormalised. Z^T Z is independent of that choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError
from shared.privacy.params import check_epsilon_delta, check_r
from shared.privacy.rng import os_entropy_rng
from shared.privacy.rows import FloatArray, check_matrix, raise_not_finite, read_block, row_blocks

__all__ = [
    "Release",
    "Spectrum",
    "centred_sigma_min",
    "centred_spectrum",
    "largest_feasible_r",
    "omega",
    "privacy_table",
    "release_projection",
]

Lift = Literal["auto", "always"]

#: A column whose squared mean exceeds this multiple of its variance is centred before its products are
#: accumulated (cancellation would otherwise cost more than ~1e-10 relative accuracy).
_SHIFT_RATIO = 1e4


@dataclass(frozen=True)
class Release:
    """The output of Algorithm 1 plus the curator-private diagnostics (no privacy guarantee: see above).

    ``Z`` and ``omega`` are public; ``sigma_min`` and ``lifted`` are the curator's alone (DESIGN.md).
    """

    Z: FloatArray
    omega: float
    sigma_min: float
    lifted: bool


@dataclass(frozen=True)
class Spectrum:
    """Column means, Gram eigen-decomposition and rank of the centred X (all [d]-sized, no row data)."""

    n: int
    mean: FloatArray  # [d]
    singular_values: FloatArray  # [k], descending, exact zeros below the rank tolerance
    V: FloatArray  # [d, k] right singular vectors (columns), matching singular_values
    rank: int

    @property
    def sigma_min(self) -> float:
        """Smallest of the k = min(n, d) singular values of the centred X (0 when rank-deficient)."""
        return float(self.singular_values[-1])


def _check_params(epsilon: float, delta: float, r: int) -> None:
    check_epsilon_delta(epsilon, delta)
    check_r(r)


def omega(r: int, epsilon: float, delta: float) -> float:
    """Lifting threshold of Algorithm 1, line 5: ``16 sqrt(r) ln(2/delta) ln(16 r/delta) / epsilon``."""
    _check_params(epsilon, delta, r)
    return 16.0 * math.sqrt(r) * math.log(2.0 / delta) * math.log(16.0 * r / delta) / float(epsilon)


def centred_spectrum(X: npt.ArrayLike, *, block_rows: int | None = None) -> Spectrum:
    """Means, singular values and right singular vectors of the centred X from its d x d Gram matrix.

    One streaming pass over the rows: ``G = sum_b X_b^T X_b - n mu mu^T``. When that subtraction would
    cancel (a column mean large against its spread) a second pass accumulates the shifted blocks
    ``G = sum_b (X_b - c)^T (X_b - c) - n (mu - c)(mu - c)^T`` with c the mean found by the first.
    Singular values below ``sqrt(eps_machine * sqrt(max(n, d))) * s_max`` (about sqrt(machine epsilon)
    times the largest, the resolution of a Gram-based SVD) are set to exactly 0.
    """
    X = check_matrix(X)
    n, d = X.shape
    blocks = row_blocks(n, d, block_rows)
    shift = np.zeros(d)
    ones = np.ones(min(blocks.step, n))  # column sums as a BLAS product (faster than ndarray.sum)
    for _attempt in range(2):
        total = np.zeros(d)
        gram = np.zeros((d, d))
        for start in blocks:
            B = read_block(X, start, min(n, start + blocks.step))
            if shift.any():
                B = B - shift
            with np.errstate(over="ignore", invalid="ignore"):
                block_gram = B.T @ B
            if not np.isfinite(np.diagonal(block_gram)).all():  # a NaN or inf anywhere shows up here
                raise_not_finite(B, start)
            total += ones[: B.shape[0]] @ B
            gram += block_gram
        delta_mu = total / n
        gram -= n * np.outer(delta_mu, delta_mu)
        # Cancellation in sum(x x^T) - n mu mu^T costs ~eps * mu^2 / var relative accuracy: when a column's
        # mean is large against its spread, redo the pass shifted by the (now known) mean.
        spread = np.maximum(np.diag(gram), 0.0) / n
        if _attempt or not np.any(delta_mu**2 > _SHIFT_RATIO * spread):
            break
        shift = shift + delta_mu
    gram = 0.5 * (gram + gram.T)
    eigvals, eigvecs = np.linalg.eigh(gram)  # ascending
    order = np.argsort(eigvals)[::-1]
    k = min(n, d)
    s = np.sqrt(np.clip(eigvals[order][:k], 0.0, None))
    V = np.ascontiguousarray(eigvecs[:, order][:, :k])
    s_max = float(s[0]) if k else 0.0
    tol = s_max * math.sqrt(np.finfo(np.float64).eps * math.sqrt(max(n, d)))
    s = np.where(s > tol, s, 0.0)
    return Spectrum(n=n, mean=shift + delta_mu, singular_values=s, V=V, rank=int(np.count_nonzero(s)))


def centred_sigma_min(X: npt.ArrayLike, *, block_rows: int | None = None) -> float:
    """sigma_min of the column-centred X (Alg. 1, line 6): one streaming pass, d x d memory."""
    return centred_spectrum(X, block_rows=block_rows).sigma_min


def privacy_table(
    sigma_min: float, epsilon: float, delta: float, r_max: int = 100
) -> list[tuple[int, float, bool]]:
    """Rows ``(r, omega(r), sigma_min >= omega(r))`` for r = 1..r_max (the guideline of s3.4)."""
    _check_params(epsilon, delta, r_max)
    return [
        (r, w, bool(sigma_min >= w)) for r in range(1, int(r_max) + 1) for w in [omega(r, epsilon, delta)]
    ]


def largest_feasible_r(X: npt.ArrayLike, epsilon: float, delta: float, r_max: int = 100) -> int | None:
    """The paper's guideline (s3.4): the largest r <= r_max with sigma_min(X~) >= omega(r), else None.

    omega grows with r, so the feasible r form a prefix 1..r*.
    """
    _check_params(epsilon, delta, r_max)
    s_min = centred_sigma_min(X)
    feasible = [r for r, _, ok in privacy_table(s_min, epsilon, delta, r_max) if ok]
    return max(feasible) if feasible else None


def _range_complement(
    X: np.ndarray, spec: Spectrum, m: int, rng: np.random.Generator, blocks: range
) -> FloatArray:
    """U0 [n, m]: orthonormal columns orthogonal to range(X~); the first is 1/sqrt(n).

    Random directions are projected off span(1) and range(X~) = span(X~ V+) twice ("twice is enough",
    Giraud et al. 2005), each projection a streaming pass, then orthonormalised by a thin QR.
    """
    n = spec.n
    ones = np.full((n, 1), 1.0 / math.sqrt(n))
    if m == 1:
        return ones
    pos = spec.singular_values > 0
    Vp, sp = spec.V[:, pos], spec.singular_values[pos]
    W = rng.standard_normal((n, m - 1))
    for _ in range(2):
        W -= ones @ (ones.T @ W)
        if sp.size:
            # coefficients on U+ = X~ V+ / s:  C = diag(1/s) V+^T X~^T W   [rank, m-1]
            XtW = np.zeros((X.shape[1], m - 1))
            for start in blocks:
                stop = min(n, start + blocks.step)
                XtW += (read_block(X, start, stop) - spec.mean).T @ W[start:stop]
            coef = (Vp.T @ XtW) / sp[:, None] ** 2
            proj = Vp @ coef  # [d, m-1]:  U+ U+^T W = X~ V+ diag(1/s^2) V+^T X~^T W
            for start in blocks:
                stop = min(n, start + blocks.step)
                W[start:stop] -= (read_block(X, start, stop) - spec.mean) @ proj
    Q, _ = np.linalg.qr(W)
    Q -= ones @ (ones.T @ Q)
    Q, _ = np.linalg.qr(Q)
    return np.hstack([ones, Q])


def release_projection(
    X: npt.ArrayLike,
    *,
    epsilon: float,
    delta: float,
    r: int,
    lift: Lift = "auto",
    projection: npt.ArrayLike | None = None,
    rng: np.random.Generator | None = None,
    block_rows: int | None = None,
) -> Release:
    """Algorithm 1 (PO-GP-UCB, the curator part): release ``Z`` [n, r] (the paper's Theorem 1 claims
    (epsilon, delta)-DP; that claim fails when n > d + 1, see the module docstring).

    ``lift="auto"`` lifts the singular values to ``sqrt(s^2 + omega^2)`` only when ``sigma_min < omega``
    (Alg. 1, lines 6-10); ``lift="always"`` lifts unconditionally (Blocki et al. 2012). ``projection`` is
    an optional fixed M [d, r]; otherwise M ~ N(0, 1) is drawn from ``rng``, which defaults to a fresh
    generator seeded from OS entropy. Equal, to rounding, to the textbook
    ``U sqrt(S^2 + omega^2) V^T M / sqrt(r)``, in two streaming passes over X (Gram, then projection).
    """
    _check_params(epsilon, delta, r)
    if lift not in ("auto", "always"):
        raise InputDataError(f'lift must be "auto" or "always", got {lift!r}')
    X = check_matrix(X)
    n, d = X.shape
    r = int(r)
    if projection is None:
        rng = rng if rng is not None else os_entropy_rng()
        M = rng.standard_normal((d, r))
    else:
        M = np.asarray(projection, dtype=np.float64)
        if M.shape != (d, r):
            raise InputDataError(f"projection must have shape (d, r) = ({d}, {r}), got {M.shape}")
        if not np.isfinite(M).all():
            raise InputDataError("projection must be finite")
    blocks = row_blocks(n, d, block_rows)
    spec = centred_spectrum(X, block_rows=blocks.step)
    w = omega(r, epsilon, delta)
    lifted = lift == "always" or spec.sigma_min < w

    scale = 1.0 / math.sqrt(r)
    U0: FloatArray | None = None
    if not lifted:
        B = M * scale  # line 7:  Z = X~ M / sqrt(r)
    else:
        s = spec.singular_values
        pos = s > 0
        Vp = spec.V[:, pos]
        gain = np.sqrt(1.0 + (w / s[pos]) ** 2)  # sqrt(s^2 + omega^2) / s
        B = Vp @ (gain[:, None] * (Vp.T @ M)) * scale  # line 9-10 on the range of X~
        m = s.size - int(pos.sum())
        if m:
            V0 = spec.V[:, ~pos]
            gen = rng if rng is not None else os_entropy_rng()
            U0 = _range_complement(X, spec, m, gen, blocks)
            T0 = (w * scale) * (V0.T @ M)  # [m, r]

    Z = np.empty((n, r))
    # X~ B = X B - 1 (mu B) unless the means are large against the spread (then centre each block first).
    spread = spec.singular_values[0] ** 2 / n if spec.singular_values.size else 0.0
    centre_blocks = bool(np.any(spec.mean**2 > _SHIFT_RATIO * max(spread, np.finfo(np.float64).tiny)))
    mu_B = spec.mean @ B
    for start in blocks:
        stop = min(n, start + blocks.step)
        if centre_blocks:
            Z[start:stop] = (read_block(X, start, stop) - spec.mean) @ B
        else:
            np.matmul(read_block(X, start, stop), B, out=Z[start:stop])
            Z[start:stop] -= mu_B
        if U0 is not None:
            Z[start:stop] += U0[start:stop] @ T0
    return Release(Z=Z, omega=w, sigma_min=spec.sigma_min, lifted=bool(lifted))
