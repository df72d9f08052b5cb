"""Kernels with the derivatives DP-GIBO needs: squared exponential and polynomial.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Section 2.4 (the joint GP of f and its gradient) and
Section 2.1 (notation: ``grad k(x, y) := d/dx k(x, y)``, ``k(x, y) grad^T := d/dy k(x, y)``).

Notation (shapes in brackets)::

    d                    dimension of the parameter space Theta
    theta    [d]         the point at which the gradient is estimated
    X        [m, d]      a design (m points); A [p, d], B [q, d] arbitrary point sets
    k(A, B)  [p, q]      kernel matrix
    grad k(theta, X)     [d, m]   column j = d/dtheta k(theta, x_j)                 (Alg. 1 line 6)
    grad k(theta, theta) grad^T   [d, d]   d^2/(dx dy^T) k(x, y) at x = y = theta  (prior gradient cov.)
    grad_x k(A, B)       [p, q, d]  d/da k(a_i, b_j)          (the acquisition's analytic gradient in Z)
    H(theta, Z)          [b, d, d]  H_j = d^2 k(theta, z_j) / (dtheta dz_j^T)   (likewise)

    SE:          k(x, y) = s2 exp(-|x - y|^2 / (2 l^2))
                 d/dx k(x, y) = -(x - y) / l^2 k(x, y);   grad k(theta, theta) grad^T = s2 / l^2 I
                 H(theta, z) = k(theta, z) / l^2 (I - (theta - z)(theta - z)^T / l^2)
    polynomial:  k(x, y) = (x.y + c)^p,  p a positive integer, c >= 0
                 d/dx k(x, y) = p (x.y + c)^(p-1) y
                 grad k(theta, theta) grad^T = p s^(p-1) I + p (p-1) s^(p-2) theta theta^T,
                 s = theta.theta + c
                 H(theta, z) = p s^(p-1) I + p (p-1) s^(p-2) z theta^T,  s = theta.z + c
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["GradKernel", "PolynomialKernel", "SEKernel", "as_points", "as_theta"]


def as_points(A: npt.ArrayLike, d: int | None = None, *, name: str = "points") -> FloatArray:
    """``A`` as a finite float [p, d] array (InputDataError otherwise)."""
    a = np.asarray(A, dtype=np.float64)
    if a.ndim != 2 or (d is not None and a.shape[1] != d):
        want = f"[p, {d}]" if d is not None else "[p, d]"
        raise InputDataError(f"{name} must be a 2-D array of shape {want}, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise InputDataError(f"{name} must be finite (no NaN / inf)")
    return a


def as_theta(theta: npt.ArrayLike, d: int | None = None) -> FloatArray:
    """``theta`` as a finite float [d] vector (InputDataError otherwise)."""
    t = np.asarray(theta, dtype=np.float64)
    if t.ndim != 1 or (d is not None and t.shape[0] != d):
        want = f"[{d}]" if d is not None else "[d]"
        raise InputDataError(f"theta must be a 1-D vector of shape {want}, got shape {t.shape}")
    if not np.isfinite(t).all():
        raise InputDataError("theta must be finite (no NaN / inf); the optimiser has diverged or was misfed")
    return t


class GradKernel(Protocol):
    """What the gradient GP needs from a kernel."""

    def __call__(self, A: FloatArray, B: FloatArray) -> FloatArray:
        """k(A, B) [p, q]."""
        ...

    def grad(self, theta: FloatArray, X: FloatArray) -> FloatArray:
        """grad k(theta, X) [d, m]: derivative of k(theta, x_j) w.r.t. theta, one column per point."""
        ...

    def grad_grad(self, theta: FloatArray) -> FloatArray:
        """grad k(theta, theta) grad^T [d, d]: prior covariance of the gradient at theta."""
        ...

    def grad_x(self, A: FloatArray, B: FloatArray) -> FloatArray:
        """[p, q, d]: the derivative of k(a_i, b_j) with respect to its first argument a_i."""
        ...

    def grad_cross(self, theta: FloatArray, Z: FloatArray) -> FloatArray:
        """[b, d, d]: H_j[a, c] = d^2 k(theta, z_j) / (dtheta_a dz_jc), the derivative of grad k(theta, z_j)
        with respect to z_j."""
        ...


def _sqdist(A: FloatArray, B: FloatArray) -> FloatArray:
    diff = A[:, None, :] - B[None, :, :]
    out: FloatArray = np.einsum("pqk,pqk->pq", diff, diff)
    return out


@dataclass(frozen=True)
class SEKernel:
    """Squared exponential ``s2 exp(-|x - y|^2 / (2 l^2))`` with isotropic lengthscale l."""

    lengthscale: float = 1.0
    signal_variance: float = 1.0

    def __post_init__(self) -> None:
        for name, v in (("lengthscale", self.lengthscale), ("signal_variance", self.signal_variance)):
            if not (math.isfinite(v) and v > 0):
                raise InputDataError(f"SEKernel {name} must be a finite number > 0, got {v!r}")

    def __call__(self, A: FloatArray, B: FloatArray) -> FloatArray:
        out: FloatArray = self.signal_variance * np.exp(-0.5 * _sqdist(A, B) / self.lengthscale**2)
        return out

    def grad(self, theta: FloatArray, X: FloatArray) -> FloatArray:
        k = self(theta[None, :], X)[0]  # [m]
        out: FloatArray = -(theta[:, None] - X.T) / self.lengthscale**2 * k[None, :]
        return out

    def grad_grad(self, theta: FloatArray) -> FloatArray:
        out: FloatArray = np.eye(theta.shape[0]) * (self.signal_variance / self.lengthscale**2)
        return out

    def grad_x(self, A: FloatArray, B: FloatArray) -> FloatArray:
        diff = A[:, None, :] - B[None, :, :]  # [p, q, d]
        k = self.signal_variance * np.exp(-0.5 * np.einsum("pqk,pqk->pq", diff, diff) / self.lengthscale**2)
        out: FloatArray = diff * (-k / self.lengthscale**2)[:, :, None]
        return out

    def grad_cross(self, theta: FloatArray, Z: FloatArray) -> FloatArray:
        l2 = self.lengthscale**2
        r = theta[None, :] - Z  # [b, d]
        k = self(theta[None, :], Z)[0]  # [b]
        eye = np.eye(theta.shape[0])[None, :, :]
        out: FloatArray = (k / l2)[:, None, None] * (eye - r[:, :, None] * r[:, None, :] / l2)
        return out


@dataclass(frozen=True)
class PolynomialKernel:
    """Polynomial ``(x.y + c)^p``; Section 4.1 uses p = 2, c = 1."""

    degree: int = 2
    offset: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.degree, int | np.integer) or isinstance(self.degree, bool) or self.degree < 1:
            raise InputDataError(f"PolynomialKernel degree must be an integer >= 1, got {self.degree!r}")
        if not (math.isfinite(self.offset) and self.offset >= 0):
            raise InputDataError(f"PolynomialKernel offset must be a finite number >= 0, got {self.offset!r}")

    def __call__(self, A: FloatArray, B: FloatArray) -> FloatArray:
        out: FloatArray = (A @ B.T + self.offset) ** self.degree
        return out

    def grad(self, theta: FloatArray, X: FloatArray) -> FloatArray:
        p = self.degree
        s = X @ theta + self.offset  # [m]
        out: FloatArray = X.T * (p * s ** (p - 1))[None, :]
        return out

    def grad_grad(self, theta: FloatArray) -> FloatArray:
        p = self.degree
        s = float(theta @ theta) + self.offset
        out: FloatArray = p * s ** (p - 1) * np.eye(theta.shape[0])
        if p >= 2:
            out = out + p * (p - 1) * s ** (p - 2) * np.outer(theta, theta)
        return out

    def grad_x(self, A: FloatArray, B: FloatArray) -> FloatArray:
        p = self.degree
        s = A @ B.T + self.offset  # [p, q]
        out: FloatArray = (p * s ** (p - 1))[:, :, None] * B[None, :, :]
        return out

    def grad_cross(self, theta: FloatArray, Z: FloatArray) -> FloatArray:
        p = self.degree
        s = Z @ theta + self.offset  # [b]
        out: FloatArray = (p * s ** (p - 1))[:, None, None] * np.eye(theta.shape[0])[None, :, :]
        if p >= 2:
            out = out + (p * (p - 1) * s ** (p - 2))[:, None, None] * (Z[:, :, None] * theta[None, None, :])
        return out
