"""The kernel formulas, written once: squared exponential (SE), Matern-5/2 and polynomial, with the
derivatives DP-GIBO needs. Every other module (``shared.bo.gp``, ``shared.bo.mle``, the heavy-tailed / LDP
strategies, ``shared.bo.gibo.kernels``, ``shared.federated.rff``) evaluates its kernel through these.

Notation (shapes in brackets)::

    A [p, r], B [q, r]   point sets (rows);  Z [n, r] the candidates of a release (fixed)
    l > 0  lengthscale (a number, or one per dimension where stated);  s2 > 0  signal variance
    d = |a - b| / l
    k_SE(a, b)  = s2 exp(-d^2 / 2)                                   (GPML eqs. 2.16, 4.9)
    k_M52(a, b) = (1 + sqrt5 d + 5 d^2 / 3) exp(-sqrt5 d)             (GPML eq. 4.17, nu = 5/2; s2 = 1)
    k_poly(a, b) = (a.b + c)^p,  p a positive integer, c >= 0        (DP-GIBO Section 4.1: p = 2, c = 1)

The heavy-tailed / LDP GP-UCB analyses (Chowdhury & Gopalan 2019; Zhou & Tan 2021) state their RKHS-norm
bound B under k(z, z) = 1: ``kernel_matrix`` / ``RowKernel`` (SE and Matern-5/2) have unit signal variance.

Three ways to the squared distance ``|a - b|^2``, each kept where its properties are needed (a caller's
numbers must not change, so each keeps its exact sequence of floating-point operations):

- ``scaled_sqdist``: coordinate by coordinate, ``sum_k (a_k - b_k)^2 / l^2``. Every entry is a deterministic
  function of its two rows alone, whatever the other rows of the block (a rebuilt strategy evaluating a
  subset of the candidates gets the same bits as the live one evaluating all of them), and there is no
  cancellation for nearby points. O(p q r). Used by ``kernel_matrix`` and ``RowKernel``.
- ``expanded_sqdist`` / ``sqdist_from_gram``: ``|a|^2 + |b|^2 - 2 a.b`` clamped at 0, one GEMM; the GP's
  (``se_matrix``; ``shared.bo.gp``, ``shared.federated.rff``).
- ``pairwise_diff`` / ``sqdist_from_diff``: the [p, q, r] differences, which the SE derivatives need anyway
  (``shared.bo.gibo``).

The SE profile itself is ``se_from_sqdist`` (optional ``out=``: in place) everywhere but in the GP's hot
path, which forms the kernel row in log space from one dgemv and ends it with ``se_finish_log``.

Derivatives (DP-GIBO, "Scalable DP Bayesian optimisation", Section 2.4: the joint GP of f and its gradient;
Section 2.1 notation: ``grad k(x, y) := d/dx k(x, y)``, ``k(x, y) grad^T := d/dy k(x, y)``), for theta [d],
a design X [m, d] and a batch Z [b, d]::

    grad k(theta, X)           [d, m]     column j = d/dtheta k(theta, x_j)                 (Alg. 1 line 6)
    grad k(theta, theta) grad^T [d, d]    d^2/(dx dy^T) k(x, y) at x = y = theta  (prior gradient cov.)
    grad_x k(A, B)             [p, q, d]  d/da k(a_i, b_j)          (the acquisition's analytic gradient in Z)
    H(theta, Z)                [b, d, d]  H_j = d^2 k(theta, z_j) / (dtheta dz_j^T)   (likewise)

    SE:          d/dx k(x, y) = -(x - y) / l^2 k(x, y);   grad k(theta, theta) grad^T = s2 / l^2 I
                 H(theta, z) = k(theta, z) / l^2 (I - (theta - z)(theta - z)^T / l^2)
    polynomial:  d/dx k(x, y) = p (x.y + c)^(p-1) y
                 grad k(theta, theta) grad^T = p s^(p-1) I + p (p-1) s^(p-2) theta theta^T,
                 s = theta.theta + c
                 H(theta, z) = p s^(p-1) I + p (p-1) s^(p-2) z theta^T,  s = theta.z + c
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]
KernelName = Literal["se", "matern52"]

__all__ = [
    "KERNELS",
    "KernelName",
    "RowKernel",
    "expanded_sqdist",
    "kernel_matrix",
    "matern52_from_sqdist",
    "pairwise_diff",
    "poly_grad",
    "poly_grad_cross",
    "poly_grad_grad",
    "poly_grad_x",
    "poly_matrix",
    "scaled_sqdist",
    "se_diff_matrix",
    "se_finish_log",
    "se_from_sqdist",
    "se_grad",
    "se_grad_cross",
    "se_grad_grad",
    "se_grad_x",
    "se_matrix",
    "sqdist_from_diff",
    "sqdist_from_gram",
]

KERNELS: tuple[str, ...] = ("se", "matern52")


# ------------------------------------------------------------------------------------- squared distances
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


def sqdist_from_gram(a_sq: FloatArray, b_sq: FloatArray, ab: FloatArray) -> FloatArray:
    """``max(|a|^2 + |b|^2 - 2 a.b, 0)`` [p, q] from the squared norms [p], [q] and the products [p, q]."""
    sq: FloatArray = a_sq[:, None] + b_sq[None, :] - 2.0 * ab
    np.maximum(sq, 0.0, out=sq)
    return sq


def expanded_sqdist(a: FloatArray, b: FloatArray) -> FloatArray:
    """``|a - b|^2`` [len(a), len(b)] through the expansion (``sqdist_from_gram``): one GEMM."""
    return sqdist_from_gram((a * a).sum(1), (b * b).sum(1), a @ b.T)


def pairwise_diff(A: FloatArray, B: FloatArray) -> FloatArray:
    """``a_i - b_j`` [p, q, r]."""
    out: FloatArray = A[:, None, :] - B[None, :, :]
    return out


def sqdist_from_diff(diff: FloatArray) -> FloatArray:
    """``|a_i - b_j|^2`` [p, q] from the differences [p, q, r] (``pairwise_diff``)."""
    out: FloatArray = np.einsum("pqk,pqk->pq", diff, diff)
    return out


# -------------------------------------------------------------------------------------- the profiles
def se_from_sqdist(
    sq: FloatArray, signal_variance: float = 1.0, *, sq_scale: float = 1.0, out: FloatArray | None = None
) -> FloatArray:
    """``s2 exp(-(sq / 2) / sq_scale)``: the SE kernel from squared distances (GPML eq. 2.16), with
    ``sq_scale = l^2`` when ``sq`` is not scaled by the lengthscale. In the order ``-0.5 sq``, ``/ sq_scale``,
    ``exp``, ``s2 *`` (a factor or divisor of 1 is skipped: it is exact), into ``out`` (may be ``sq``) or a
    new array."""
    res: FloatArray = np.multiply(sq, -0.5, out=out)
    if sq_scale != 1.0:
        np.divide(res, sq_scale, out=res)
    np.exp(res, out=res)
    if signal_variance != 1.0:
        np.multiply(res, signal_variance, out=res)
    return res


def se_finish_log(part: FloatArray, shift: float, log_s2: float) -> None:
    """The SE kernel's element-wise end in log space, in place: ``part <- exp(min(part + shift, ln s2))``.

    With ``part = z_i.z_j - |z_i|^2/2`` (one dgemv over ``[Z/l; -|Z/l|^2/2]``) and ``shift = ln s2 -
    |z_j|^2/2``, ``part + shift = ln s2 - |z_i - z_j|^2/2``, clamped at ``ln s2`` (a distance is >= 0): the
    kernel row k(Z_j, Z) of ``shared.bo.gp``'s hot path."""
    np.add(part, shift, out=part)  # ln s2 - |z_i - z_j|^2 / 2
    np.minimum(part, log_s2, out=part)
    np.exp(part, out=part)


