"""GP-BUCB: batch GP-UCB over the rows of a released Z (registry strategy ``gp-bucb``).

Desautels, Krause & Burdick, "Parallelizing Exploration-Exploitation Tradeoffs in Gaussian Process Bandit
Optimization", JMLR 15 (2014), Algorithm 1 (GP-BUCB). A round chooses B = ``batch_size`` rows one after
another, before any of their outcomes is known::

    for j = 0..B-1 (t = observations + j + 1, the number of the query being chosen):
        i_t = argmax_i  mu_fb(z_i) + beta_t^{1/2} sigma_{t-1}(z_i)

- ``mu_fb`` is the posterior mean of the last *feedback*: conditioned on the outcomes observed so far only;
  it does not move within a round.
- ``sigma_{t-1}`` is the posterior std conditioned on the observed rows *and* on the rows already chosen in
  this round ("hallucinated" observations): a GP's posterior variance depends on where it observed, not on
  what it observed (GPML eq. 2.26), so it can be updated before the outcomes arrive.

Hallucinated variance, without refactorising K: with ``c_p(z)`` the covariance of f(z) and f(z_p) given the
observations and the rows chosen before p in this round, conditioning on a noisy observation at z_p is the
rank-one downdate ``var(z) <- var(z) - c_p(z)^2 / (var(z_p) + noise)``. Writing ``b_p = c_p / sqrt(var(z_p) +
noise)`` (one more row of the incremental Cholesky factor A of ``shared.bo.gp``),
``c_p = k_t(Z, z_p) - sum_{q<p} b_q(z_p) b_q`` where ``k_t(Z, z_p) = k(Z, z_p) - A^T A[:, p]`` comes from the
stored factor (``GaussianProcess.covariance_rows``). A round costs O(n B (t + r + B)).

beta_t. Theorem 1 of the paper: if the information a batch's pending rows carry about f is bounded,
``max I(f; y_pending | y_fb) <= C``, then GP-BUCB with ``beta_t = exp(2C) alpha_t`` keeps GP-UCB's regret
bound up to the constant exp(C), where for a finite D (|D| = n rows) ``alpha_t = 2 ln(|D| t^2 pi^2 / (6
delta))`` (Srinivas et al. 2010, Thm. 1; PO-GP-UCB Alg. 2 line 3). The theorem evaluates alpha at the index
of the last feedback plus one; alpha is increasing in t, so evaluating it at the query's own index t (as here)
only enlarges beta_t and keeps the guarantee, and a batch of one is exactly GP-UCB.

``beta_multiplier`` is exp(2C), default 1 (plain GP-UCB beta_t). Why not the theorem's C: without an
initialisation the only bound is C <= (B-1)/2 ln(1 + s2/noise) (each hallucinated observation carries at
most that many nats), i.e. exp(2C) <= (1 + s2/noise)^(B-1) -- 10^20 for B = 5 and noise = 1e-5 s2 -- which
makes the rule pure uncertainty sampling; the paper's batch-size-independent bounds need an
uncertainty-sampling initialisation of T_init rows, and its experiments, like most implementations, use the
plain GP-UCB beta_t. GP-UCB's own theoretical beta_t is already conservative in practice; the hallucinated
variance alone spreads a batch. Set ``beta_multiplier`` > 1 to inflate it as the theorem prescribes.

Initial rows: the study's random initial rows (``initial_rows``, drawn once at creation) are queried first,
in rounds of up to ``batch_size``; a round that holds the last of them is filled up with GP-BUCB rows,
conditioned on the pending initial rows like any other chosen row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from pydantic import Field

from shared.bo.acquisition import UCB, ucb_details
from shared.bo.gp import GaussianProcess
from shared.bo.strategies.base import RowRequest, StrategyParams, register
from shared.bo.strategies.gp_ucb import GPUCB, GPUCBParams, GPUCBStrategy, gp_ucb_beta
from shared.errors import InputDataError, StrategyError

__all__ = ["GPBUCBParams", "GPBUCBStrategy", "HallucinatedVariance", "gp_bucb_beta"]


def gp_bucb_beta(n: int, t: int, delta_prime: float, multiplier: float = 1.0) -> float:
    """``beta_t = exp(2C) 2 ln(|D| t^2 pi^2 / (6 delta))`` with ``multiplier = exp(2C)`` (Desautels et al.
    2014, Theorem 1, finite D)."""
    if not (math.isfinite(multiplier) and multiplier >= 1.0):
        raise InputDataError(f"beta_multiplier (exp(2C)) must be a finite number >= 1, got {multiplier!r}")
    return multiplier * gp_ucb_beta(n, t, delta_prime)


class HallucinatedVariance:
    """The GP's posterior variance conditioned, in addition, on pending rows whose outcomes are unknown.

    Each ``add(j)`` is one rank-one downdate (GP-BUCB's hallucinated observation at row j, Desautels et al.
    2014, Alg. 1): O(n (t + r + pending)), from the GP's stored factor; the GP itself is not changed. For a
    GP in this process; on the dask backend the same state lives on the partitions
    (``shared.bo.hallucinated``, ``GPBUCBStrategy._plan_on_partitions``).
    """

    def __init__(self, gp: GaussianProcess, capacity: int) -> None:
        self.gp = gp
        self.var = gp.variance()  # [n], a copy
        self.noise = float(gp.hp.noise_variance + gp.jitter)  # the diagonal term of K, as in gp.add
        self._B = np.empty((max(1, capacity), gp.n))  # rows b_p = c_p / sqrt(var_p + noise)
        self.pending: list[int] = []

    def std(self) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = np.sqrt(np.maximum(self.var, 0.0))
        return out

    def covariance_row(self, j: int) -> npt.NDArray[np.float64]:
        """``c_j(z)`` [n]: the covariance of f(z) and f(z_j) given the observations and the pending rows."""
        c: npt.NDArray[np.float64] = self.gp.covariance_rows([j])[0]
        k = len(self.pending)
        if k:
            B = self._B[:k]
            c -= B[:, j] @ B
        return c

    def add(self, j: int) -> None:
        """Condition on a hallucinated noisy observation at j: ``var <- var - c_j^2 / (var_j + noise)``."""
        k = len(self.pending)
        if k == self._B.shape[0]:
            self._B = np.vstack([self._B, np.empty_like(self._B)])
        c = self.covariance_row(j)
        b = c / math.sqrt(max(float(self.var[j]), 0.0) + self.noise)
        self._B[k] = b
        self.var -= b * b
        self.pending.append(int(j))


class GPBUCBParams(GPUCBParams):
    """Parameters of ``gp-bucb`` (Desautels et al. 2014, Algorithm 1): those of ``gp-ucb`` and the batch."""

    batch_size: int = Field(
        default=5, ge=1, le=1000, description="Rows chosen per round (B); at most the queries left."
    )
    beta_multiplier: float = Field(
        default=1.0,
        ge=1.0,
        allow_inf_nan=False,
        description="exp(2C): inflation of GP-UCB's beta_t (Theorem 1). 1 = the plain GP-UCB beta_t.",
    )


@register
class GPBUCBStrategy(GPUCBStrategy[GPBUCBParams]):
    """``gp-bucb``: rounds of ``batch_size`` rows, GP-UCB with hallucinated variance (see the module)."""

    name: ClassVar[str] = "gp-bucb"
    description: ClassVar[str] = (
        "Batch GP-UCB, GP-BUCB (Desautels, Krause & Burdick, JMLR 2014, Algorithm 1): each round chooses "
        "`batch_size` rows one after another at the argmax of mu(z) + beta_t^(1/2) sigma(z), where the mean "
        "is that of the outcomes observed so far and the variance is also conditioned on the rows already "
        "chosen in the round (hallucinated observations). beta_t = beta_multiplier * beta_scale * 2 ln(n t^2 "
        "pi^2 / (6 delta')) (Theorem 1 at beta_scale 1, beta_multiplier = exp(2C)). Random initial rows "
        "first; hyper-parameters fixed or refitted by maximum likelihood on a schedule."
    )
    Params: ClassVar[type[StrategyParams]] = GPBUCBParams

    def __init__(self, Z: npt.ArrayLike, params: GPBUCBParams, state: Mapping[str, Any]) -> None:
        if not isinstance(params, GPBUCBParams):  # (gp-ucb's parameters lack the batch)
            raise InputDataError(f"gp-bucb needs GPBUCBParams, got {type(params).__name__}")
        super().__init__(Z, params, state)

    def make_engine(self, params: GPBUCBParams) -> GPUCB:
        """GP-UCB's engine, its GP on the process's backend (``shared.bo.backend``). On the dask backend a
        round's hallucinated variance lives on the GP's partitions too (``plan``)."""
        return GPUCB(self.Z, **params.engine_options())

    def plan(self, *, budget: int, rng: np.random.Generator) -> list[RowRequest]:
        """One round of Algorithm 1: ``min(batch_size, budget)`` distinct rows (fewer when rows run out)."""
        if budget < 1:
            raise InputDataError(f"budget must be >= 1, got {budget}")
        engine, params = self.engine, self.params
        gp = engine.gp
        size = min(params.batch_size, int(budget))
        t0 = gp.t  # observations so far (the last feedback)
        if getattr(gp, "hallucinated_round", None) is not None:  # a distributed GP
            return self._plan_on_partitions(gp, size, t0)
        mean = gp.mean()  # mu_fb: fixed for the whole round
        hallucinated = HallucinatedVariance(gp, size)
        excluded = self._excluded()
        hp = engine.hyperparameters.as_dict()
        requests: list[RowRequest] = []
        for j in range(size):
            t = t0 + j + 1
            beta = params.beta_scale * gp_bucb_beta(self.n, t, params.delta_prime, params.beta_multiplier)
            ucb = UCB.of(mean, hallucinated.std(), beta, scale=math.sqrt(beta))
            ucb.exclude(excluded)
            index, source = ucb.choose(self.initial, t - 1, "gp-bucb")  # first maximum: ties -> smallest
            if source == "initial" and excluded[index]:  # an initial row the grant cannot answer: skipped
                index, source = ucb.argmax(), "gp-bucb"
            if source != "initial" and not np.isfinite(ucb.values[index]):
                if j == 0:
                    raise StrategyError(
                        f"every one of the {self.n} candidates has been queried already or is excluded"
                    )
                break  # fewer rows left than the batch: a shorter round
            details = ucb.details(
                index, source=source, hyperparameters=hp, position=j, batch_size=params.batch_size
            )
            requests.append(RowRequest(index, details))
            excluded[index] = True  # never twice in one round, even with exclude_queried = False
            if j + 1 < size:
                hallucinated.add(index)
        return requests

    def _excluded(self) -> npt.NDArray[np.bool_]:
        """[n] the rows a round never chooses: the queried ones (``exclude_queried``) and the unavailable."""
        engine = self.engine
        excluded = engine.queried if engine.exclude_queried else np.zeros(self.n, dtype=bool)
        if self.unavailable is not None:
            excluded |= self.unavailable
        return excluded

    def _plan_on_partitions(self, gp: Any, size: int, t0: int) -> list[RowRequest]:
        """``plan``'s round on a distributed GP (``shared.bo.dask_gp.DaskGP.hallucinated_round``): the
        feedback mean and the hallucinated variance stay on the partitions (``shared.bo.hallucinated``), each
        choice is the first of their first maxima and each hallucinated row sends them O(t + r + B) numbers;
        the same rows, values, means and stds as the local round bit for bit, gathering no n-vector."""
        params = self.params
        excluded = self._excluded()
        hp = self.engine.hyperparameters.as_dict()
        hallucinated = gp.hallucinated_round(excluded, size)
        requests: list[RowRequest] = []
        for j in range(size):
            t = t0 + j + 1
            beta = params.beta_scale * gp_bucb_beta(self.n, t, params.delta_prime, params.beta_multiplier)
            scale = math.sqrt(beta)
            play = t - 1
            if play < len(self.initial) and not excluded[int(self.initial[play])]:
                index, source = int(self.initial[play]), "initial"
                value = hallucinated.row(index, scale)["value"]
            else:  # ``UCB.choose`` then ``UCB.argmax`` (an initial row the grant cannot answer: skipped)
                index, value = hallucinated.best(scale)
                source = "gp-bucb"
                if not math.isfinite(value):
                    if j == 0:
                        raise StrategyError(
                            f"every one of the {self.n} candidates has been queried already or is excluded"
                        )
                    break
            row = hallucinated.row(index, scale)
            details = ucb_details(
                source=source,
                acquisition=value,
                beta=beta,
                mean=row["mean"],
                std=row["std"],
                hyperparameters=hp,
                position=j,
                batch_size=params.batch_size,
            )
            requests.append(RowRequest(index, details))
            excluded[index] = True
            if j + 1 < size:
                hallucinated.add(index, scale)
        return requests
