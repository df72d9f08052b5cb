"""The problems and baselines of ``pobo bench gibo`` (``shared.tools.bench.gibo``): DP-GIBO's Section 4
examples.

Paper: "Scalable Differentially Private Bayesian Optimization" (DP-GIBO), Section 4 and Appendix C:

* **4.1 / C.1, location of the normal model**: x_i ~ N(theta*, I_5), theta* = 1, n = 50; per-user loss
  ``0.5 ||x_i - theta||^2`` (``losses.gaussian_location``); the MLE is the sample mean.
* **4.2 / C.2, Huber linear regression**: y_i = x_i^T theta* + eps_i, x_i ~ N(0, I_4), eps_i ~ N(0, 1),
  theta* = 1, n = 100; per-user loss ``rho_1(y_i - x_i^T theta) min(1, 2 / ||x_i||^2)``
  (``losses.huber_regression``). Baseline: noisy clipped gradient descent (DP-GD, Song et al. 2013) with the
  exact per-user gradients ``-psi_c(r_i) x_i min(1, 2 / ||x_i||^2)``, clip B, noise std 2 B sqrt(T) / (n mu)
  -- the same mechanism and accounting as Algorithm 1 lines 7-8, on the true gradients.
* **4.3 / C.3, GP-regression length-scale tuning**: data from a 10-dimensional GP with RBF kernel whose
  length-scales are drawn from U[0, 5]^10, the box over which the validation loss is minimised. The paper does
  not spell out the per-user loss; here (the reading of Sections 3.4 and 5, where the training routine is not
  privatised) the *training* set is public and each *validation* point is a user: ``L(l, (x_i, y_i)) =
  (y_i - m_l(x_i))^2``, m_l the GP posterior mean fitted on the training set with length-scales l (unit
  signal variance, the true noise variance). The validation loss is the mean over users. The GP sample is
  drawn by random Fourier features (Rahimi & Recht 2007; M features: an approximation of the RBF GP), the
  inputs are U[0, 1]^10 and the observation noise N(0, 0.1^2) (the paper says neither; with N(0, I) inputs
  most draws have a rough coordinate that makes the sample near white noise and the tuning moot). The
  search is over the length-scales themselves, as in the paper (not their logs); the lower end of the box is
  0.05, not 0 (a zero length-scale is not a kernel). Near 0 the loss has a high flat plateau: as one l_j -> 0
  the kernel between distinct inputs -> 0, the posterior mean at the validation points -> 0 and f -> mean(y^2)
  ~ var(y) (~0.3-0.45 here, against ~0.015 at the true l), with a vanishing gradient; with U[0, 1] inputs and
  500 training points one l_j below ~0.1 is already most of the way there. Scale of the private gradient at
  B = 1 (three draws, at the random start): per-user surrogate-gradient norms have median 0.2-0.5 and 9-31 %
  are clipped; the clipped average has norm 0.08-0.2 against an expected noise norm
  2 B sqrt(T) / (n mu) sqrt(d) = 0.0022 sqrt(10) = 0.007 -- the privacy noise matters only near the optimum,
  where |grad f| falls to ~the noise norm. Baselines (non-private, as in
  the paper): uniform random search and a plain GP-UCB (``gp_ucb``) with the same number of loss evaluations.

All randomness comes from numpy Generators seeded by (seed, run, purpose); a benchmark's seeds never reach
production, where the noise comes from a fresh OS-keyed AES-CTR generator. The noise is added as production
adds it (``shared.privacy.lattice``), from the run's seeded generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.linalg import cho_factor, cho_solve, solve_discrete_lyapunov
from scipy.optimize import minimize

from shared.bo.gibo.gp import DEFAULT_JITTER, GradientGP
from shared.bo.gibo.kernels import GradKernel
from shared.bo.gibo.loop import DPGiboResult
from shared.bo.gibo.losses import huber_regression
from shared.bo.gibo.private_gradient import clip_rows, private_gradient_diagnostics, step_mechanism
from shared.bo.gibo.updates import GradientDescent
from shared.bo.gp import Hyperparameters, se_kernel
from shared.bo.kernels import expanded_sqdist, se_from_sqdist
from shared.bo.mle import fit_hyperparameters
from shared.privacy.lattice import add_lattice_noise

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "GPTuningProblem",
    "gp_ucb",
    "gradient_norms",
    "huber_data",
    "huber_minimiser",
    "huber_user_gradients",
    "location_data",
    "location_noise_floor",
    "make_gp_tuning",
    "noisy_gd",
    "random_search",
    "rng_for",
]

#: Purposes of the per-run generators (the third entry of the seed sequence).
DATA, START, ACQ, NOISE, BASELINE = 1, 2, 3, 4, 5


def rng_for(seed: int, run: int, example: int, purpose: int) -> np.random.Generator:
    """The Generator of one (seed, run, example, purpose): runs and examples never share draws."""
    return np.random.default_rng([seed, run, example, purpose])


# -- Section 4.1 -------------------------------------------------------------------------------------------
def location_data(rng: np.random.Generator, n: int, d: int = 5, theta_star: float = 1.0) -> FloatArray:
    """x [n, d], x_i ~ N(theta* 1, I_d) (Section 4.1)."""
    out: FloatArray = theta_star + rng.standard_normal((n, d))
    return out


def gradient_norms(
    res: DPGiboResult, L_full: FloatArray, x: FloatArray, kernel: GradKernel, *, B: float, T: int
) -> dict[str, FloatArray]:
    """Section 4.1, Fig. 1 (bottom), per step t: the norms of
    ``bias`` = clean clipped surrogate average - grad f_x(theta_t) (f_x the mean of 0.5 ||x_i - theta||^2),
    ``surrogate_bias`` = clean clipped surrogate average - (1/n) sum_i Pi_B(theta_t - x_i), and
    ``noise`` = released gradient - clean clipped surrogate average.

    Step t used the design prefix of sum(batch_sizes[:t + 1]) points and theta_t; W is rebuilt exactly as in
    the loop (same kernel and jitter), the clean clipped average from ``private_gradient_diagnostics`` with
    mu = inf, and the noise is the released gradient minus it.
    """
    ends = np.cumsum(res.batch_sizes)
    x_bar = x.mean(axis=0)
    out: dict[str, list[float]] = {"bias": [], "surrogate_bias": [], "noise": []}
    for t, m in enumerate(ends):
        theta = res.thetas[t]
        W = GradientGP(kernel, res.design[:m], jitter=DEFAULT_JITTER).grad_weights(theta)
        clean = private_gradient_diagnostics(W, L_full[:m], B=B, T=T, mu=math.inf).clean_average
        exact_clipped = clip_rows(theta[None, :] - x, B).mean(axis=0)
        out["bias"].append(float(np.linalg.norm(clean - (theta - x_bar))))
        out["surrogate_bias"].append(float(np.linalg.norm(clean - exact_clipped)))
        out["noise"].append(float(np.linalg.norm(res.gradients[t] - clean)))
    return {k: np.asarray(v) for k, v in out.items()}


def location_noise_floor(x: FloatArray, *, B: float, lr: float, sigma: float) -> float:
    """Predicted RMS of ||theta_t - x_bar|| once noisy clipped GD has mixed (a reference, not a bound).

    The noiseless clipped iteration has the fixed point theta_c: (1/n) sum_i Pi_B(theta_c - x_i) = 0 (not the
    MLE x_bar when the clip is active). Linearised there, e_{t+1} = (I - lr J) e_t - lr sigma w_t with
    J = (1/n) sum_i dPi_B(theta_c - x_i) (B / r_i (I - u_i u_i^T) where r_i = |theta_c - x_i| > B, else I),
    whose stationary covariance S solves S = A S A^T + lr^2 sigma^2 I, A = I - lr J (discrete Lyapunov).
    Returns sqrt(|theta_c - x_bar|^2 + Tr S). A Monte Carlo of noisy clipped GD on the exact gradients agrees
    at sigma = 0.24 (0.451 vs 0.455) and is ~15 % above it at sigma = 0.98 (1.78 vs 2.05): the excursions
    leave the linear regime.
    """
    d = int(x.shape[1])
    theta = x.mean(axis=0)
    for _ in range(2000):  # the noiseless clipped iteration, started at the MLE
        step = clip_rows(theta[None, :] - x, B).mean(axis=0)
        theta = theta - step
        if float(np.linalg.norm(step)) < 1e-13:
            break
    v = theta[None, :] - x
    r = np.linalg.norm(v, axis=1)
    u = v / np.maximum(r, 1e-300)[:, None]
    active = r > B
    scale = np.where(active, B / np.maximum(r, 1e-300), 1.0)
    proj = np.eye(d)[None, :, :] - np.where(active, 1.0, 0.0)[:, None, None] * np.einsum("ni,nj->nij", u, u)
    J = (scale[:, None, None] * proj).mean(axis=0)
    A = np.eye(d) - lr * J
    S = solve_discrete_lyapunov(A, (lr * sigma) ** 2 * np.eye(d))
    return float(math.sqrt(float(np.sum((theta - x.mean(axis=0)) ** 2)) + float(np.trace(S))))


# -- Section 4.2 -------------------------------------------------------------------------------------------
def huber_data(
    rng: np.random.Generator, n: int, d: int = 4, theta_star: float = 1.0
) -> tuple[FloatArray, FloatArray]:
    """(X [n, d], y [n]) with y = X theta* + N(0, 1), X ~ N(0, I_d) (Section 4.2)."""
    X = rng.standard_normal((n, d))
    y: FloatArray = X @ np.full(d, theta_star) + rng.standard_normal(n)
    return X, y


def huber_user_gradients(
    theta: FloatArray, X: FloatArray, y: FloatArray, *, c: float = 1.0, clip: float = 2.0
) -> FloatArray:
    """G [n, d], row i = d/dtheta of rho_c(y_i - x_i^T theta) min(1, clip / ||x_i||^2) (Section 4.2)."""
    psi = np.clip(y - X @ theta, -c, c)
    weight = clip / np.maximum(np.einsum("nd,nd->n", X, X), clip)
    out: FloatArray = -(psi * weight)[:, None] * X
    return out


def huber_minimiser(X: FloatArray, y: FloatArray, theta0: FloatArray) -> FloatArray:
    """theta_hat = argmin of the mean loss (non-private; BFGS with the exact gradient)."""

    def f(theta: FloatArray) -> tuple[float, FloatArray]:
        loss = float(huber_regression(theta[None, :], X, y)[0].mean())
        return loss, huber_user_gradients(theta, X, y).mean(axis=0)

    res = minimize(f, theta0, jac=True, method="BFGS", options={"gtol": 1e-12, "maxiter": 1000})
    out: FloatArray = np.asarray(res.x, dtype=np.float64)
    return out


def noisy_gd(
    user_gradients: Callable[[FloatArray], FloatArray],
    theta0: FloatArray,
    bounds: FloatArray,
    *,
    T: int,
    B: float,
    mu: float,
    lr: float,
    rng: np.random.Generator,
) -> FloatArray:
    """DP-GD: theta' = Pi_box(theta - lr ((1/n) sum_i Pi_B(g_i(theta)) + sigma w)), sigma = 2B sqrt(T)/(n mu).

    The per-step mechanism is Algorithm 1 lines 7-8 with the exact per-user gradients in place of the
    surrogate ones (so the same Lemma 3.1 accounting makes it mu-GDP). Returns the path [T + 1, d].
    """
    updater = GradientDescent(lr=lr)
    theta = np.asarray(theta0, dtype=np.float64).copy()
    path = [theta.copy()]
    d = int(theta.shape[0])
    for _ in range(T):
        G = user_gradients(theta)
        g = clip_rows(G, B).mean(axis=0)
        mechanism = step_mechanism(B, T, int(G.shape[0]), mu, d)
        if mechanism is not None:  # line 8's noise, added exactly as the oracle adds it
            g = add_lattice_noise(mechanism, g, rng)
        theta = updater.step(theta, g, bounds)
        path.append(theta.copy())
    return np.asarray(path)


# -- Section 4.3 -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPTuningProblem:
    """Section 4.3: public training set, one validation point per user, loss = squared prediction error."""

    X_train: FloatArray  # [n_train, d]
    y_train: FloatArray  # [n_train]
    X_val: FloatArray  # [n, d]  the users
    y_val: FloatArray  # [n]
    lengthscales: FloatArray  # [d]  the generating length-scales (for reference only)
    noise_var: float
    bounds: FloatArray  # [d, 2]

    def loss_matrix(self, Z: npt.ArrayLike) -> FloatArray:
        """L [b, n]: (y_i - m_l(x_i))^2 for each length-scale vector l = Z[k] (one GP fit per row of Z)."""
        Zs = np.atleast_2d(np.asarray(Z, dtype=np.float64))
        out = np.empty((Zs.shape[0], self.y_val.shape[0]))
        eye = np.eye(self.X_train.shape[0])
        for k, ls in enumerate(Zs):  # a loop over design points, not users
            A, V = self.X_train / ls, self.X_val / ls
            K = se_from_sqdist(expanded_sqdist(A, A)) + (self.noise_var + 1e-8) * eye
            alpha = cho_solve(cho_factor(K, lower=True, check_finite=False), self.y_train, check_finite=False)
            pred = se_from_sqdist(expanded_sqdist(V, A)) @ alpha
            out[k] = (self.y_val - pred) ** 2
        return out

    def validation_loss(self, Z: npt.ArrayLike) -> FloatArray:
        """f(l) [b]: the mean of the users' losses."""
        out: FloatArray = self.loss_matrix(Z).mean(axis=1)
        return out


