"""Kernels with the derivatives DP-GIBO needs: squared exponential and polynomial, as objects.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Section 2.4 (the joint GP of f and its gradient) and
Section 2.1 (notation: ``grad k(x, y) := d/dx k(x, y)``, ``k(x, y) grad^T := d/dy k(x, y)``).

The formulas (the kernels, grad k(theta, X) [d, m], grad k(theta, theta) grad^T [d, d], grad_x k(A, B)
[p, q, d] and H(theta, Z) [b, d, d]) are those of ``shared.bo.kernels``, which states them; this module
binds them to the hyper-parameters of one kernel (the ``GradKernel`` interface) and holds the input checks
of the DP-GIBO modules (``as_points``, ``as_theta``)::

    SE:          k(x, y) = s2 exp(-|x - y|^2 / (2 l^2))       (``SEKernel``)
    polynomial:  k(x, y) = (x.y + c)^p,  p >= 1, c >= 0       (``PolynomialKernel``)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shared.bo import kernels
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
        return kernels.se_diff_matrix(A, B, self.lengthscale, self.signal_variance)

    def grad(self, theta: FloatArray, X: FloatArray) -> FloatArray:
        return kernels.se_grad(theta, X, self.lengthscale, self.signal_variance)

    def grad_grad(self, theta: FloatArray) -> FloatArray:
        return kernels.se_grad_grad(theta.shape[0], self.lengthscale, self.signal_variance)

    def grad_x(self, A: FloatArray, B: FloatArray) -> FloatArray:
        return kernels.se_grad_x(A, B, self.lengthscale, self.signal_variance)

    def grad_cross(self, theta: FloatArray, Z: FloatArray) -> FloatArray:
        return kernels.se_grad_cross(theta, Z, self.lengthscale, self.signal_variance)


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
        return kernels.poly_matrix(A, B, self.degree, self.offset)

    def grad(self, theta: FloatArray, X: FloatArray) -> FloatArray:
        return kernels.poly_grad(theta, X, self.degree, self.offset)

    def grad_grad(self, theta: FloatArray) -> FloatArray:
        return kernels.poly_grad_grad(theta, self.degree, self.offset)

    def grad_x(self, A: FloatArray, B: FloatArray) -> FloatArray:
        return kernels.poly_grad_x(A, B, self.degree, self.offset)

    def grad_cross(self, theta: FloatArray, Z: FloatArray) -> FloatArray:
        return kernels.poly_grad_cross(theta, Z, self.degree, self.offset)
