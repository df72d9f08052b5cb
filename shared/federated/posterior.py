"""The RFF posterior of one agent's observations and its Thompson sample (eq. 2).

Paper: DP-FTS-DE (Dai, Low & Jaillet, NeurIPS 2021), Section 2, eq. (2): with Phi_t the features of the
agent's t queries, Sigma_t = Phi_t^T Phi_t + lambda I and nu_t = Sigma_t^{-1} Phi_t^T y_t, a function from
the (approximate) GP posterior is f(x) = phi(x)^T omega with omega ~ N(nu_t, lambda Sigma_t^{-1}). The
local TS of Algorithm 2, line 6 samples from GP(mu_t, beta_{t+1}^2 sigma_t^2): in feature space
omega ~ N(nu_t, beta^2 lambda Sigma_t^{-1}).

Notation (shapes in brackets)::

    Phi     [t, M]   phi(x_1..x_t);  y [t] observations;  lambda > 0 regularisation (noise variance)
    Sigma   [M, M]   Phi^T Phi + lambda I = L L^T    (Cholesky; never inverted explicitly)
    nu      [M]      Sigma^{-1} Phi^T y               (two triangular solves)
    omega   [M]      nu + beta sqrt(lambda) L^{-T} xi,  xi ~ N(0, I_M)
                     Cov = beta^2 lambda L^{-T} L^{-1} = beta^2 lambda Sigma^{-1}
    beta_t           B + sigma sqrt(2 (gamma_{t-1} + 1 + log(4 / delta)))   (Section 3.1, Theorem 1)
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy.linalg import cho_factor, cho_solve, solve_triangular

from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["RFFPosterior", "beta_t", "information_gain"]


class RFFPosterior:
    """N(nu_t, lambda Sigma_t^{-1}) over the feature weights omega, from features Phi [t, M] and y [t].

    With no observations (t = 0) it is the prior N(0, I): Sigma = lambda I, nu = 0.
    """

    def __init__(self, Phi: npt.ArrayLike, y: npt.ArrayLike, *, lam: float = 1.0) -> None:
        lam = float(lam)
        if not (math.isfinite(lam) and lam > 0):
            raise InputDataError(f"lam must be a finite number > 0, got {lam!r}")
        P = np.asarray(Phi, dtype=np.float64)
        yv = np.asarray(y, dtype=np.float64)
        if P.ndim != 2 or P.shape[1] < 1:
            raise InputDataError(f"Phi must have shape [t, M] with M >= 1, got shape {P.shape}")
        if yv.shape != (P.shape[0],):
            raise InputDataError(f"y must have shape ({P.shape[0]},), got shape {yv.shape}")
        if not (np.isfinite(P).all() and np.isfinite(yv).all()):
            raise InputDataError("Phi and y must be finite")
        self.lam = lam
        self.M = int(P.shape[1])
        self.t = int(P.shape[0])
        Sigma = P.T @ P + lam * np.eye(self.M)  # [M, M], eq. (2)
        self._chol = cho_factor(Sigma, lower=True)  # positive definite: lambda > 0
        self.nu: FloatArray = cho_solve(self._chol, P.T @ yv)  # [M]

    @property
    def L(self) -> FloatArray:
        """Lower Cholesky factor of Sigma_t [M, M]."""
        return np.tril(self._chol[0])

    def covariance(self) -> FloatArray:
        """lambda Sigma_t^{-1} [M, M] (for tests and diagnostics; sampling never forms it)."""
        cov: FloatArray = self.lam * cho_solve(self._chol, np.eye(self.M))
        return cov

    def sample(
        self, rng: np.random.Generator, *, n_samples: int | None = None, beta: float = 1.0
    ) -> FloatArray:
        """omega ~ N(nu_t, beta^2 lambda Sigma_t^{-1}) (eq. 2; beta = 1 is eq. 2 as printed).

        omega = nu + beta sqrt(lambda) L^{-T} xi: one triangular solve, no inverse. Shape [M], or
        [n_samples, M] when ``n_samples`` is given.
        """
        beta = float(beta)
        if not (math.isfinite(beta) and beta > 0):
            raise InputDataError(f"beta must be a finite number > 0, got {beta!r}")
        k = 1 if n_samples is None else int(n_samples)
        if k < 1:
            raise InputDataError(f"n_samples must be >= 1, got {n_samples!r}")
        xi = rng.standard_normal((self.M, k))
        Z = solve_triangular(self.L, xi, lower=True, trans="T")  # L^{-T} xi, [M, k]
        omegas: FloatArray = (self.nu[:, None] + beta * math.sqrt(self.lam) * Z).T
        return omegas[0] if n_samples is None else omegas


def information_gain(Phi: npt.ArrayLike, *, lam: float = 1.0) -> float:
    """0.5 log det(I + Phi Phi^T / lambda) = 0.5 log det(Sigma_t / lambda): the information gain of the
    observed design in the RFF model (a plug-in for gamma_t, which the paper defines as its maximum)."""
    P = np.asarray(Phi, dtype=np.float64)
    if P.ndim != 2:
        raise InputDataError(f"Phi must have shape [t, M], got shape {P.shape}")
    post = RFFPosterior(P, np.zeros(P.shape[0]), lam=lam)
    return float(np.log(np.diag(post.L)).sum() - 0.5 * post.M * math.log(post.lam))


def beta_t(B: float, sigma: float, gamma: float, delta: float) -> float:
    """beta_t = B + sigma sqrt(2 (gamma_{t-1} + 1 + log(4 / delta))) (Section 3.1 and Theorem 1).

    ``B`` bounds the RKHS norm of the objectives, ``sigma`` is the observation noise std, ``gamma`` the
    information gain gamma_{t-1} and ``delta`` in (0, 1) the utility confidence (not a privacy delta).
    """
    for name, value in (("B", B), ("sigma", sigma), ("gamma", gamma)):
        if not (math.isfinite(float(value)) and float(value) >= 0):
            raise InputDataError(f"{name} must be a finite number >= 0, got {value!r}")
    if not 0.0 < float(delta) < 1.0:
        raise InputDataError(f"delta must be in (0, 1), got {delta!r}")
    return float(B) + float(sigma) * math.sqrt(2.0 * (float(gamma) + 1.0 + math.log(4.0 / float(delta))))