def make_gp_tuning(
    rng: np.random.Generator,
    *,
    d: int = 10,
    n_train: int = 500,
    n_val: int = 4500,
    features: int = 2000,
    noise_sd: float = 0.1,
    lower: float = 0.05,
    upper: float = 5.0,
) -> GPTuningProblem:
    """l ~ U[0, upper]^d, f ~ GP(0, RBF(l)) by random Fourier features, x ~ U[0, 1]^d, y = f(x) + noise."""
    ls = rng.uniform(0.0, upper, d)
    ls = np.maximum(ls, 1e-3)  # U[0, 5] has no mass at 0; guards the division only
    W = rng.standard_normal((features, d)) / ls[None, :]
    phase = rng.uniform(0.0, 2.0 * math.pi, features)
    a = rng.standard_normal(features)
    X = rng.uniform(0.0, 1.0, (n_train + n_val, d))
    f = math.sqrt(2.0 / features) * np.cos(X @ W.T + phase[None, :]) @ a
    y = f + noise_sd * rng.standard_normal(X.shape[0])
    return GPTuningProblem(
        X_train=X[:n_train],
        y_train=y[:n_train],
        X_val=X[n_train:],
        y_val=y[n_train:],
        lengthscales=ls,
        noise_var=noise_sd**2,
        bounds=np.tile([lower, upper], (d, 1)).astype(np.float64),
    )


