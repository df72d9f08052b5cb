"""An end-to-end run of DP-GIBO (Algorithm 1, or Algorithm 2 with an adaptive batch), for tests / benchmarks.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 (lines 2-10), Algorithm 2 (line 4: adaptive
batch size), Remark 4.1 (AdaGrad), Section 3.4 (noisy observations: sigma^2 I in line 6), Lemma 3.1 (mu-GDP).

Notation (shapes in brackets)::

    theta^(t) [d];  bounds [d, 2];  T iterations;  n users;  B clipping bound;  mu the GDP parameter
    D_t      [m_t, d]   design after step t (D_{-1} empty; every batch is appended, Alg. 1 line 5)
    L_t      [m_t, n]   losses of the design points on every user, rows appended as the design grows
    loss_matrix_fn(Z [b, d]) -> [b, n]   the (data curator's) evaluation of L(z, x_i) on new points
    step t:  Z  = argmin_{|Z| = b} alpha(Z; D_{t-1}, theta^(t))     (Alg. 1 line 4 / Alg. 2 lines 4-5)
             D_t = D_{t-1} u Z                                      (line 5)
             g   = clip-average of W L_t + N(0, sigma^2 I), exactly (lines 6-8, private_gradient)
             theta^(t+1) = updater.step(theta^(t), g, bounds)       (line 8 / Remark 4.1; projected)

Only the released gradients touch the data, so the design, the thetas and the batch sizes are
post-processing of a mu-GDP release (Lemma 3.1). The acquisition (line 4) is computed without the
observation-noise variance: Section 3.4 adds sigma^2 I in line 6 only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.acquisition import as_bounds, choose_adaptive_batch, optimize_batch
from shared.bo.gibo.gp import DEFAULT_JITTER, GradientGP
from shared.bo.gibo.kernels import GradKernel, as_theta
from shared.bo.gibo.private_gradient import noise_std, private_gradient
from shared.bo.gibo.updates import Updater
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]
LossMatrixFn = Callable[[FloatArray], npt.ArrayLike]

__all__ = ["DPGiboResult", "LossMatrixFn", "run_dp_gibo"]


@dataclass(frozen=True)
class DPGiboResult:
    """The path of a run: thetas [T + 1, d], per-step batch size, alpha, released gradient; the design."""

    thetas: FloatArray
    batch_sizes: list[int]
    alphas: list[float]
    gradients: FloatArray  # [T, d] released (noisy) gradients
    design: FloatArray  # [m_T, d]
    sigma: float

    @property
    def theta(self) -> FloatArray:
        """theta^(T), what Algorithm 1 returns (line 10)."""
        out: FloatArray = self.thetas[-1]
        return out


def run_dp_gibo(
    loss_matrix_fn: LossMatrixFn,
    theta0: npt.ArrayLike,
    bounds: npt.ArrayLike,
    *,
    T: int,
    B: float,
    mu: float,
    kernel: GradKernel,
    updater: Updater,
    rng: np.random.Generator,
    noise_rng: np.random.Generator | None = None,
    batch_size: int | None = None,
    tolerance: float | None = None,
    obs_noise_var: float = 0.0,
    jitter: float = DEFAULT_JITTER,
    init_scale: float = 0.1,
    n_restarts: int = 1,
    maxiter: int | None = None,
) -> DPGiboResult:
    """Algorithm 1 (``batch_size=b``) or Algorithm 2 (``tolerance=eps``): give exactly one of the two.

    ``maxiter`` (Algorithm 1 only) caps the L-BFGS-B iterations of each batch optimisation
    (``optimize_batch``); None keeps its default. ``rng`` drives the acquisition; ``noise_rng`` the privacy
    noise (None: a fresh OS-keyed AES-CTR generator per step, as the curator's oracle draws it).
    """
    if (batch_size is None) == (tolerance is None):
        raise InputDataError("give exactly one of batch_size (Algorithm 1) and tolerance (Algorithm 2)")
    if maxiter is not None and (batch_size is None or not isinstance(maxiter, int) or maxiter < 1):
        raise InputDataError(
            f"maxiter must be an integer >= 1 and needs batch_size (Algorithm 1), got {maxiter!r}"
        )
    theta = as_theta(theta0)
    d = int(theta.shape[0])
    bd = as_bounds(bounds, d)
    if ((theta < bd[:, 0]) | (theta > bd[:, 1])).any():
        raise InputDataError("theta0 lies outside the bounds; start inside the box")
    if not isinstance(T, int | np.integer) or isinstance(T, bool) or T < 1:
        raise InputDataError(f"T (number of iterations) must be an integer >= 1, got {T!r}")
    noise_std(B, T, 1, mu)  # validates B and mu before any evaluation

    D = np.zeros((0, d))
    L: FloatArray | None = None
    thetas = [theta.copy()]
    batch_sizes: list[int] = []
    alphas: list[float] = []
    grads: list[FloatArray] = []
    sigma = math.nan
    for _ in range(int(T)):
        gp_acq = GradientGP(kernel, D, jitter=jitter)
        if batch_size is not None:
            extra = {} if maxiter is None else {"maxiter": maxiter}
            Z, alpha = optimize_batch(
                gp_acq, theta, batch_size, bd, rng, init_scale=init_scale, n_restarts=n_restarts, **extra
            )
        else:
            assert tolerance is not None  # for the type checker
            choice = choose_adaptive_batch(
                gp_acq, theta, bd, tolerance, rng, init_scale=init_scale, n_restarts=n_restarts
            )
            Z, alpha = choice.Z, choice.alpha
        new = np.asarray(loss_matrix_fn(Z), dtype=np.float64)
        if new.ndim != 2 or new.shape[0] != Z.shape[0] or (L is not None and new.shape[1] != L.shape[1]):
            n_txt = "n" if L is None else str(L.shape[1])
            raise InputDataError(f"loss_matrix_fn must return [{Z.shape[0]}, {n_txt}], got {new.shape}")
        D = np.vstack([D, Z])
        L = new if L is None else np.vstack([L, new])
        gp6 = GradientGP(kernel, D, noise_var=obs_noise_var, jitter=jitter)
        W = gp6.grad_weights(theta)
        g = private_gradient(W, L, B=B, T=int(T), mu=mu, rng=noise_rng)
        sigma = noise_std(B, int(T), int(L.shape[1]), mu, d)
        theta = updater.step(theta, g, bd)
        thetas.append(theta.copy())
        batch_sizes.append(int(Z.shape[0]))
        alphas.append(float(alpha))
        grads.append(g)
    return DPGiboResult(
        thetas=np.asarray(thetas),
        batch_sizes=batch_sizes,
        alphas=alphas,
        gradients=np.asarray(grads),
        design=D,
        sigma=sigma,
    )
