"""Stationary kernels on the rows of a released Z: squared exponential and Matern-5/2, unit signal variance.

Notation (shapes in brackets)::

    Z        [n, r]  candidates (fixed);  l > 0 an isotropic lengthscale;  d = |z - z'| / l
    k_SE(z, z')     = exp(-d^2 / 2)                                  (GPML eq. 4.9)
    k_M52(z, z')    = (1 + sqrt5 d + 5 d^2 / 3) exp(-sqrt5 d)         (GPML eq. 4.17, nu = 5/2)
    k(z, z) = 1 for both: the normalisation under which the RKHS-norm bound B of the heavy-tailed / LDP
    GP-UCB analyses (Chowdhury & Gopalan 2019; Zhou & Tan 2021) is stated.

Squared distances are computed coordinate by coordinate (``sum_k (a_k - b_k)^2``), not through the
``|a|^2 + |b|^2 - 2 a.b`` expansion: every entry is then a deterministic function of its two rows alone,
whatever the other rows of the block (a rebuilt strategy evaluating a subset of the candidates gets the same
bits as the live one evaluating all of them), and there is no cancellation for nearby points. Cost O(p q r).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]
KernelName = Literal["se", "matern52"]

__all__ = ["KERNELS", "KernelName", "RowKernel", "kernel_matrix", "scaled_sqdist"]

KERNELS: tuple[str, ...] = ("se", "matern52")


def scaled_sqdist(A: FloatArray, B: FloatArray, lengthscale: float) -> FloatArray:
    """``|a - b|^2 / l^2`` [len(A), len(B)], coordinate by coordinate (see the module docstring)."""
    a = np.asarray(A, dtype=np.float64) / lengthscale
    bT = np.ascontiguousarray((np.asarray(B, dtype=np.float64) / lengthscale).T)  # [r, q]: rows contiguous
    out = np.zeros((a.shape[0], bT.shape[1]))
    buf = np.empty_like(out)
    for k in range(a.shape[1]):  # loop over the r coordinates only; vectorised over both row sets
        np.subtract(a[:, k, None], bT[k][None, :], out=buf)
        np.multiply(buf, buf, out=buf)
        out += buf
    return out


def _profile(sq: FloatArray, kind: str) -> FloatArray:
    if kind == "se":
        out: FloatArray = np.exp(np.multiply(sq, -0.5, out=sq), out=sq)  # sq is a fresh temporary
        return out
    if kind == "matern52":
        d = np.sqrt(np.multiply(sq, 5.0, out=sq), out=sq)
        e = np.exp(-d)
        out = np.multiply(d, d)
        out *= 1.0 / 3.0
        out += d
        out += 1.0
        out *= e  # (1 + d + d^2/3) exp(-d)
        return out
    raise InputDataError(f"kernel must be one of {', '.join(KERNELS)}, got {kind!r}")


def kernel_matrix(A: FloatArray, B: FloatArray, *, kind: str, lengthscale: float) -> FloatArray:
    """``k(A, B)`` [len(A), len(B)] for kernel ``kind`` ("se" or "matern52") with lengthscale l."""
    if not (math.isfinite(lengthscale) and lengthscale > 0):
        raise InputDataError(f"lengthscale must be a finite number > 0, got {lengthscale!r}")
    return _profile(scaled_sqdist(A, B, lengthscale), kind)


class RowKernel:
    """The kernel between rows of a fixed Z, addressed by row index: ``rows(p)`` is k(Z_p, Z) [len(p), n]."""

    def __init__(self, Z: npt.ArrayLike, *, kind: str, lengthscale: float) -> None:
        self.Z = np.ascontiguousarray(Z, dtype=np.float64)
        if self.Z.ndim != 2:
            raise InputDataError(f"Z must be a 2-D array, got shape {self.Z.shape}")
        _profile(np.zeros((1, 1)), kind)  # validates kind
        kernel_matrix(self.Z[:1], self.Z[:1], kind=kind, lengthscale=lengthscale)  # validates l
        self.kind = kind
        self.lengthscale = float(lengthscale)

    @property
    def n(self) -> int:
        return int(self.Z.shape[0])

    def block(self, rows: npt.ArrayLike, cols: npt.ArrayLike | None = None) -> FloatArray:
        """k(Z_rows, Z_cols) [len(rows), len(cols)]; ``cols=None`` means every candidate."""
        r = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        Zc = self.Z if cols is None else self.Z[np.atleast_1d(np.asarray(cols, dtype=np.int64))]
        return kernel_matrix(self.Z[r], Zc, kind=self.kind, lengthscale=self.lengthscale)

    def row(self, j: int) -> FloatArray:
        """k(Z_j, Z) [n]."""
        out: FloatArray = self.block([int(j)])[0]
        return out
