"""Zero-mean GP over a local design and the posterior of its gradient at theta.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Section 2.4 (conditioning; the gradient of a GP is a
GP), Algorithm 1 line 6 (posterior-mean gradient) and Section 3.1 (acquisition alpha = Tr of the posterior
gradient covariance); Section 3.4 (noisy observations: sigma^2 I added to k(D, D) in line 6).

Notation (shapes in brackets)::

    D        [m, d]   design (evaluated points);  y [m] or Y [m, n] observations at D (one column per user)
    K        [m, m]   k(D, D) + (noise_var + jitter) I = R R^T  (Cholesky; noise_var = sigma^2 of s3.4)
    G        [d, m]   grad k(theta, D)
    W        [d, m]   G K^{-1}                       the linear map from observations to grad mu(theta)
    grad mu(theta)    W y [d]   (or W Y [d, n])     (Alg. 1 line 6 with y = L(D, x_i))
    Sigma(theta; D)   [d, d] = grad k(theta, theta) grad^T - G K^{-1} G^T       (Section 2.4)
    mu(theta) = k(theta, D) K^{-1} y                (Section 2.4, prior mean m = 0)

``jitter`` is an absolute diagonal term for numerical stability (e.g. the degree-2 polynomial kernel in
d = 5 has a 21-dimensional feature space, so k(D, D) is singular once m > 21); if the Cholesky factorisation
fails it is multiplied by 100 up to ``MAX_JITTER`` and the value used is kept in ``jitter_used``.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import numpy.typing as npt
from scipy.linalg import LinAlgError, cho_factor, cho_solve
from scipy.linalg.lapack import dpotrs

from shared.bo.gibo.kernels import GradKernel, as_points, as_theta
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["DEFAULT_JITTER", "MAX_JITTER", "GradientGP"]

DEFAULT_JITTER = 1e-8
MAX_JITTER = 1e-2


class GradientGP:
    """The GP posterior given the design ``D`` (observations enter linearly, so they are passed per call)."""

    def __init__(
        self,
        kernel: GradKernel,
        D: npt.ArrayLike,
        *,
        noise_var: float = 0.0,
        jitter: float = DEFAULT_JITTER,
    ) -> None:
        if not (math.isfinite(noise_var) and noise_var >= 0):
            raise InputDataError(f"noise_var must be a finite number >= 0, got {noise_var!r}")
        if not (math.isfinite(jitter) and jitter >= 0):
            raise InputDataError(f"jitter must be a finite number >= 0, got {jitter!r}")
        self.kernel = kernel
        self.D = as_points(D, name="design D")
        self.noise_var = float(noise_var)
        self.d = int(self.D.shape[1])
        self.m = int(self.D.shape[0])
        self.jitter_used = float(jitter)
        self._chol: tuple[FloatArray, bool] | None = None
        if self.m:
            Kd = kernel(self.D, self.D)
            if not np.isfinite(Kd).all():
                raise InputDataError("k(D, D) is not finite; rescale the design or the kernel")
            jit = float(jitter)
            while True:
                try:
                    self._chol = cho_factor(Kd + (self.noise_var + jit) * np.eye(self.m), lower=True)
                    break
                except LinAlgError:
                    jit = max(jit * 100.0, 1e-12)
                    if jit > MAX_JITTER:
                        raise InputDataError(
                            "k(D, D) is not positive definite even with jitter "
                            f"{MAX_JITTER}; remove duplicate design points or pass noise_var > 0"
                        ) from None
            self.jitter_used = jit

    @property
    def diag_add(self) -> float:
        """What is added to the diagonal of k(D, D): noise_var + jitter_used."""
        return self.noise_var + self.jitter_used

    def solve(self, R: FloatArray) -> FloatArray:
        """K^{-1} R for R [m] or [m, k].

        LAPACK's ``dpotrs`` is called directly, as ``scipy.linalg.cho_solve`` calls it (the same numbers), but
        without that function's batching wrapper, which cost more than the solve itself on these small
        systems: the acquisition's optimiser solves tens of thousands of them per step.
        """
        if self._chol is None:
            return np.zeros_like(R)
        b = np.asarray_chkfinite(R)  # (as cho_solve checks it)
        c, lower = self._chol
        if b.dtype != np.float64 or b.ndim not in (1, 2) or b.size == 0 or b.shape[0] != c.shape[0]:
            out: FloatArray = cho_solve(self._chol, R)  # its checks and messages
            return out
        x, info = dpotrs(c, b, lower=lower)
        if info != 0:  # pragma: no cover - only for an illegal argument, which the checks above exclude
            raise ValueError(f"illegal value in {-info}th argument of internal potrs")
        return cast(FloatArray, x)

    def _theta(self, theta: npt.ArrayLike) -> FloatArray:
        return as_theta(theta, self.d)

    def _obs(self, y: npt.ArrayLike) -> FloatArray:
        Y = np.asarray(y, dtype=np.float64)
        if Y.ndim not in (1, 2) or Y.shape[0] != self.m:
            raise InputDataError(f"observations must have shape [{self.m}] or [{self.m}, n], got {Y.shape}")
        return Y

    def grad_weights(self, theta: npt.ArrayLike) -> FloatArray:
        """W = grad k(theta, D) K^{-1} [d, m] (so that grad mu(theta) = W y)."""
        t = self._theta(theta)
        if not self.m:
            return np.zeros((self.d, 0))
        G = self.kernel.grad(t, self.D)  # [d, m]
        out: FloatArray = self.solve(G.T).T  # K symmetric
        return out

    def mean(self, theta: npt.ArrayLike, y: npt.ArrayLike) -> FloatArray:
        """mu(theta) = k(theta, D) K^{-1} y: a scalar (as 0-d array) for y [m], [n] for Y [m, n]."""
        t = self._theta(theta)
        Y = self._obs(y)
        if not self.m:
            return np.zeros(Y.shape[1:])
        out: FloatArray = self.kernel(t[None, :], self.D)[0] @ self.solve(Y)
        return out

    def grad_mean(self, theta: npt.ArrayLike, y: npt.ArrayLike) -> FloatArray:
        """grad mu(theta) = W y: [d] for y [m], [d, n] for Y [m, n]."""
        Y = self._obs(y)
        out: FloatArray = self.grad_weights(theta) @ Y
        return out

    def grad_cov(self, theta: npt.ArrayLike) -> FloatArray:
        """Sigma(theta; D) = grad k(theta, theta) grad^T - G K^{-1} G^T [d, d] (symmetrised)."""
        t = self._theta(theta)
        prior = self.kernel.grad_grad(t)
        if not self.m:
            return prior
        G = self.kernel.grad(t, self.D)
        S = prior - G @ self.solve(G.T)
        out: FloatArray = 0.5 * (S + S.T)
        return out

    def grad_cov_trace(self, theta: npt.ArrayLike) -> float:
        """Tr Sigma(theta; D): the gradient-bias gauge of Theorems 3.2 / 3.3."""
        return float(np.trace(self.grad_cov(theta)))
