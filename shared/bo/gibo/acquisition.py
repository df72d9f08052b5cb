"""The gradient-uncertainty acquisition of DP-GIBO and the choice of the batch.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Section 3.1 (alpha), Algorithm 1 line 4 (fixed batch
size b) and Algorithm 2 line 4 (adaptive b: the smallest b whose optimised alpha is <= the tolerance eps).

Notation (shapes in brackets)::

    D        [m, d]   current design;  theta [d];  Z [b, d] candidate new points;  bounds [d, 2] (lo, hi)
    alpha(Z; D, theta) = Tr Sigma(theta; D u Z)                                      (Section 3.1)

Sigma(theta; D u Z) is computed from the factorisation of K(D, D) by a Schur-complement (block) update, so
one evaluation costs O(m^2 b) rather than O((m + b)^3)::

    A   [m, b]  K^{-1} k(D, Z)
    C   [d, b]  grad k(theta, Z) - grad k(theta, D) A          (cross-covariance of grad f(theta), f(Z) | D)
    S   [b, b]  k(Z, Z) + (noise + jitter) I - k(Z, D) A       (covariance of f(Z) | D)
    Tr Sigma(theta; D u Z) = Tr Sigma(theta; D) - Tr(C S^{-1} C^T)

(S^{-1} is a pseudo-inverse: S may be numerically singular when the posterior is already exact.)
The minimisation over Z uses scipy's L-BFGS-B inside the box bounds, started at theta plus Gaussian
perturbations of ``init_scale`` times the box width from the Generator given, with the analytic gradient of
alpha in Z (one evaluation per gradient instead of b d + 1 for finite differences). With
P = C S^{-1} [d, b], M = P^T P [b, b], Q = K^{-1} grad k(theta, D)^T P [m, b] and the kernel derivatives
H_j = d grad k(theta, z_j) / dz_j [d, d], E_j = d k(z_j, D) / dz_j [m, d], differentiating
Tr(C S^{-1} C^T) (dX^{-1} = -X^{-1} dX X^{-1}) gives, for each point z_j of the batch::

    d alpha / d z_j = -2 [ H_j^T P_j - E_j^T Q_j - sum_k M_jk d k(z_j, z_k) / dz_j + E_j^T (A M)_j ]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.gp import GradientGP
from shared.bo.gibo.kernels import as_points, as_theta
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["BatchChoice", "acquisition", "as_bounds", "choose_adaptive_batch", "optimize_batch"]


@dataclass(frozen=True)
class BatchChoice:
    """The points chosen (Z [b, d]), their batch size b, the optimised alpha and whether alpha <= tol."""

    Z: FloatArray
    b: int
    alpha: float
    reached_tolerance: bool = True


def as_bounds(bounds: npt.ArrayLike, d: int) -> FloatArray:
    """``bounds`` as a finite float [d, 2] array with lo < hi (InputDataError otherwise)."""
    bd = np.asarray(bounds, dtype=np.float64)
    if bd.shape != (d, 2):
        raise InputDataError(f"bounds must have shape [{d}, 2] (lo, hi per coordinate), got {bd.shape}")
    if not np.isfinite(bd).all() or not (bd[:, 0] < bd[:, 1]).all():
        raise InputDataError("bounds must be finite with lo < hi in every coordinate")
    return bd


def _check_inside(theta: FloatArray, bd: FloatArray) -> None:
    if ((theta < bd[:, 0]) | (theta > bd[:, 1])).any():
        raise InputDataError("theta lies outside the bounds; project it first (updates.project_to_bounds)")


class _Acq:
    """alpha(.; D, theta) with the D-only parts precomputed."""

    def __init__(self, gp: GradientGP, theta: FloatArray) -> None:
        self.gp = gp
        self.theta = theta
        self.base_trace = gp.grad_cov_trace(theta)
        self.GD = gp.kernel.grad(theta, gp.D) if gp.m else np.zeros((gp.d, 0))

    def __call__(self, Z: FloatArray) -> float:
        return self.value_and_grad(Z, with_grad=False)[0]

    def value_and_grad(self, Z: FloatArray, *, with_grad: bool = True) -> tuple[float, FloatArray]:
        """alpha(Z) and, if ``with_grad``, its gradient d alpha / dZ [b, d] (zeros otherwise)."""
        gp = self.gp
        kern = gp.kernel
        b = Z.shape[0]
        C = kern.grad(self.theta, Z)
        S = kern(Z, Z) + gp.diag_add * np.eye(b)
        A = kDZ = None
        if gp.m:
            kDZ = kern(gp.D, Z)
            A = gp.solve(kDZ)
            C = C - self.GD @ A
            S = S - kDZ.T @ A
        S = 0.5 * (S + S.T)
        w, V = np.linalg.eigh(S)
        cut = 1e-12 * max(float(np.abs(w).max()), 1e-300)
        keep = w > cut
        Vk = V[:, keep]
        CV = C @ Vk  # [d, r]
        reduction = float(np.sum(CV * CV / w[keep][None, :]))
        value = self.base_trace - reduction
        if not with_grad:
            return value, np.zeros_like(Z)
        P = (CV / w[keep][None, :]) @ Vk.T  # C S^+  [d, b]
        M = P.T @ P  # [b, b]
        H = kern.grad_cross(self.theta, Z)  # [b, d, d]
        dR = np.einsum("jac,aj->jc", H, P) - np.einsum("jk,jkc->jc", M, kern.grad_x(Z, Z))
        if A is not None:
            E = kern.grad_x(Z, gp.D)  # [b, m, d]
            Q = gp.solve(self.GD.T @ P)  # [m, b]
            dR += np.einsum("jic,ij->jc", E, A @ M - Q)
        grad: FloatArray = -2.0 * dR
        return value, grad


def acquisition(Z: npt.ArrayLike, gp: GradientGP, theta: npt.ArrayLike) -> float:
    """alpha(Z; D, theta) = Tr Sigma(theta; D u Z) for a batch Z [b, d] (Section 3.1)."""
    t = as_theta(theta, gp.d)
    z = as_points(Z, gp.d, name="Z")
    return _Acq(gp, t)(z)


def optimize_batch(
    gp: GradientGP,
    theta: npt.ArrayLike,
    b: int,
    bounds: npt.ArrayLike,
    rng: np.random.Generator,
    *,
    init_scale: float = 0.1,
    n_restarts: int = 1,
    maxiter: int = 200,
) -> tuple[FloatArray, float]:
    """argmin over Z [b, d] in the box of alpha(Z; D, theta) (Alg. 1 line 4): returns (Z, alpha)."""
    t = as_theta(theta, gp.d)
    bd = as_bounds(bounds, gp.d)
    _check_inside(t, bd)
    if not isinstance(b, int | np.integer) or b < 1:
        raise InputDataError(f"batch size b must be an integer >= 1, got {b!r}")
    if not (math.isfinite(init_scale) and init_scale > 0) or n_restarts < 1:
        raise InputDataError("init_scale must be a finite number > 0 and n_restarts >= 1")
    d = gp.d
    acq = _Acq(gp, t)
    width = bd[:, 1] - bd[:, 0]
    flat_bounds = [(float(lo), float(hi)) for _ in range(b) for lo, hi in bd]

    def f(zflat: FloatArray) -> tuple[float, FloatArray]:
        value, grad = acq.value_and_grad(zflat.reshape(b, d))
        return value, grad.ravel()

    best_z: FloatArray | None = None
    best = math.inf
    from scipy.optimize import minimize  # (imported when first used: a service starts without it)

    for _ in range(int(n_restarts)):
        z0 = t[None, :] + init_scale * width[None, :] * rng.standard_normal((b, d))
        z0 = np.clip(z0, bd[:, 0], bd[:, 1])
        res = minimize(
            f, z0.ravel(), jac=True, method="L-BFGS-B", bounds=flat_bounds, options={"maxiter": maxiter}
        )
        z = np.clip(np.asarray(res.x, dtype=np.float64).reshape(b, d), bd[:, 0], bd[:, 1])
        val = acq(z)
        if val < best:
            best, best_z = val, z
    if best_z is None:  # every restart gave a non-finite alpha
        raise InputDataError("the acquisition is not finite near theta; check the kernel and the design")
    return best_z, float(best)


def choose_adaptive_batch(
    gp: GradientGP,
    theta: npt.ArrayLike,
    bounds: npt.ArrayLike,
    tolerance: float,
    rng: np.random.Generator,
    *,
    max_b: int | None = None,
    init_scale: float = 0.1,
    n_restarts: int = 1,
) -> BatchChoice:
    """Algorithm 2 line 4-5: the smallest b in 1..max_b (default d + 1) with min_Z alpha <= tolerance.

    If no b up to ``max_b`` reaches the tolerance, the b = max_b batch is returned with
    ``reached_tolerance=False`` (the paper notes b <= d + 1 suffices for exact observations).
    """
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise InputDataError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    top = gp.d + 1 if max_b is None else int(max_b)
    if top < 1:
        raise InputDataError(f"max_b must be >= 1, got {max_b!r}")
    Z: FloatArray = np.zeros((0, gp.d))
    alpha = math.inf
    for b in range(1, top + 1):
        Z, alpha = optimize_batch(gp, theta, b, bounds, rng, init_scale=init_scale, n_restarts=n_restarts)
        if alpha <= tolerance:
            return BatchChoice(Z=Z, b=b, alpha=alpha, reached_tolerance=True)
    return BatchChoice(Z=Z, b=top, alpha=alpha, reached_tolerance=False)