def matern52_from_sqdist(sq: FloatArray) -> FloatArray:
    """``(1 + d + d^2/3) exp(-d)``, ``d = sqrt(5 sq)`` (GPML eq. 4.17, nu = 5/2); overwrites ``sq``."""
    d = np.sqrt(np.multiply(sq, 5.0, out=sq), out=sq)
    e = np.exp(-d)
    out = np.multiply(d, d)
    out *= 1.0 / 3.0
    out += d
    out += 1.0
    out *= e  # (1 + d + d^2/3) exp(-d)
    return out


def _profile(sq: FloatArray, kind: str) -> FloatArray:
    """The unit-variance kernel ``kind`` of scaled squared distances ``sq`` (a fresh temporary: reused)."""
    if kind == "se":
        return se_from_sqdist(sq, out=sq)
    if kind == "matern52":
        return matern52_from_sqdist(sq)
    raise InputDataError(f"kernel must be one of {', '.join(KERNELS)}, got {kind!r}")


# ------------------------------------------------------------------------------------- kernel matrices
def se_matrix(
    A: FloatArray, B: FloatArray, lengthscale: float | npt.ArrayLike, signal_variance: float = 1.0
) -> FloatArray:
    """``k_SE(A, B) = s2 exp(-|(a - b) / l|^2 / 2)`` [len(A), len(B)] (GPML eq. 2.16), l a number or one per
    dimension, through the expansion (``expanded_sqdist``: one GEMM)."""
    ls = np.asarray(lengthscale, dtype=np.float64)
    return se_from_sqdist(expanded_sqdist(A / ls, B / ls), signal_variance)


def kernel_matrix(A: FloatArray, B: FloatArray, *, kind: str, lengthscale: float) -> FloatArray:
    """``k(A, B)`` [len(A), len(B)] for kernel ``kind`` ("se" or "matern52") with lengthscale l, unit
    signal variance, from ``scaled_sqdist`` (each entry a function of its two rows alone)."""
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


