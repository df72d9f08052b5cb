"""What the heavy-tailed / local-DP GP-UCB strategies share: parameters, tail constants, kernel, creation.

Two parameterisations of the same three algorithms (TGP-UCB, ATA-GP-UCB, MoMA-GP-UCB):

- non-private, heavy-tailed payoffs (Chowdhury & Gopalan, "Bayesian Optimization under Heavy-tailed
  Payoffs", NeurIPS 2019): ``E[|y_t|^{1+alpha} | F_{t-1}] <= v`` with alpha in (0, 1], ``|f|_H <= B``;
- local differential privacy (Zhou & Tan, "Local Differential Privacy for Bayesian Optimization", AAAI 2021):
  the curator answers ``ybar = y + Laplace(L)``, ``L = 2(B + R)/epsilon`` (Curator 1, CTL(epsilon)), with
  ``|f|_H <= B`` and noise bounded by R. Then alpha = 1 and (Appendix C, Corollary 1)::

      v = B^2 + R^2 + 8 (B + R)^2 / epsilon^2     (second moment bound of ybar; ATA, Theorem 2)
      c = R^2 + 8 (B + R)^2 / epsilon^2           (second moment bound of the noise; MoMA, Corollary 1)
      K = B^2 + R^2 + 2 L^2                       (LDP-TGP-UCB, Alg. 2 line 2)

Notation (shapes in brackets)::

    Z [n, r] candidates;  k(z, z') in {SE, Matern-5/2}, k(z, z) = 1 (``shared.bo.kernels``)
    lambda > 0 regulariser;  delta confidence;  T the study budget (queries);  eps_ny Nystrom accuracy
    t = the number of the play being chosen (plays so far + 1);  n (MoMA) the epoch number

Every beta is multiplied by ``beta_multiplier`` (1: the theorem's value; the default,
``BETA_MULTIPLIER_DEFAULT``, is the rule's pick in ``pobo bench strategies``, docs/strategies.md). The
theorems' betas are conservative; their experiments set parameters "order-wise similar" to the theorems (Zhou
& Tan, Sec. 5). Measured (``pobo bench ldp``, T = 1000): at 1 every strategy is at the random level, at
0.01-0.03 all learn.

Initial points: ``initial_points`` (default 1) distinct random rows, drawn once at creation from the
modeler's creation generator, are played first (one play each; one epoch each for MoMA). With none, the
first choice is the argmax of a constant acquisition (mu_0 = 0, sigma_0 = 1), i.e. row 0.

The Nystrom strategies need randomness at every update (dictionary sampling, Alg. 4). ``plan`` must not
change state and a rebuild must give the same state, so each update draws from
``numpy.random.default_rng([nystrom_seed, update_no, tag])``, ``nystrom_seed`` drawn once at creation and
kept in the strategy's private state (the modeler's own choice, not the curator's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field
from typing_extensions import TypeVar

from shared.bo.gp import median_distance
from shared.bo.kernels import RowKernel
from shared.bo.nystrom import NystromEmbedding, posterior_factors, posterior_from_block
from shared.bo.strategies.base import Answer, RowRequest, Strategy, StrategyParams
from shared.errors import InputDataError

__all__ = [
    "HeavyTailedParams",
    "HeavyTailedStrategy",
    "LDPParams",
    "NystromParams",
    "approximate_posterior",
    "dictionary_features",
    "Tails",
    "default_q",
    "nystrom_rng",
    "tails_from_params",
]

FloatArray = npt.NDArray[np.float64]


# ------------------------------------------------------------------------------------------------ params
#: The six strategies' default ``beta_multiplier``, chosen by the rule of ``pobo bench strategies``.
BETA_MULTIPLIER_DEFAULT = 0.003


class CommonParams(StrategyParams):
    """Fields every heavy-tailed / LDP strategy takes."""

    lam: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="Regulariser lambda > 0.")
    delta: float = Field(default=0.05, gt=0, le=1, allow_inf_nan=False, description="Confidence delta.")
    kernel: Literal["se", "matern52"] = Field(default="se", description="Squared exponential or Matern-5/2.")
    lengthscale: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Kernel lengthscale; null = the median pairwise distance of the released Z.",
    )
    beta_multiplier: float = Field(
        default=BETA_MULTIPLIER_DEFAULT,
        gt=0,
        allow_inf_nan=False,
        description="Factor on the theorem's beta. 1 = as stated, the value with a regret bound, which "
        "explores for more than 1000 queries (at random play's regret or worse after 200 on pobo's bench "
        "problems); the default is the practical value chosen by pobo bench strategies "
        "(docs/strategies.md).",
    )
    initial_points: int = Field(
        default=1, ge=0, le=10_000, description="Random rows played first (one play / epoch each)."
    )
    exclude_queried: bool | None = Field(
        default=None,
        description="Never choose a row already played (MoMA: played in an earlier epoch). null = from the "
        "curator's grant, filled in and recorded when the study is created: true unless the grant answers "
        "a repeated row with fresh noise (fresh_repeats), since a repeat otherwise returns the row's stored "
        "or cached answer, which the algorithm would count as a new independent observation. false = the "
        "papers' algorithms, which may play a row again.",
    )


class HeavyTailedParams(CommonParams):
    """Heavy-tailed payoffs (Chowdhury & Gopalan 2019): ``|f|_H <= B``, ``E|y|^{1+alpha} <= v``."""

    B: float = Field(gt=0, allow_inf_nan=False, description="Bound on the RKHS norm of f.")
    v: float = Field(gt=0, allow_inf_nan=False, description="Bound on E[|y|^(1+alpha)] of a payoff.")
    alpha: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False, description="Moment order - 1.")


class LDPParams(CommonParams):
    """Local DP (Zhou & Tan 2021): the curator's CTL(epsilon) adds Laplace(2(B + R)/epsilon) to each answer.

    ``epsilon``, ``B`` and ``R`` are the values the curator declares on its grant: left out, the modeler
    takes them from the grant when the study is created (and records them); given, they must equal it.
    """

    epsilon: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="The curator's local-DP epsilon; null = the grant's (recorded at creation).",
    )
    B: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Bound on |f| (RKHS norm); null = the grant's (recorded at creation).",
    )
    R: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Bound on the noise |eta|; null = the grant's (recorded at creation).",
    )


class NystromParams(StrategyParams):
    """Fields of the Nystrom strategies (ATA, MoMA)."""

    nystrom_eps: float = Field(
        default=0.1, gt=0, lt=1, allow_inf_nan=False, description="Nystrom accuracy epsilon in (0, 1)."
    )
    q: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Dictionary oversampling q; null = max(ln T, 1) / nystrom_eps^2 (the authors' code).",
    )


def default_q(T: int, nystrom_eps: float) -> float:
    """``q = ln T / eps^2``, the public code's choice (Chowdhury & Gopalan's ATA-GP-UCB experiments),
    floored at ``1 / eps^2`` so that T = 1 still samples. Theorem 2 of Zhou & Tan asks for
    ``6 rho ln(4T/delta)/eps^2``, rho = (1+eps)/(1-eps), about 15x larger
    (every point kept at eps = 0.1); pass it as ``q`` if wanted."""
    return max(math.log(max(T, 1)), 1.0) / nystrom_eps**2


def nystrom_rng(seed: int, update_no: int, tag: int) -> np.random.Generator:
    """The generator of Nystrom update ``update_no``: a pure function of the private seed (rebuildable)."""
    return np.random.default_rng([int(seed), int(update_no), int(tag)])


# ------------------------------------------------------------------------------------------ tail constants
@dataclass(frozen=True)
class Tails:
    """The constants the truncation levels and betas are built from (see the module docstring)."""

    private: bool
    B: float
    alpha: float
    v: float  # bound on E|y|^{1+alpha} (payoff)
    c: float  # bound on E|eta|^{1+alpha} (noise; MoMA)
    laplace: float = 0.0  # L = 2(B+R)/epsilon (private only)
    R: float = 0.0
    epsilon: float = 0.0

    @property
    def K(self) -> float:
        """``K = B^2 + R^2 + 2 L^2`` (LDP-TGP-UCB, Alg. 2 line 2)."""
        return self.B**2 + self.R**2 + 2.0 * self.laplace**2


def tails_from_params(params: StrategyParams) -> Tails:
    """The tail constants of LDP (epsilon, B, R) or heavy-tailed (B, v, alpha) parameters."""
    if isinstance(params, LDPParams):
        eps, B, R = params.epsilon, params.B, params.R
        if eps is None or B is None or R is None:
            raise InputDataError(
                "epsilon, B and R of a local-DP strategy come from the curator's grant: create the study "
                "through the modeler (which reads the grant), or give all three"
            )
        extra = 8.0 * (B + R) ** 2 / eps**2
        return Tails(
            private=True,
            B=B,
            alpha=1.0,
            v=B * B + R * R + extra,
            c=R * R + extra,
            laplace=2.0 * (B + R) / eps,
            R=R,
            epsilon=eps,
        )
    if isinstance(params, HeavyTailedParams):
        c = getattr(params, "c", None)
        return Tails(
            private=False, B=params.B, alpha=params.alpha, v=params.v, c=params.v if c is None else c
        )
    raise InputDataError(f"expected LDP or heavy-tailed parameters, got {type(params).__name__}")


# ------------------------------------------------------------------------------------------ base strategy
#: The parameters of one algorithm: the union of its heavy-tailed and its LDP model (e.g. ``TGPParams |
#: LDPTGPParams``), both ``CommonParams``.
CP = TypeVar("CP", bound=CommonParams)


class HeavyTailedStrategy(Strategy[RowRequest, Answer, CP]):
    """Shared set-up: kernel on the rows of Z, tail constants, initial rows, private Nystrom seed."""

    #: Tag mixed into the Nystrom generator's seed (distinct per algorithm).
    rng_tag: ClassVar[int] = 0

    def __init__(self, Z: npt.ArrayLike, params: CP, state: Mapping[str, Any]) -> None:
        super().__init__(Z, params, state)
        if not isinstance(params, self.Params):  # e.g. the heavy-tailed model given to the LDP strategy
            raise InputDataError(f"{self.name} needs {self.Params.__name__}, got {type(params).__name__}")
        ls = params.lengthscale if params.lengthscale is not None else median_distance(self.Z)
        self.kernel = RowKernel(self.Z, kind=params.kernel, lengthscale=float(ls))
        self.tails = tails_from_params(params)
        self.initial = [int(i) for i in self.state.get("initial_indices", [])]
        if any(not 0 <= i < self.n for i in self.initial):
            raise InputDataError(f"initial_indices must be in [0, {self.n - 1}]")
        self.T = int(self.state.get("T", 1))
        self.seed = int(self.state.get("nystrom_seed", 0))

    @classmethod
    def initial_state(cls, params: CP, *, n: int, budget: int, rng: np.random.Generator) -> dict[str, Any]:
        """The study budget T, the random initial rows and the private Nystrom seed."""
        if budget < 1:
            raise InputDataError(f"budget (iterations) must be >= 1, got {budget}")
        if params.initial_points > n:
            raise InputDataError(
                f"initial_points must be <= the release's n = {n}, got {params.initial_points}"
            )
        k = min(params.initial_points, budget)
        initial = [int(i) for i in rng.choice(n, size=k, replace=False)] if k else []
        return {"T": int(budget), "initial_indices": initial, "nystrom_seed": int(rng.integers(2**62))}

    @classmethod
    def output_privacy(cls, params: CP) -> tuple[float | None, float | None, float | None] | None:
        """(epsilon, B, R) for the LDP parameterisation (None where the study left one out), else None."""
        if isinstance(params, LDPParams):
            return (params.epsilon, params.B, params.R)
        return None

    @classmethod
    def with_output_privacy(cls, params: CP, *, epsilon: float, B: float, R: float) -> CP:
        """LDP parameters with the grant's epsilon, B and R where the study left them out."""
        if not isinstance(params, LDPParams):
            return params
        given = params.model_dump()
        filled = {k: v for k, v in (("epsilon", epsilon), ("B", B), ("R", R)) if given.get(k) is None}
        return type(params).model_validate(given | filled) if filled else params

    @classmethod
    def with_answers(cls, params: CP, *, fresh_repeats: bool) -> CP:
        """``exclude_queried`` from the grant where the study left it out: true unless repeats are fresh."""
        if params.exclude_queried is not None:
            return params
        return type(params).model_validate(params.model_dump() | {"exclude_queried": not fresh_repeats})

    def blocked(self, played: npt.ArrayLike) -> npt.NDArray[np.bool_] | None:
        """[n] the rows ``plan`` must not choose: the ``unavailable`` ones and, with ``exclude_queried``, the
        rows in ``played``; None when there are none."""
        rows = np.asarray(played, dtype=np.int64)
        if not self.params.exclude_queried or rows.size == 0:
            return self.unavailable
        mask = np.zeros(self.n, dtype=bool) if self.unavailable is None else self.unavailable.copy()
        mask[rows] = True
        return mask

    def _check(self, answers: Sequence[Answer]) -> tuple[npt.NDArray[np.int64], FloatArray]:
        idx = np.array([int(a.request.index) for a in answers], dtype=np.int64)
        y = np.array([float(a.y) for a in answers], dtype=np.float64)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.n):
            raise InputDataError(f"answer indices must be in [0, {self.n - 1}]")
        if not np.isfinite(y).all():
            bad = int(np.flatnonzero(~np.isfinite(y))[0])
            raise InputDataError(f"y must be finite, got {float(y[bad])!r} in answer {bad}")
        return idx, y


