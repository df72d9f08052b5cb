"""TGP-UCB: GP-UCB on truncated rewards. Registry strategies ``tgp-ucb`` and ``ldp-tgp-ucb``.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (AAAI 2021), Algorithm 2 (LDP-TGP-UCB);
Chowdhury & Gopalan, "Bayesian Optimization under Heavy-tailed Payoffs" (NeurIPS 2019), TGP-UCB. For
t = 1, 2, ... (t = the play being chosen)::

    beta_t = B + (2 sqrt2/sqrt lambda) b_{t-1} sqrt(gamma_{t-1} + ln(1/delta)) + sqrt(S_{t-1}/lambda)
    x_t    = argmax_x  mu^_{t-1}(x) + beta_t sigma_{t-1}(x)          (Alg. 2 line 6: beta, not sqrt(beta))
    y^_t   = ybar_t 1{|ybar_t| <= b_t}                               (line 8: ZEROED, not clipped)
    mu^_t(x)      = k_t(x)^T (K_t + lambda I)^{-1} Y^_t              (line 9)
    sigma_t^2(x)  = k(x, x) - k_t(x)^T (K_t + lambda I)^{-1} k_t(x)  (line 10)

Truncation levels and the bias term S_t (a bound on sum_{tau<=t} E[eta^_tau | F_{tau-1}]^2, the T_2 term of
the proof of Theorem 3):

- LDP (Alg. 2 lines 2, 4): ``b_t = B + R + L ln t``, L = 2(B + R)/epsilon; ``S_t = K (ln t + 1)``,
  K = B^2 + R^2 + 2 L^2 (ln 0 read as 0, i.e. b_0 = B + R and S_0 = K at t = 1).
- heavy-tailed (Chowdhury & Gopalan, TGP-UCB; the public code's ``b_t = v^{1/(1+alpha)} t^{1/(2(1+alpha))}``):
  the same two-term confidence width, with ``E[|y| 1{|y| > b}] <= v / b^alpha`` giving
  ``S_t = v^{2/(1+alpha)} sum_{tau<=t} tau^{-alpha/(1+alpha)}``. (The public code uses the heuristic
  ``beta_t = B sqrt(lambda) + b_t sqrt(ln t)``; ``beta_multiplier`` rescales ours.)

gamma_t, the maximum information gain, cannot be computed; we use the information gain of the points
actually played, ``1/2 log det(I + K_t / lambda) = 1/2 sum_tau ln(1 + sigma_{tau-1}^2(x_tau) / lambda)``,
accumulated one play at a time from the posterior variance before each update (the Cholesky pivot), a lower
bound on gamma_t.

Each reward is truncated once, with the b of its own round, so the posterior is an ordinary GP posterior
(prior mean 0, noise variance lambda) on the truncated rewards, grown incrementally:
``shared.bo.gp.GaussianProcess`` with the kernel of ``shared.bo.kernels``. Per step: O(n (t + r)) (one
kernel row, one triangular solve, one new row of the factor) plus O(n) for the acquisition; memory O(n t).
On the dask backend (``shared.bo.backend``) the GP is a ``shared.bo.dask_gp.DaskGP`` with the same row
kernel (SE or Matern-5/2), its per-candidate state on the workers: a round moves O(t + r) numbers, and the
choices and UCB values are those of the local loop bit for bit (``kernel_gp``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from shared.bo.acquisition import ucb_details, ucb_value
from shared.bo.backend import make_gp, uses_dask
from shared.bo.gp import GaussianProcess, Hyperparameters
from shared.bo.kernels import RowKernel
from shared.bo.strategies.base import Answer, RowRequest, StrategyParams, register
from shared.bo.strategies.heavy_tailed.common import (
    HeavyTailedParams,
    HeavyTailedStrategy,
    LDPParams,
    Tails,
    ln_or_zero,
)
from shared.errors import StrategyError

__all__ = [
    "KernelGP",
    "kernel_gp",
    "LDPTGPUCBStrategy",
    "TGPParams",
    "TGPUCBStrategy",
    "LDPTGPParams",
    "tgp_beta",
    "tgp_truncation",
]

FloatArray = npt.NDArray[np.float64]


def tgp_truncation(tails: Tails, t: int) -> float:
    """b_t (t >= 1): ``B + R + L ln t`` (LDP, Alg. 2 line 4), else ``v^{1/(1+a)} t^{1/(2(1+a))}``."""
    t = max(int(t), 1)
    if tails.private:
        return tails.B + tails.R + tails.laplace * math.log(t)
    a = tails.alpha
    return float(tails.v ** (1.0 / (1.0 + a)) * t ** (1.0 / (2.0 * (1.0 + a))))


def tgp_bias_sum(tails: Tails, t: int) -> float:
    """S_t, the bound on the summed squared truncation bias after t plays (see the module docstring)."""
    if tails.private:
        return tails.K * (ln_or_zero(t) + 1.0)
    a = tails.alpha
    if t < 1:
        return 0.0
    taus = np.arange(1, int(t) + 1, dtype=np.float64)
    return float(tails.v ** (2.0 / (1.0 + a)) * np.sum(taus ** (-a / (1.0 + a))))


def tgp_beta(
    tails: Tails, t: int, gamma_prev: float, *, lam: float, delta: float, multiplier: float
) -> float:
    """beta_t of play t >= 1 from gamma_{t-1} (Alg. 2 line 5; b_0 := b_1), times ``multiplier``."""
    b_prev = tgp_truncation(tails, max(t - 1, 1))
    width = (
        tails.B
        + (2.0 * math.sqrt(2.0) / math.sqrt(lam)) * b_prev * math.sqrt(gamma_prev + math.log(1.0 / delta))
        + math.sqrt(tgp_bias_sum(tails, t - 1)) / math.sqrt(lam)
    )
    return multiplier * width


class KernelGP(GaussianProcess):
    """``GaussianProcess`` (prior mean 0, noise variance lambda) with an SE or Matern-5/2 ``RowKernel``."""

    def __init__(self, kernel: RowKernel, lam: float) -> None:
        self.row_kernel = kernel
        super().__init__(
            kernel.Z,
            Hyperparameters(lengthscale=kernel.lengthscale, signal_variance=1.0, noise_variance=lam),
            prior_mean="zero",
        )

    def kernel_row(self, j: int) -> FloatArray:
        return self.row_kernel.row(j)

    def kernel_rows(self, indices: npt.ArrayLike) -> FloatArray:
        return self.row_kernel.block(indices)


def kernel_gp(kernel: RowKernel, lam: float) -> GaussianProcess:
    """The strategy's GP: a local ``KernelGP``, or on the dask backend a ``DaskGP`` with the same row kernel
    (each partition forms its range of every kernel row with ``kernel``'s formula, entry by entry the bits of
    the local row, ``shared.bo.dask_gp``): the same choices and UCB values either way."""
    if not uses_dask():
        return KernelGP(kernel, lam)
    hp = Hyperparameters(lengthscale=kernel.lengthscale, signal_variance=1.0, noise_variance=lam)
    return make_gp(kernel.Z, hp, prior_mean="zero", row_kernel=kernel)


class TGPParams(HeavyTailedParams):
    """Parameters of ``tgp-ucb`` (Chowdhury & Gopalan 2019): B, v, alpha and the common fields."""


class LDPTGPParams(LDPParams):
    """Parameters of ``ldp-tgp-ucb`` (Zhou & Tan 2021, Alg. 2): epsilon, B, R and the common fields."""


@register
class TGPUCBStrategy(HeavyTailedStrategy[TGPParams | LDPTGPParams]):
    """``tgp-ucb``: one row per round, GP-UCB on zero-truncated rewards (see the module docstring)."""

    name: ClassVar[str] = "tgp-ucb"
    description: ClassVar[str] = (
        "TGP-UCB for heavy-tailed payoffs (Chowdhury & Gopalan, NeurIPS 2019): GP-UCB with beta_t sigma "
        "on rewards zeroed when |y| > b_t = v^(1/(1+alpha)) t^(1/(2(1+alpha))); E|y|^(1+alpha) <= v. "
        "Incremental posterior, O(n t) per round."
    )
    Params: ClassVar[type[StrategyParams]] = TGPParams

    def __init__(self, Z: npt.ArrayLike, params: TGPParams | LDPTGPParams, state: Mapping[str, Any]) -> None:
        super().__init__(Z, params, state)
        self.gp = kernel_gp(self.kernel, params.lam)
        self.info_gain = 0.0  # 1/2 log det(I + K_t / lambda) of the plays so far
        self.truncated = 0  # how many rewards were zeroed

    @property
    def t(self) -> int:
        """Plays observed so far."""
        return int(self.gp.t)

    def beta(self, t: int) -> float:
        p = self.params
        return tgp_beta(self.tails, t, self.info_gain, lam=p.lam, delta=p.delta, multiplier=p.beta_multiplier)

    def plan(self, *, budget: int, rng: np.random.Generator) -> list[RowRequest]:
        """The initial row of the play while there is one (``UCB.choose``), else the first maximum of ``mu +
        beta sigma`` (Alg. 2 line 6: beta, not sqrt) over the rows not ``blocked``, found by the GP
        (``ucb_argmax``: mean + beta std, zero prior mean; a distributed GP answers without gathering n
        values); the details are those of ``UCB.details`` (the same numbers, computed at the row)."""
        t = self.t + 1
        beta = self.beta(t)
        blocked = self.blocked(self.gp.indices)
        play = t - 1
        if play < len(self.initial) and (blocked is None or not blocked[self.initial[play]]):
            index, source = int(self.initial[play]), "initial"
        else:
            excluded = np.flatnonzero(blocked) if blocked is not None else np.empty(0, dtype=np.int64)
            index, value = self.gp.ucb_argmax(beta, excluded)
            if blocked is not None and not np.isfinite(value):
                raise StrategyError(
                    f"no row is left to choose: all {self.n} are excluded (queried already, or their "
                    "person cannot afford another answer under the study's grant)"
                )
            source = self.name
        mean, std = self.gp.posterior_at(index)
        details = ucb_details(
            source=source,
            acquisition=ucb_value(mean, std, beta),
            beta=beta,
            mean=mean,
            std=std,
            t=t,
            b_t=tgp_truncation(self.tails, t),
            info_gain=self.info_gain,
            lengthscale=self.kernel.lengthscale,
        )
        return [RowRequest(index, details)]

    def posterior_mean(self, index: int) -> float | None:
        return self.gp.posterior_at(int(index))[0]

    def observe(self, answers: Sequence[Answer]) -> None:
        idx, y = self._check(answers)
        for j, value in zip(idx.tolist(), y.tolist(), strict=True):
            t = self.t + 1
            b = tgp_truncation(self.tails, t)
            kept = value if abs(value) <= b else 0.0  # Alg. 2 line 8: zeroed, each reward once
            self.truncated += int(abs(value) > b)
            var_j = self.gp.variance_at(j)
            self.info_gain += 0.5 * math.log1p(var_j / self.params.lam)
            self.gp.add(j, kept)


@register
class LDPTGPUCBStrategy(TGPUCBStrategy):
    """``ldp-tgp-ucb``: TGP-UCB with the LDP truncation b_t = B + R + L ln t (Zhou & Tan 2021, Alg. 2)."""

    name: ClassVar[str] = "ldp-tgp-ucb"
    description: ClassVar[str] = (
        "LDP-TGP-UCB (Zhou & Tan, AAAI 2021, Algorithm 2) for answers privatised by the curator's Laplace "
        "mechanism CTL(epsilon): GP-UCB with beta_t sigma on rewards zeroed when |y| > b_t = B + R + "
        "L ln t, L = 2(B+R)/epsilon. Incremental posterior, O(n t) per round."
    )
    Params: ClassVar[type[StrategyParams]] = LDPTGPParams