# ------------------------------------------------------------------------- SE derivatives (DP-GIBO)
def se_diff_matrix(A: FloatArray, B: FloatArray, lengthscale: float, signal_variance: float) -> FloatArray:
    """``k_SE(A, B)`` [p, q], isotropic l, from the differences (``pairwise_diff``; DP-GIBO's kernel)."""
    return se_from_sqdist(sqdist_from_diff(pairwise_diff(A, B)), signal_variance, sq_scale=lengthscale**2)


def se_grad(theta: FloatArray, X: FloatArray, lengthscale: float, signal_variance: float) -> FloatArray:
    """grad k(theta, X) [d, m] = ``-(theta - x_j) / l^2 k(theta, x_j)``."""
    k = se_diff_matrix(theta[None, :], X, lengthscale, signal_variance)[0]  # [m]
    out: FloatArray = -(theta[:, None] - X.T) / lengthscale**2 * k[None, :]
    return out


def se_grad_grad(d: int, lengthscale: float, signal_variance: float) -> FloatArray:
    """grad k(theta, theta) grad^T [d, d] = ``s2 / l^2 I`` (any theta)."""
    out: FloatArray = np.eye(d) * (signal_variance / lengthscale**2)
    return out


def se_grad_x(A: FloatArray, B: FloatArray, lengthscale: float, signal_variance: float) -> FloatArray:
    """[p, q, d]: ``d/da k(a_i, b_j) = -(a_i - b_j) / l^2 k(a_i, b_j)``."""
    diff = pairwise_diff(A, B)  # [p, q, d]
    k = se_from_sqdist(sqdist_from_diff(diff), signal_variance, sq_scale=lengthscale**2)
    out: FloatArray = diff * (-k / lengthscale**2)[:, :, None]
    return out


def se_grad_cross(theta: FloatArray, Z: FloatArray, lengthscale: float, signal_variance: float) -> FloatArray:
    """[b, d, d]: ``H_j = k(theta, z_j) / l^2 (I - (theta - z_j)(theta - z_j)^T / l^2)``."""
    l2 = lengthscale**2
    r = theta[None, :] - Z  # [b, d]
    k = se_diff_matrix(theta[None, :], Z, lengthscale, signal_variance)[0]  # [b]
    eye = np.eye(theta.shape[0])[None, :, :]
    out: FloatArray = (k / l2)[:, None, None] * (eye - r[:, :, None] * r[:, None, :] / l2)
    return out


# ------------------------------------------------------------------------------ polynomial (DP-GIBO)
def poly_matrix(A: FloatArray, B: FloatArray, degree: int, offset: float) -> FloatArray:
    """``k_poly(A, B) = (a.b + c)^p`` [p, q]."""
    out: FloatArray = (A @ B.T + offset) ** degree
    return out


def poly_grad(theta: FloatArray, X: FloatArray, degree: int, offset: float) -> FloatArray:
    """grad k(theta, X) [d, m] = ``p (theta.x_j + c)^(p-1) x_j``."""
    p = degree
    s = X @ theta + offset  # [m]
    out: FloatArray = X.T * (p * s ** (p - 1))[None, :]
    return out


def poly_grad_grad(theta: FloatArray, degree: int, offset: float) -> FloatArray:
    """grad k(theta, theta) grad^T [d, d] = ``p s^(p-1) I + p (p-1) s^(p-2) theta theta^T``."""
    p = degree
    s = float(theta @ theta) + offset
    out: FloatArray = p * s ** (p - 1) * np.eye(theta.shape[0])
    if p >= 2:
        out = out + p * (p - 1) * s ** (p - 2) * np.outer(theta, theta)
    return out


def poly_grad_x(A: FloatArray, B: FloatArray, degree: int, offset: float) -> FloatArray:
    """[p, q, d]: ``d/da k(a_i, b_j) = p (a_i.b_j + c)^(p-1) b_j``."""
    p = degree
    s = A @ B.T + offset  # [p, q]
    out: FloatArray = (p * s ** (p - 1))[:, :, None] * B[None, :, :]
    return out


def poly_grad_cross(theta: FloatArray, Z: FloatArray, degree: int, offset: float) -> FloatArray:
    """[b, d, d]: ``H_j = p s^(p-1) I + p (p-1) s^(p-2) z_j theta^T``, ``s = theta.z_j + c``."""
    p = degree
    s = Z @ theta + offset  # [b]
    out: FloatArray = (p * s ** (p - 1))[:, None, None] * np.eye(theta.shape[0])[None, :, :]
    if p >= 2:
        out = out + (p * (p - 1) * s ** (p - 2))[:, None, None] * (Z[:, :, None] * theta[None, None, :])
    return out