def ln_or_zero(x: float) -> float:
    """ln x for x >= 1, 0 below (reads the papers' ln(t - 1) at t = 1 as 0)."""
    return math.log(x) if x > 1 else 0.0


# ------------------------------------------------------------------------------- Nystrom posterior helpers
def dictionary_features(
    kernel: RowKernel, atoms: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]
) -> tuple[NystromEmbedding, FloatArray]:
    """The embedding of dictionary ``atoms`` (Alg. 4 line 7) and phi~ at ``rows`` [m, len(rows)]."""
    emb = NystromEmbedding.from_gram(atoms, kernel.block(atoms, atoms))
    return emb, emb.features(kernel.block(atoms, rows))


def approximate_posterior(
    kernel: RowKernel,
    emb: NystromEmbedding | None,
    theta: FloatArray,
    root_inv: FloatArray,
    lam: float,
    cols: npt.NDArray[np.int64] | None,
) -> tuple[FloatArray, FloatArray]:
    """``mu~ = phi~^T theta``, ``sigma~^2 = k(x,x) - |phi~|^2 + lambda |A phi~|^2`` at ``cols`` (None = all)
    (Zhou & Tan Alg. 1 lines 12-13, Alg. 3 lines 13-14), for any A with A^T A = V~^{-1}. O(c m (m + r))."""
    c = kernel.n if cols is None else int(cols.size)
    if emb is None or emb.m == 0:
        return np.zeros(c), np.ones(c)
    # With phi~ = W k_D: mu~ = (W theta)^T k_D and |phi~|^2 - lambda |A phi~|^2 = k_D^T M k_D,
    # M = W^T W - lambda (A W)^T (A W) [m, m]: one m x m by m x c product instead of two.
    # (``shared.bo.nystrom.posterior_factors`` / ``posterior_from_block``, which the dask backend's column
    # ranges run too: ``shared.bo.dask_nystrom``)
    w_theta, M = posterior_factors(emb, theta, root_inv, lam)
    return posterior_from_block(kernel.block(emb.atoms, cols), w_theta, M)  # k_D [m, c]
