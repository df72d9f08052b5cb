"""MoMA-GP-UCB: epochs of k plays, median of k least-squares estimates. ``moma-gp-ucb``, ``ldp-moma-gp-ucb``.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (AAAI 2021), Algorithm 3 (MoMA-GP-UCB),
Theorem 4 and Corollary 1 (LDP-MoMA-GP-UCB); Nystrom features by Algorithm 4 (``shared.bo.nystrom``).
For epochs n = 1..N, N = floor(T / k)::

    x_n = argmax_x mu~_{n-1}(x) + beta_n sigma~_{n-1}(x)                     (Alg. 3 line 5)
    play x_n k times: y_{n,1..k}  (one round of k requests for the same row)   (line 6)
    phi~_n = NystromEmbedding({(x_i, sigma~_{n-1}(x_i))}_{i<=n}, q), m_n = dim  (lines 7-8)
    V~_n = Phi~_n^T Phi~_n + lambda I,  Phi~_n [n, m_n] rows phi~_n(x_i)        (line 9)
    Theta [m_n, k]: theta~_{n,j} = V~_n^{-1} sum_i y_{i,j} phi~_n(x_i) = (V~^{-1} Phi~^T Y)_j     (line 10)
    r_j = median_{s != j} |theta~_{n,j} - theta~_{n,s}|_{V~_n}                  (line 11)
    k* = argmin_j r_j (first);  mu~_n = phi~_n^T theta~_{n,k*}                  (lines 12-13)
    sigma~_n^2(x) = k(x,x) - phi~_n(x)^T phi~_n(x) + lambda phi~_n(x)^T V~_n^{-1} phi~_n(x)   (line 14)

    k         = ceil(24 ln(4 e T / delta))       (line 3; ``k`` param overrides; T = the study budget)
    beta_{n+1} = B (1 + 1/sqrt(1 - eps_ny))
                 + (3/sqrt lambda) (9 m_n c)^{1/(1+alpha)} n^{(1-alpha)/(2(1+alpha))}
              (Theorem 4; the 1/sqrt(lambda) of its proof, eq. (10), is kept -- it is 1 at the default lambda)
    LDP (Corollary 1): alpha = 1, c = R^2 + 8 (B + R)^2 / epsilon^2; heavy-tailed: c = the ``c`` param
    (bound on E|eta|^{1+alpha} of the noise), defaulting to v.

Efficiency (measured for issue 14, LDP SE setting of ``pobo bench ldp``, eps = 1): mu~ comes from ONE of the
k estimates, each built from one answer per epoch, i.e. from 1/k of the answers. Against Laplace noise (all
moments finite) the median selection recovers little of that: at the design of a T = 1000 run its RMS error
at the played rows is 1.7x (k = 5) / 2.2x (k = 15) that of the mean of the k estimates. This, not a deviation
from Algorithm 3 (checked line by line; ``test_moma_update_is_algorithm_3_from_scratch``), is why LDP-MoMA
does not beat LDP-TGP/ATA there; it pays off against heavier tails (Student-t, the non-private setting).

The k distances come from one Gram matrix ``G = Theta^T V Theta``:
``|theta_j - theta_s|_V^2 = G_jj + G_ss - 2 G_js``.

Budget: the study must allow at least one full epoch (``initial_state`` refuses budget < k). When fewer than
k queries are left, the last epoch plays the chosen row ``queries_left`` times (k' < k): only the k' columns
observed in every epoch enter the median of means (Theta has k' columns; k' = 1 is a plain least-squares
estimate). No value is imputed. A short epoch ends the study: ``plan`` refuses to start another.

Cost per epoch (u distinct rows among the n epochs, m = m_n): features and sigma~ at every candidate
O(N_cand m (m + r)), V~ and its Cholesky O(u m^2 + m^3), the k LSEs O(n m k + m^2 k), distances O(k^2 m).
A rebuild replays the epochs evaluating the posterior only at the played rows, and at every row for the last.

Backend: under ``backend: dask`` the posterior over the n candidates lives on the cluster's partitions
(``shared.bo.dask_nystrom``): every epoch this process forms the dictionary, its embedding and the O(m^2)
factors of the approximate posterior as above, and each partition forms its range of mu~ and sigma~ from
them (``common.approximate_posterior``'s per-column operations), answering with its first UCB maximum;
the variance at the played rows (the next dictionary's weights) is read from the partitions. Same choices
and request details bit for bit as the local backend with BLAS on one thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator
from scipy.linalg import cho_factor, cho_solve, solve_triangular

from shared.bo.acquisition import UCB
from shared.bo.dask_nystrom import RemoteUCB, nystrom_posterior
from shared.bo.nystrom import NystromEmbedding, sample_dictionary
from shared.bo.strategies.base import Answer, RowRequest, StrategyParams, register
from shared.bo.strategies.heavy_tailed.common import (
    HeavyTailedParams,
    HeavyTailedStrategy,
    LDPParams,
    NystromParams,
    Tails,
    approximate_posterior,
    default_q,
    dictionary_features,
    nystrom_rng,
)
from shared.errors import InputDataError, StrategyError

__all__ = [
    "LDPMoMAGPUCBStrategy",
    "LDPMoMAParams",
    "MoMAGPUCBStrategy",
    "MoMAParams",
    "K_DEFAULT",
    "default_k",
    "median_of_means",
    "moma_beta",
]

FloatArray = npt.NDArray[np.float64]


def default_k(T: int, delta: float) -> int:
    """``k = ceil(24 ln(4 e T / delta))`` (Alg. 3 line 3, Theorem 4)."""
    return int(math.ceil(24.0 * math.log(4.0 * math.e * max(int(T), 1) / delta)))


def moma_beta(tails: Tails, n: int, m: int, *, lam: float, nystrom_eps: float, multiplier: float) -> float:
    """beta_{n+1} from m_n after n epochs (Theorem 4 / Corollary 1), times ``multiplier``."""
    a = tails.alpha
    head = tails.B * (1.0 + 1.0 / math.sqrt(1.0 - nystrom_eps))
    gamma = (9.0 * m * tails.c) ** (1.0 / (1.0 + a)) * float(n) ** ((1.0 - a) / (2.0 * (1.0 + a)))
    return float(multiplier * (head + 3.0 * gamma / math.sqrt(lam)))


def median_of_means(Theta: FloatArray, V: FloatArray) -> tuple[int, FloatArray]:
    """k* and r [k] (Alg. 3 lines 11-12): r_j = median_{s != j} |theta_j - theta_s|_V; k* = first argmin.

    ``Theta`` [m, k] holds the k estimates as columns; with k = 1, r = [0] and k* = 0.
    """
    Theta = np.asarray(Theta, dtype=np.float64)
    k = Theta.shape[1]
    if k == 1:
        return 0, np.zeros(1)
    G = Theta.T @ np.asarray(V, dtype=np.float64) @ Theta
    d = np.diag(G)
    dist = np.sqrt(np.maximum(d[:, None] + d[None, :] - 2.0 * G, 0.0))
    off = dist[~np.eye(k, dtype=bool)].reshape(k, k - 1)
    r: FloatArray = np.median(off, axis=1)
    return int(np.argmin(r)), r


#: MoMA's default k (both variants), chosen by the rule of ``pobo bench strategies`` (docs/strategies.md).
K_DEFAULT = 5


class _MoMAFields(StrategyParams):
    k: Annotated[int, Field(ge=1, le=100_000)] | Literal["theory"] = Field(
        default=K_DEFAULT,
        description="Plays per epoch. \"theory\" = the paper's ceil(24 ln(4 e T / delta)) (Theorem 4's, with "
        "its regret bound: 240 at T = 100, 295 at T = 1000, so a few epochs in a study of a few hundred "
        "queries); the default is the practical value chosen by pobo bench strategies (docs/strategies.md).",
    )

    @field_validator("k", mode="before")
    @classmethod
    def _null_is_the_papers(cls, value: object) -> object:
        """Studies created before k had a practical default stored ``"k": null`` for the paper's formula."""
        return "theory" if value is None else value

    max_plays_per_row: int | None = Field(
        default=None,
        ge=1,
        le=10**9,
        description="Never choose a row whose plays would pass this many (a curator grant's per-person cap: "
        "floor(max_epsilon_per_row / charged_epsilon)); null = no limit. The modeler fills it from the "
        "grant when a study is created.",
    )


