"""ATA-GP-UCB: Nystrom features + feature-adaptive truncation. Strategies ``ata-gp-ucb``, ``ldp-ata-gp-ucb``.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (AAAI 2021), Algorithm 1 (LDP-ATA-GP-UCB)
and Theorem 2; Chowdhury & Gopalan, "Bayesian Optimization under Heavy-tailed Payoffs" (NeurIPS 2019),
ATA-GP-UCB (Nystrom variant) and its Theorem 3. For t = 1, 2, ...::

    x_t   = argmax_x mu~_{t-1}(x) + beta_t sigma~_{t-1}(x)                            (Alg. 1 line 4)
    phi~_t = NystromEmbedding({(x_i, sigma~_{t-1}(x_i))}_{i<=t}, q), m_t = dim       (lines 6-7; Alg. 4)
    Phi~_t [t, m_t] rows phi~_t(x_tau);  V~_t = Phi~_t^T Phi~_t + lambda I             (line 8)
    u_i^T = row i of V~_t^{-1/2} Phi~_t^T [m_t, t]                                   (line 9)
    r^_i  = sum_tau u_{i,tau} y_tau 1{|u_{i,tau} y_tau| <= b_tau}                     (line 10)
    theta~_t = V~_t^{-1/2} r^;  mu~_t = phi~_t^T theta~_t                             (lines 11-12)
    sigma~_t^2(x) = k(x,x) - phi~_t(x)^T phi~_t(x) + lambda phi~_t(x)^T V~_t^{-1} phi~_t(x)   (line 13)

Parameters (Theorem 2 of Zhou & Tan for alpha = 1; Theorem 3 of Chowdhury & Gopalan in general)::

    b_t       = (v / ln(4 m_t T / delta))^{1/(1+alpha)} t^{(1-alpha)/(2(1+alpha))}
    beta_{t+1} = B (1 + 1/sqrt(1 - eps_ny)) + (4/sqrt lambda) sqrt(m_t) v^{1/(1+alpha)}
                 ln(4 m_t T / delta)^{alpha/(1+alpha)} t^{(1-alpha)/(2(1+alpha))}
    (alpha = 1: b_t = sqrt(v / ln(4 m_t T/delta)), beta_{t+1} = B(1 + 1/sqrt(1-eps))
    + 4 sqrt(ln(4 m_t T/delta) v m_t / lambda), as stated). LDP: v = B^2 + R^2 + 8 (B + R)^2 / epsilon^2,
    alpha = 1. ln(4 m T/delta) uses max(m, 1). q: ``common.default_q`` (ln T / eps_ny^2, the authors' code).

Implementation choices: the dictionary is resampled at every round from the *distinct* rows played so far
(as the authors' code; a row played several times is one candidate atom, which keeps K_D free of duplicate
atoms); b_tau is the level computed at round tau (with m_tau) and kept. The symmetric V^{-1/2} (eigh) is used,
the basis in which the paper's truncation is defined.

Cost per round, u distinct rows played, m = m_t: kernel block k(D, Z) O(n m r), features and sigma~ O(n m^2),
V~ and its eigendecomposition O(u m^2 + m^3), the truncation of the whole history O(t m) -- re-truncating
every past reward at every round is inherent to Algorithm 1 (Zhou & Tan, Sec. 4.2). A rebuild replays the
rounds evaluating the posterior only at the played rows (O(u m^2) per round), and at every row for the last.

Backend: under ``backend: dask`` the posterior over the n candidates lives on the cluster's partitions
(``shared.bo.dask_nystrom``): every round this process forms the dictionary, its embedding and the O(m^2)
factors of the approximate posterior as above, and each partition forms its range of mu~ and sigma~ from
them (``common.approximate_posterior``'s per-column operations), answering with its first UCB maximum;
the variance at the played rows (the next dictionary's weights) is read from the partitions. Same choices
and request details bit for bit as the local backend with BLAS on one thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

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

__all__ = [
    "ATAGPUCBStrategy",
    "ATAParams",
    "LDPATAGPUCBStrategy",
    "LDPATAParams",
    "ata_beta",
    "ata_truncation",
]

FloatArray = npt.NDArray[np.float64]


def _log_term(m: int, T: int, delta: float) -> float:
    return math.log(4.0 * max(int(m), 1) * max(int(T), 1) / delta)


def ata_truncation(tails: Tails, t: int, m: int, *, T: int, delta: float) -> float:
    """b_t = (v / ln(4 m_t T/delta))^{1/(1+alpha)} t^{(1-alpha)/(2(1+alpha))} (Theorem 2 / C&G Theorem 3)."""
    a = tails.alpha
    return float(
        (tails.v / _log_term(m, T, delta)) ** (1.0 / (1.0 + a)) * max(t, 1) ** ((1.0 - a) / (2.0 * (1.0 + a)))
    )


def ata_beta(
    tails: Tails, t: int, m: int, *, T: int, delta: float, lam: float, nystrom_eps: float, multiplier: float
) -> float:
    """beta_{t+1} from m_t and t (Theorem 2 / C&G Theorem 3), times ``multiplier``; t = 0 gives beta_1."""
    a = tails.alpha
    head = tails.B * (1.0 + 1.0 / math.sqrt(1.0 - nystrom_eps))
    tail = (
        4.0
        / math.sqrt(lam)
        * math.sqrt(m)
        * tails.v ** (1.0 / (1.0 + a))
        * _log_term(m, T, delta) ** (a / (1.0 + a))
        * float(t) ** ((1.0 - a) / (2.0 * (1.0 + a)))
    )
    return float(multiplier * (head + tail))


class ATAParams(HeavyTailedParams, NystromParams):
    """Parameters of ``ata-gp-ucb``: B, v, alpha, the Nystrom fields and the common fields."""


class LDPATAParams(LDPParams, NystromParams):
    """Parameters of ``ldp-ata-gp-ucb``: epsilon, B, R, the Nystrom fields and the common fields."""


@register
class ATAGPUCBStrategy(HeavyTailedStrategy[ATAParams | LDPATAParams]):
    """``ata-gp-ucb``: one row per round; Nystrom features resampled, all rewards re-truncated, each round."""

    name: ClassVar[str] = "ata-gp-ucb"
    description: ClassVar[str] = (
        "ATA-GP-UCB for heavy-tailed payoffs (Chowdhury & Gopalan, NeurIPS 2019): Nystrom features with "
        "posterior-variance dictionary sampling, resampled every round, and feature-adaptive truncation of "
        "all rewards; UCB mu + beta_t sigma. E|y|^(1+alpha) <= v."
    )
    Params: ClassVar[type[StrategyParams]] = ATAParams
    rng_tag: ClassVar[int] = 1

    def __init__(self, Z: npt.ArrayLike, params: ATAParams | LDPATAParams, state: Mapping[str, Any]) -> None:
        super().__init__(Z, params, state)
        self.q = float(params.q) if params.q is not None else default_q(self.T, params.nystrom_eps)
        self._idx: list[int] = []
        self._y: list[float] = []
        self._b: list[float] = []  # b_tau, as computed at round tau
        self.m = 0
        self.emb: NystromEmbedding | None = None
        self.theta: FloatArray = np.zeros(0)
        self.root_inv: FloatArray = np.zeros((0, 0))  # V~^{-1/2}
        self.truncated = 0  # rewards-times-coordinates zeroed at the last update
        # the posterior at every row: here, or on the dask backend's partitions (``shared.bo.dask_nystrom``)
        self.remote = nystrom_posterior(self.Z, self.kernel)
        self.mean: FloatArray = np.zeros(self.n if self.remote is None else 0)
        self.var: FloatArray = np.ones(self.n if self.remote is None else 0)

    @property
    def t(self) -> int:
        return len(self._y)

    def beta(self) -> float:
        p = self.params
        return ata_beta(
            self.tails, self.t, self.m, T=self.T, delta=p.delta, lam=p.lam,
            nystrom_eps=p.nystrom_eps, multiplier=p.beta_multiplier,
        )  # fmt: skip

    def posterior_mean(self, index: int) -> float | None:
        if self.remote is not None:
            return self.remote.mean_at(int(index))
        return float(self.mean[int(index)])

    def plan(self, *, budget: int, rng: np.random.Generator) -> list[RowRequest]:
        t = self.t + 1
        beta = self.beta()
        blocked = self.blocked(self._idx)
        ucb: UCB | RemoteUCB
        if self.remote is None:
            ucb = UCB.of(self.mean, np.sqrt(self.var), beta, scale=beta)  # Alg. 1 line 4
        else:
            ucb = self.remote.ucb(beta, scale=beta, unavailable=blocked)
        index, source = ucb.choose(self.initial, t - 1, self.name, unavailable=blocked)
        details = ucb.details(
            index,
            source=source,
            t=t,
            m=self.m,
            b_prev=self._b[-1] if self._b else None,
            q=self.q,
            lengthscale=self.kernel.lengthscale,
        )
        return [RowRequest(index, details)]

    def _update(self, cols: npt.NDArray[np.int64] | None) -> None:
        """Alg. 1 lines 6-13 after play t; posterior at ``cols`` (None = every row)."""
        t, lam = self.t, self.params.lam
        idx = np.asarray(self._idx, dtype=np.int64)
        y = np.asarray(self._y, dtype=np.float64)
        rows, inverse, counts = np.unique(idx, return_inverse=True, return_counts=True)
        var_rows = self.var[rows] if self.remote is None else self.remote.var_at(rows)
        keep = sample_dictionary(var_rows, self.q, nystrom_rng(self.seed, t, self.rng_tag))
        atoms = rows[keep]
        self.m = int(atoms.size)
        self._b.append(ata_truncation(self.tails, t, self.m, T=self.T, delta=self.params.delta))
        if self.m == 0:
            self.emb, self.theta, self.root_inv, self.truncated = None, np.zeros(0), np.zeros((0, 0)), 0
        else:
            self.emb, phi_rows = dictionary_features(self.kernel, atoms, rows)  # [m, u]
            V = (phi_rows * counts) @ phi_rows.T + lam * np.eye(self.m)
            ev, E = np.linalg.eigh(V)
            self.root_inv = (E / np.sqrt(ev)) @ E.T
            U = (self.root_inv @ phi_rows)[:, inverse]  # rows u_i^T of V^{-1/2} Phi^T [m, t]
            w = U * y[None, :]
            kept = np.abs(w) <= np.asarray(self._b)[None, :]
            self.truncated = int(kept.size - np.count_nonzero(kept))
            self.theta = self.root_inv @ np.where(kept, w, 0.0).sum(axis=1)
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

    def observe(self, answers: Sequence[Answer]) -> None:
        idx, y = self._check(answers)
        for j, value in zip(idx.tolist(), y.tolist(), strict=True):
            self._idx.append(j)
            self._y.append(value)
            self._update(None)

    def replay(self, rounds: Sequence[Sequence[Answer]]) -> None:
        """Round by round, with the posterior evaluated only at the played rows until the last play."""
        checked = [self._check(answers) for answers in rounds]
        plays = [(j, v) for idx, y in checked for j, v in zip(idx.tolist(), y.tolist(), strict=True)]
        played = np.unique(np.array([j for j, _ in plays], dtype=np.int64))
        for p, (j, value) in enumerate(plays):
            self._idx.append(j)
            self._y.append(value)
            self._update(None if p == len(plays) - 1 else played)


@register
class LDPATAGPUCBStrategy(ATAGPUCBStrategy):
    """``ldp-ata-gp-ucb``: ATA-GP-UCB with v from (epsilon, B, R) (Zhou & Tan 2021, Alg. 1, Theorem 2)."""

    name: ClassVar[str] = "ldp-ata-gp-ucb"
    description: ClassVar[str] = (
        "LDP-ATA-GP-UCB (Zhou & Tan, AAAI 2021, Algorithm 1, Theorem 2) for answers privatised by the "
        "curator's Laplace mechanism CTL(epsilon): Nystrom features resampled every round, feature-adaptive "
        "truncation with b_t = sqrt(v / ln(4 m_t T/delta)), v = B^2 + R^2 + 8(B+R)^2/epsilon^2."
    )
    Params: ClassVar[type[StrategyParams]] = LDPATAParams
