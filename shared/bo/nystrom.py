"""Nystrom feature embedding with leverage-score (posterior-variance) dictionary sampling.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (AAAI 2021), Appendix D.3, Algorithm 4
(NystromEmbedding), after Chowdhury & Gopalan, "Bayesian Optimization under Heavy-tailed Payoffs" (NeurIPS
2019), Section 4 / Lemma 17, and Calandriello et al. (2019)::

    input   x_1..x_t (points played), s2_i = sigma~^2_{t-1}(x_i) (the previous approximate posterior
            variance there), q > 0 (oversampling)
    z_i     ~ Bernoulli(p_i),   p_i = min(q s2_i, 1)                      (Alg. 4, line 4)
    D       = {x_i : z_i = 1},  m = |D|                                   (line 5)
    phi~(x) = (K_D^{1/2})^+ k_D(x)                                        (line 7)

Notation (shapes in brackets)::

    K_D  [m, m]  k(D, D) = U diag(s) U^T (symmetric eigendecomposition)
    W    [m, m]  (K_D^{1/2})^+ = U diag(s_+^{-1/2}) U^T, eigenvalues s <= rcond * max(s) dropped (pinv)
    k_D  [m, p]  k(D, x) for p points;  phi~ = W k_D  [m, p]

Then ``phi~(u)^T phi~(v) = k_D(u)^T K_D^+ k_D(v)``, the Nystrom approximation of k(u, v): exact when u or v
is in D (``K_D K_D^+ K_D = K_D``), and an approximation whose quality grows with q elsewhere.

The symmetric square root (not a Cholesky factor) is used, as in the paper: the feature-adaptive truncation
of ATA-GP-UCB (Alg. 1, lines 9-10) acts coordinate by coordinate, so the basis matters.

Pure numpy; randomness only through the ``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared.bo.parallel import one_blas_thread
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "NystromEmbedding",
    "inclusion_probabilities",
    "pinv_sqrt",
    "posterior_factors",
    "posterior_from_block",
    "sample_dictionary",
]

#: Relative eigenvalue cut-off of the pseudo-inverse square root (numpy.linalg.pinv's default scale).
DEFAULT_RCOND = 1e-10


def inclusion_probabilities(variances: npt.ArrayLike, q: float) -> FloatArray:
    """``p_i = min(q s2_i, 1)`` (Alg. 4, line 4); negative round-off variances count as 0."""
    if not (np.isfinite(q) and q > 0):
        raise InputDataError(f"q must be a finite number > 0, got {q!r}")
    s2 = np.asarray(variances, dtype=np.float64)
    if not np.isfinite(s2).all():
        raise InputDataError("posterior variances must be finite")
    out: FloatArray = np.minimum(q * np.maximum(s2, 0.0), 1.0)
    return out


def sample_dictionary(variances: npt.ArrayLike, q: float, rng: np.random.Generator) -> npt.NDArray[np.bool_]:
    """One Bernoulli(p_i) draw per point (Alg. 4, lines 3-6): the mask of the points kept in D.

    One uniform per point is drawn whatever p_i (also when p_i is 0 or 1), so the stream consumed depends
    only on the number of points: reproducible from the generator's seed.
    """
    p = inclusion_probabilities(variances, q)
    u = rng.random(p.shape[0])
    out: npt.NDArray[np.bool_] = u < p
    return out


def pinv_sqrt(K: FloatArray, rcond: float = DEFAULT_RCOND) -> FloatArray:
    """``(K^{1/2})^+`` for a symmetric positive semi-definite K [m, m], by eigendecomposition."""
    K = np.asarray(K, dtype=np.float64)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise InputDataError(f"K must be a square matrix, got shape {K.shape}")
    if K.shape[0] == 0:
        return np.zeros((0, 0))
    s, U = np.linalg.eigh(0.5 * (K + K.T))
    keep = s > rcond * max(float(s.max()), 0.0)
    inv_sqrt = np.zeros_like(s)
    inv_sqrt[keep] = 1.0 / np.sqrt(s[keep])
    out: FloatArray = (U * inv_sqrt) @ U.T
    return out


@dataclass(frozen=True)
class NystromEmbedding:
    """phi~(x) = W k_D(x) for a dictionary D (Alg. 4, line 7); ``atoms`` identify D (e.g. row indices)."""

    atoms: npt.NDArray[np.int64]
    W: FloatArray

    @property
    def m(self) -> int:
        """The feature dimension m = |D|."""
        return int(self.W.shape[0])

    @classmethod
    def from_gram(
        cls, atoms: npt.ArrayLike, K_D: FloatArray, rcond: float = DEFAULT_RCOND
    ) -> NystromEmbedding:
        a = np.atleast_1d(np.asarray(atoms, dtype=np.int64))
        K_D = np.asarray(K_D, dtype=np.float64).reshape(a.size, a.size)
        return cls(atoms=a, W=pinv_sqrt(K_D, rcond))

    def features(self, k_D: FloatArray) -> FloatArray:
        """phi~ [m, p] from k_D = k(D, x_1..x_p) [m, p]."""
        k_D = np.asarray(k_D, dtype=np.float64)
        if k_D.shape[0] != self.m:
            raise InputDataError(f"k_D must have {self.m} rows (one per atom), got {k_D.shape[0]}")
        out: FloatArray = self.W @ k_D
        return out


def posterior_factors(
    emb: NystromEmbedding, theta: FloatArray, root_inv: FloatArray, lam: float
) -> tuple[FloatArray, FloatArray]:
    """``(W^T theta [m], M [m, m])``, ``M = W^T W - lambda (A W)^T (A W)`` for any A with A^T A = V~^{-1}: the
    small factors of the approximate posterior (``posterior_from_block``), formed once per update."""
    AW = root_inv @ emb.W
    M: FloatArray = emb.W.T @ emb.W - lam * (AW.T @ AW)
    w_theta: FloatArray = emb.W.T @ theta
    return w_theta, M


def posterior_from_block(
    k_D: FloatArray, w_theta: FloatArray, M: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """``mu~ = (W^T theta)^T k_D`` and ``sigma~^2 = max(1 - k_D^T M k_D, 0)`` per column of k_D [m, c].

    Per column the same operations whatever the other columns: the column ranges of the dask backend
    (``shared.bo.dask_nystrom``; ranges starting at multiples of 64 columns) give the bits of one call over
    every candidate. BLAS runs on one thread here, on either backend: a threaded BLAS may give other last bits
    for ``M @ k_D`` (measured with OpenBLAS 0.3.31 at 2 threads, for many m >= 10), so the choices would
    depend on the machine's core count and on the backend."""
    with one_blas_thread():
        mean: FloatArray = w_theta @ k_D
        var: FloatArray = 1.0 - np.einsum("ij,ij->j", k_D, M @ k_D)
    return mean, np.maximum(var, 0.0)