class MoMAParams(HeavyTailedParams, NystromParams, _MoMAFields):
    """Parameters of ``moma-gp-ucb``: B, v, alpha, c, k, the Nystrom fields and the common fields."""

    c: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Bound on E|noise|^(1+alpha); null = v."
    )


class LDPMoMAParams(LDPParams, NystromParams, _MoMAFields):
    """Parameters of ``ldp-moma-gp-ucb``: epsilon, B, R, k, the Nystrom fields and the common fields."""


@register
class MoMAGPUCBStrategy(HeavyTailedStrategy[MoMAParams | LDPMoMAParams]):
    """``moma-gp-ucb``: each round is an epoch of k plays of one row (see the module docstring)."""

    name: ClassVar[str] = "moma-gp-ucb"
    description: ClassVar[str] = (
        "MoMA-GP-UCB for heavy-tailed payoffs (Zhou & Tan, AAAI 2021, Algorithm 3): epochs of k plays of the "
        "UCB row (one round of k requests), Nystrom features refreshed per epoch, k least-squares estimates "
        'and the median-of-means choice among them. k = "theory" is the paper\'s ceil(24 ln(4eT/delta)).'
    )
    Params: ClassVar[type[StrategyParams]] = MoMAParams
    rng_tag: ClassVar[int] = 2

    @classmethod
    def resolve_k(cls, params: MoMAParams | LDPMoMAParams, budget: int) -> int:
        """k: the ``k`` parameter, or the paper's ceil(24 ln(4 e T / delta)) for "theory"."""
        k = params.k
        return int(k) if k != "theory" else default_k(budget, float(params.delta))

    @classmethod
    def fresh_plays_per_row(cls, params: MoMAParams | LDPMoMAParams, *, budget: int) -> int:
        """k: each epoch asks for k fresh noisy answers of the same row."""
        return cls.resolve_k(params, budget)

    @classmethod
    def initial_state(
        cls, params: MoMAParams | LDPMoMAParams, *, n: int, budget: int, rng: np.random.Generator
    ) -> dict[str, Any]:
        k = cls.resolve_k(params, budget)
        if budget < k:
            source = (
                f"the paper's ceil(24 ln(4 e T / delta)) for T = {budget}"
                if params.k == "theory"
                else "strategy_params.k"
            )
            raise InputDataError(
                f"{cls.name} plays each chosen row k = {k} times per epoch ({source}), more than the study's "
                f"budget of {budget} queries: set strategy_params.k to at most {budget} (e.g. "
                f"{max(1, budget // 10)}) or raise the study's iterations to at least {k}"
            )
        state = super().initial_state(params, n=n, budget=budget, rng=rng)
        state["k"] = k
        return state

    def __init__(
        self, Z: npt.ArrayLike, params: MoMAParams | LDPMoMAParams, state: Mapping[str, Any]
    ) -> None:
        super().__init__(Z, params, state)
        self.k = int(self.state.get("k", self.resolve_k(params, self.T)))
        self.q = float(params.q) if params.q is not None else default_q(self.T, params.nystrom_eps)
        self.epochs: list[int] = []  # x_n, one row per epoch
        self.Y: list[FloatArray] = []  # y_{n, 1..k} (k' < k for a short last epoch)
        self.m = 0
        self.emb: NystromEmbedding | None = None
        self.theta: FloatArray = np.zeros(0)
        self.root_inv: FloatArray = np.zeros((0, 0))  # L^{-1}, V~ = L L^T
        self.Theta: FloatArray = np.zeros((0, 0))  # the k' least-squares estimates [m, k']
        self.kstar = 0
        self.r: FloatArray = np.zeros(0)
        # the posterior at every row: here, or on the dask backend's partitions (``shared.bo.dask_nystrom``)
        self.remote = nystrom_posterior(self.Z, self.kernel)
        self.mean: FloatArray = np.zeros(self.n if self.remote is None else 0)
        self.var: FloatArray = np.ones(self.n if self.remote is None else 0)

    def beta(self) -> float:
        p = self.params
        return moma_beta(
            self.tails, len(self.epochs), self.m, lam=p.lam, nystrom_eps=p.nystrom_eps,
            multiplier=p.beta_multiplier,
        )  # fmt: skip

    def posterior_mean(self, index: int) -> float | None:
        if self.remote is not None:
            return self.remote.mean_at(int(index))
        return float(self.mean[int(index)])

    def plan(self, *, budget: int, rng: np.random.Generator) -> list[RowRequest]:
        if budget < 1:
            raise InputDataError(f"budget must be >= 1, got {budget}")
        if self.Y and len(self.Y[-1]) < self.k:
            raise StrategyError(
                f"the last epoch was short ({len(self.Y[-1])} < k = {self.k} plays): it ends the study"
            )
        epoch = len(self.epochs) + 1
        beta = self.beta()
        blocked = self.blocked(self.epochs)
        ucb: UCB | RemoteUCB
        if self.remote is None:
            ucb = UCB.of(self.mean, np.sqrt(self.var), beta, scale=beta)  # Alg. 3 line 5
        else:
            ucb = self.remote.ucb(beta, scale=beta, unavailable=blocked)
        plays = min(self.k, int(budget))
        cap = self.params.max_plays_per_row
        if cap is not None and self.epochs:
            played = np.bincount(np.asarray(self.epochs), weights=[len(y) for y in self.Y], minlength=self.n)
            ucb.exclude(played + plays > cap)
            if not (ucb.any_finite() if isinstance(ucb, RemoteUCB) else np.isfinite(ucb.values).any()):
                raise StrategyError(
                    f"every row has been played {cap} times (max_plays_per_row, the grant's per-person cap): "
                    "no row can take another epoch"
                )
        index, source = ucb.choose(self.initial, epoch - 1, self.name, unavailable=blocked)
        base = ucb.details(
            index,
            source=source,
            t=sum(len(y) for y in self.Y) + 1,
            epoch=epoch,
            k=self.k,
            plays=plays,
            m=self.m,
            q=self.q,
            lengthscale=self.kernel.lengthscale,
        )
        return [RowRequest(index, {**base, "play": j}) for j in range(plays)]

    def _update(self, cols: npt.NDArray[np.int64] | None) -> None:
        """Alg. 3 lines 7-14 after epoch n; posterior at ``cols`` (None = every row)."""
        n, lam = len(self.epochs), self.params.lam
        x = np.asarray(self.epochs, dtype=np.int64)
        rows, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
        var_rows = self.var[rows] if self.remote is None else self.remote.var_at(rows)
        keep = sample_dictionary(var_rows, self.q, nystrom_rng(self.seed, n, self.rng_tag))
        atoms = rows[keep]
        self.m = int(atoms.size)
        width = min(len(y) for y in self.Y)  # the columns observed in every epoch
        Ymat = np.stack([y[:width] for y in self.Y])  # [n, k']
        if self.m == 0:
            self.emb, self.theta, self.root_inv = None, np.zeros(0), np.zeros((0, 0))
            self.Theta = np.zeros((0, width))
            self.kstar, self.r = 0, np.zeros(width)
        else:
            self.emb, phi_rows = dictionary_features(self.kernel, atoms, rows)  # [m, u]
            V = (phi_rows * counts) @ phi_rows.T + lam * np.eye(self.m)
            chol = cho_factor(V, lower=True, check_finite=False)
            sums = np.zeros((rows.size, width))
            np.add.at(sums, inverse, Ymat)  # sum of y_{i,j} over the epochs that played each row
            self.Theta = cho_solve(chol, phi_rows @ sums, check_finite=False)  # [m, k']: V^{-1} Phi^T Y
            self.kstar, self.r = median_of_means(self.Theta, V)
            self.theta = self.Theta[:, self.kstar]
            L = np.tril(chol[0])
            self.root_inv = solve_triangular(L, np.eye(self.m), lower=True, check_finite=False)
        if self.remote is not None and cols is None:
            self.remote.update(self.emb, self.theta, self.root_inv, lam)
            return
        mean, var = approximate_posterior(self.kernel, self.emb, self.theta, self.root_inv, lam, cols)
        if self.remote is not None and cols is not None:
            self.remote.set_columns(cols, mean, var)
        elif cols is None:
            self.mean, self.var = mean, var
        else:
            self.mean[cols], self.var[cols] = mean, var

    def _add_epoch(self, answers: Sequence[Answer]) -> None:
        idx, y = self._check(answers)
        if idx.size == 0:
            raise InputDataError("an epoch needs at least one answer")
        if idx.size > self.k or np.any(idx != idx[0]):
            raise InputDataError(
                f"an epoch is 1 to k = {self.k} answers for one same row, got rows {idx.tolist()}"
            )
        if self.Y and len(self.Y[-1]) < self.k:
            raise InputDataError("a short epoch (fewer than k plays) can only be the last one")
        self.epochs.append(int(idx[0]))
        self.Y.append(y)

    def observe(self, answers: Sequence[Answer]) -> None:
        self._add_epoch(answers)
        self._update(None)

    def replay(self, rounds: Sequence[Sequence[Answer]]) -> None:
        """Epoch by epoch, with the posterior evaluated only at the played rows until the last epoch."""
        played = np.unique(np.array([int(a.request.index) for r in rounds for a in r], dtype=np.int64))
        for e, answers in enumerate(rounds):
            self._add_epoch(answers)
            self._update(None if e == len(rounds) - 1 else played)


@register
class LDPMoMAGPUCBStrategy(MoMAGPUCBStrategy):
    """``ldp-moma-gp-ucb``: MoMA-GP-UCB with c from (epsilon, B, R) (Zhou & Tan 2021, Corollary 1)."""

    name: ClassVar[str] = "ldp-moma-gp-ucb"
    description: ClassVar[str] = (
        "LDP-MoMA-GP-UCB (Zhou & Tan, AAAI 2021, Algorithm 3, Corollary 1) for answers privatised by the "
        "curator's Laplace mechanism CTL(epsilon): epochs of k plays of the UCB row (one round of k "
        "requests), Nystrom features per epoch, median of k least-squares estimates; "
        "c = R^2 + 8(B+R)^2/epsilon^2."
    )
    Params: ClassVar[type[StrategyParams]] = LDPMoMAParams