def random_search(
    objective: Callable[[FloatArray], FloatArray],
    bounds: FloatArray,
    budget: int,
    rng: np.random.Generator,
    x0: FloatArray,
) -> FloatArray:
    """The objective at x0 and at budget - 1 uniform points of the box: values [budget], in order."""
    Z = rng.uniform(bounds[:, 0], bounds[:, 1], (budget - 1, bounds.shape[0]))
    return objective(np.vstack([x0[None, :], Z]))


def gp_ucb(
    objective: Callable[[FloatArray], FloatArray],
    bounds: FloatArray,
    budget: int,
    rng: np.random.Generator,
    x0: FloatArray,
    *,
    n_init: int | None = None,
    candidates: int = 2000,
    refit_every: int = 10,
    delta: float = 0.1,
) -> FloatArray:
    """Plain sequential GP-UCB minimising ``objective`` over the box: values [budget], in order.

    Srinivas et al. (ICML 2010), the rule of their Theorem 1 on a finite candidate set C:
    x_t = argmin_{x in C} m(x) - sqrt(beta_t) s(x), beta_t = 2 log(|C| t^2 pi^2 / (6 delta)). The surrogate is
    an isotropic SE GP on the standardised values (constant mean), hyper-parameters by type-II maximum
    likelihood (``shared.bo.mle.fit_hyperparameters``) every ``refit_every`` evaluations. Initial design: x0
    and n_init - 1 (default d) uniform points; C: half uniform in the box, half N(incumbent, (0.1 width)^2).
    """
    d = int(bounds.shape[0])
    lo, hi = bounds[:, 0], bounds[:, 1]
    width = hi - lo
    n0 = min(budget, d + 1 if n_init is None else n_init)
    X = np.vstack([x0[None, :], rng.uniform(lo, hi, (n0 - 1, d))])
    y = np.asarray(objective(X), dtype=np.float64)
    scale = float(
        np.median(np.sqrt(expanded_sqdist(*(2 * [rng.uniform(lo, hi, (200, d))])))[np.triu_indices(200, 1)])
    )
    hp: Hyperparameters | None = None
    while y.shape[0] < budget:
        t = y.shape[0]
        ys = (y - y.mean()) / (y.std() if y.std() > 0 else 1.0)
        if hp is None or t % refit_every == 0:
            hp = fit_hyperparameters(X, np.arange(t), ys, distance_scale=scale, restarts=2)
        K = se_kernel(X, X, hp) + (hp.noise_variance + 1e-10) * np.eye(t)
        chol = cho_factor(K, lower=True, check_finite=False)
        best = X[int(np.argmin(y))]
        half = candidates // 2
        C = np.vstack(
            [
                rng.uniform(lo, hi, (candidates - half, d)),
                np.clip(best[None, :] + 0.1 * width * rng.standard_normal((half, d)), lo, hi),
            ]
        )
        Kc = se_kernel(C, X, hp)
        mean = Kc @ cho_solve(chol, ys, check_finite=False)
        var = hp.signal_variance - np.einsum("cm,mc->c", Kc, cho_solve(chol, Kc.T, check_finite=False))
        beta = 2.0 * math.log(C.shape[0] * t * t * math.pi**2 / (6.0 * delta))
        x = C[int(np.argmin(mean - math.sqrt(beta) * np.sqrt(np.maximum(var, 0.0))))]
        X = np.vstack([X, x[None, :]])
        y = np.append(y, objective(x[None, :]))
    return y
