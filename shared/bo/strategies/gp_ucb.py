"""GP-UCB over the rows of a released Z: the numeric engine (``GPUCB``) and the registry strategy ``gp-ucb``.

GP-UCB (Srinivas et al. 2010) as used by PO-GP-UCB, the modeler part (Kharkovskii et al. 2020, Alg. 2)::

    beta_t = 2 ln(n t^2 pi^2 / (6 delta'))                  (Alg. 2, line 3)
    i_t    = argmax_i  mu_t(z_i) + beta_t^{1/2} sigma_t(z_i)  (line 4; ties -> smallest index)

Here t is the number of the query being chosen (observations so far + 1). ``GPUCB`` is the engine (suggest
one index, observe one outcome), used as is by the benchmarks; ``GPUCBStrategy`` wraps it in the modeler's
round interface (``shared.bo.strategies.base``): random initial rows first, then one UCB row per round.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import numpy as np
import numpy.typing as npt
from pydantic import Field
from typing_extensions import TypeVar

from shared.bo.acquisition import ucb_details, ucb_value
from shared.bo.backend import make_gp
from shared.bo.gp import Hyperparameters, median_distance
from shared.bo.mle import fit_hyperparameters
from shared.bo.strategies.base import Answer, RowRequest, Strategy, StrategyParams, register
from shared.errors import InputDataError, StrategyError
from shared.privacy.ctl import CTL

__all__ = [
    "GPUCB",
    "FixedHyperparameters",
    "GPUCBParams",
    "GPUCBStrategy",
    "Suggestion",
    "default_refit_schedule",
    "gp_ucb_beta",
    "random_initial_indices",
]


@dataclass(frozen=True)
class Suggestion:
    """What a strategy proposes to query next, with the numbers that justify it (for the audit log)."""

    index: int
    acquisition: float
    beta: float
    mean: float
    std: float
    t: int


#: GP-UCB's (and GP-BUCB's) default ``beta_scale``, chosen by the rule of ``pobo bench strategies``.
BETA_SCALE_DEFAULT = 0.1


def gp_ucb_beta(n: int, t: int, delta_prime: float) -> float:
    """``beta_t = 2 ln(n t^2 pi^2 / (6 delta'))`` (PO-GP-UCB Alg. 2 line 3; Srinivas et al. Thm. 1)."""
    if n < 1 or t < 1:
        raise InputDataError(f"n and t must be >= 1, got n={n}, t={t}")
    if not 0.0 < delta_prime < 1.0:
        raise InputDataError(f"delta_prime must lie strictly between 0 and 1, got {delta_prime!r}")
    return 2.0 * math.log(n * t * t * math.pi**2 / (6.0 * delta_prime))


def default_refit_schedule(t: int) -> bool:
    """Refit the MLE hyper-parameters after observation t: t = 3..10, then every 5th (15, 20, ...)."""
    return t >= 3 and (t <= 10 or t % 5 == 0)


def random_initial_indices(n: int, k: int, rng: np.random.Generator) -> list[int]:
    """k distinct initial rows drawn uniformly (the modeler's random initialisation)."""
    if not 0 <= k <= n:
        raise InputDataError(f"initial points must be in [0, {n}], got {k}")
    return [int(i) for i in rng.choice(n, size=k, replace=False)]


class GPUCB:
    """GP-UCB over the rows of Z (PO-GP-UCB Alg. 2 when Z is a release; non-private GP-UCB on X).

    ``hyperparameters`` is fixed (``Hyperparameters``) or ``"mle"``: maximum likelihood on the observations,
    refitted when ``refit_schedule(t)`` is true (starting from the median pairwise distance of Z as
    lengthscale). ``exclude_queried`` (the service default) never suggests a row twice; the paper's
    benchmark allows repeats. ``prior_mean`` is ``"empirical"`` (mean of the observed y) or ``"zero"``.
    ``spill`` / ``spill_directory``: where the GP's factor goes when it does not fit in memory
    (``shared.bo.factor``); ``factor_dtype="float32"`` halves the bytes each step reads (not exact: see
    docs/performance.md for what it changes). ``distributable``: the GP may live on the process's Dask
    cluster (``shared.bo.backend``; False keeps it in this process).
    """

    def __init__(
        self,
        Z: npt.ArrayLike,
        *,
        delta_prime: float = 0.05,
        beta_scale: float = 1.0,
        hyperparameters: Hyperparameters | Literal["mle"] = "mle",
        exclude_queried: bool = True,
        prior_mean: Literal["zero", "empirical"] = "empirical",
        refit_schedule: Any = default_refit_schedule,
        spill: Literal["auto", "always", "never"] = "auto",
        spill_directory: str | Path | None = None,
        factor_dtype: Literal["float64", "float32"] = "float64",
        distributable: bool = True,
        noise_variance_floor: float | None = None,
    ) -> None:
        Z = np.ascontiguousarray(Z, dtype=np.float64)
        gp_ucb_beta(max(1, Z.shape[0] if Z.ndim == 2 else 1), 1, delta_prime)  # validates delta_prime
        self.delta_prime = float(delta_prime)
        if not (math.isfinite(beta_scale) and beta_scale > 0):
            raise InputDataError(f"beta_scale must be a finite number > 0, got {beta_scale!r}")
        self.beta_scale = float(beta_scale)
        self.mle = hyperparameters == "mle"
        self.distance_scale = median_distance(Z) if self.mle else 1.0
        if self.mle:
            hp = Hyperparameters(lengthscale=self.distance_scale, signal_variance=1.0, noise_variance=1e-2)
        elif isinstance(hyperparameters, Hyperparameters):
            hp = hyperparameters
        else:
            raise InputDataError(f'hyperparameters must be "mle" or Hyperparameters, got {hyperparameters!r}')
        self.gp = make_gp(
            Z,
            hp,
            distributable=distributable,
            prior_mean=prior_mean,
            spill=spill,
            spill_directory=spill_directory,
            factor_dtype=factor_dtype,
        )
        self.exclude_queried = exclude_queried
        self.refit_schedule = refit_schedule
        if noise_variance_floor is not None and not (
            math.isfinite(noise_variance_floor) and noise_variance_floor >= 0
        ):
            raise InputDataError(
                f"noise_variance_floor must be a finite number >= 0, got {noise_variance_floor!r}"
            )
        self.noise_variance_floor = noise_variance_floor
        self._queried = np.zeros(self.gp.n, dtype=bool)

    @property
    def n(self) -> int:
        return int(self.gp.n)

    @property
    def hyperparameters(self) -> Hyperparameters:
        return self.gp.hp

    @property
    def queried(self) -> npt.NDArray[np.bool_]:
        """[n] True for every row observed so far (a copy)."""
        return self._queried.copy()

    @property
    def observations(self) -> list[tuple[int, float]]:
        return [(int(i), float(y)) for i, y in zip(self.gp.indices, self.gp.y, strict=True)]

    def acquisition(
        self, out: npt.NDArray[np.float64] | None = None
    ) -> tuple[npt.NDArray[np.float64], float, int]:
        """UCB values [n] (queried rows at -inf when excluded; into ``out`` if given), beta_t and t."""
        t = self.gp.t + 1
        beta = self.beta(t)
        return self._exclude(self.gp.upper_confidence_bound(math.sqrt(beta), out=out)), beta, t

    def beta(self, t: int) -> float:
        """beta_t of the t-th observation: ``beta_scale`` times GP-UCB's (``gp_ucb_beta``)."""
        return self.beta_scale * gp_ucb_beta(self.n, t, self.delta_prime)

    def _exclude(
        self, ucb: npt.NDArray[np.float64], unavailable: npt.NDArray[np.bool_] | None = None
    ) -> npt.NDArray[np.float64]:
        if self.exclude_queried:
            ucb[self.gp.indices] = -np.inf  # the queried rows: t indices, not a mask over n
        if unavailable is not None:
            ucb[unavailable] = -np.inf
        return ucb

    def suggest(self, unavailable: npt.NDArray[np.bool_] | None = None) -> Suggestion:
        """The next row: the first UCB maximum among the rows neither queried (with ``exclude_queried``) nor
        ``unavailable`` [n]."""
        t = self.gp.t + 1
        beta = self.beta(t)
        excluded = self.gp.indices if self.exclude_queried else np.empty(0, dtype=np.int64)
        if unavailable is not None:
            excluded = np.concatenate([excluded, np.flatnonzero(unavailable)])
        # computed by the last observe's pass over n when no refit came after it (``observe``); the first
        # maximum: deterministic tie-breaking by smallest index
        i, value = self.gp.ucb_argmax(math.sqrt(beta), excluded)
        if not np.isfinite(value):
            why = "" if unavailable is None else " or is excluded under the study's grant"
            raise StrategyError(f"every one of the {self.n} candidates has been queried already{why}")
        mean, std = self.gp.posterior_at(i)
        return Suggestion(index=i, acquisition=value, beta=beta, mean=mean, std=std, t=t)

    def _fit(self, idx: npt.NDArray[np.int64], y: npt.NDArray[np.float64]) -> Hyperparameters:
        """The MLE on these observations alone, started from their own scale (never from the last fit:
        a chain of warm starts stays on the all-signal ridge its first fits land on, see
        ``fit_hyperparameters``), with the noise at least ``noise_variance_floor``."""
        centred = y - (y.mean() if self.gp.prior_mean == "empirical" else 0.0)
        rows = self.gp.rows(idx)  # Z[idx]: all the fit reads of Z (a distributed GP keeps them at hand)
        return fit_hyperparameters(
            rows,
            np.arange(idx.size),
            centred,
            distance_scale=self.distance_scale,
            noise_floor=self.noise_variance_floor,
        )

    def observe(self, index: int, y: float) -> None:
        """Condition on (index, y); unless a refit follows, the GP's update pass also computes the next
        ``suggest``'s UCB values (beta_{t+1}), so a step makes one pass over n after its BLAS work."""
        t = self.gp.t + 1  # observations after this one
        refit = self.mle and self.refit_schedule(t)
        scale = None if refit else math.sqrt(self.beta(t + 1))
        self.gp.add(index, y, ucb_scale=scale)
        self._queried[int(index)] = True
        if refit:
            self.gp.refit(self._fit(self.gp.indices, self.gp.y))

    @classmethod
    def from_history(
        cls, Z: npt.ArrayLike, observations: Iterable[tuple[int, float]], **options: Any
    ) -> Self:
        """Rebuild after a restart: the last scheduled refit (each is a function of its prefix of the
        observations alone), then one batch posterior."""
        strategy = cls(Z, **options)
        obs = list(observations)
        if not obs:
            return strategy
        idx = np.array([int(i) for i, _ in obs], dtype=np.int64)
        y = np.array([float(v) for _, v in obs])
        if np.any((idx < 0) | (idx >= strategy.n)):
            raise InputDataError(f"observation indices must be in [0, {strategy.n - 1}]")
        if not np.isfinite(y).all():  # the live path rejects these in GaussianProcess.add
            bad = int(np.flatnonzero(~np.isfinite(y))[0])
            raise InputDataError(f"y must be finite, got {float(y[bad])!r} in observation {bad}")
        hp = strategy.gp.hp
        if strategy.mle:
            last = max((t for t in range(1, len(obs) + 1) if strategy.refit_schedule(t)), default=0)
            if last:
                hp = strategy._fit(idx[:last], y[:last])
        strategy.gp.hp = hp
        strategy.gp._reset()
        strategy.gp._rebuild(idx, y)
        strategy._queried[idx] = True
        return strategy


# ------------------------------------------------------------------------------------ registry strategy


class FixedHyperparameters(StrategyParams):
    """Fixed squared-exponential kernel hyper-parameters (in the units of the released Z)."""

    lengthscale: float = Field(gt=0, allow_inf_nan=False, description="Kernel lengthscale l > 0.")
    signal_variance: float = Field(gt=0, allow_inf_nan=False, description="Signal variance s2 > 0.")
    noise_variance: float = Field(gt=0, allow_inf_nan=False, description="Observation noise variance > 0.")

    def engine_value(self) -> Hyperparameters:
        return Hyperparameters(
            lengthscale=self.lengthscale,
            signal_variance=self.signal_variance,
            noise_variance=self.noise_variance,
        )


class GPUCBParams(StrategyParams):
    """Parameters of ``gp-ucb`` (PO-GP-UCB, Alg. 2)."""

    delta_prime: float = Field(
        default=0.05, gt=0, lt=1, allow_inf_nan=False, description="GP-UCB confidence parameter delta'."
    )
    beta_scale: float = Field(
        default=BETA_SCALE_DEFAULT,
        gt=0,
        le=1e6,
        allow_inf_nan=False,
        description="Factor on beta_t = 2 ln(n t^2 pi^2 / (6 delta')). 1 = Srinivas et al.'s, the value "
        "with a regret bound, which keeps exploring for a few hundred queries; the default is the value "
        "chosen by the rule of pobo bench strategies (docs/strategies.md). Below 1: less exploration.",
    )
    hyperparameters: Literal["mle"] | FixedHyperparameters = Field(
        default="mle", description='"mle" (refitted by maximum likelihood on a schedule) or fixed values.'
    )
    initial_points: int = Field(
        default=1, ge=1, le=10_000, description="Random rows queried first (they count as queries)."
    )
    exclude_queried: bool = Field(default=True, description="Never choose a row twice.")
    noise_variance_floor: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description='With "mle": the least observation-noise variance the fit may choose. null = the '
        "variance of the curator's output noise when the grant has output privacy (2 x laplace_scale^2, "
        "laplace_scale = 2 (B + R) / epsilon; filled in and recorded when the study is created), else no "
        "floor. Answers through the output mechanism carry at least that noise; a fit that assumed less "
        "would chase it.",
    )

    def engine_options(self) -> dict[str, Any]:
        hp = self.hyperparameters
        return {
            "delta_prime": self.delta_prime,
            "beta_scale": self.beta_scale,
            "hyperparameters": "mle" if hp == "mle" else hp.engine_value(),
            "exclude_queried": self.exclude_queried,
            "noise_variance_floor": self.noise_variance_floor,
        }


def initial_rows(params: GPUCBParams, *, n: int, budget: int, rng: np.random.Generator) -> dict[str, Any]:
    """``initial_points`` distinct random rows (at most the budget), drawn once at the study's creation."""
    if params.initial_points > n:
        raise InputDataError(f"initial_points must be <= the release's n = {n}, got {params.initial_points}")
    return {"initial_indices": random_initial_indices(n, min(params.initial_points, budget), rng)}


def row_details(engine: GPUCB, index: int, *, source: str) -> dict[str, Any]:
    """The audit numbers of choosing ``index`` now: UCB value, beta_t, posterior mean/std, hyper-params.

    Computed at that one row (the UCB over all n is what ``suggest`` already did): the same arithmetic as
    ``engine.acquisition()[0][index]``, -inf for a queried row when queried rows are excluded."""
    beta = engine.beta(engine.gp.t + 1)
    mean, std = engine.gp.posterior_at(index)
    excluded = engine.exclude_queried and bool(engine._queried[int(index)])
    return ucb_details(
        source=source,
        acquisition=-math.inf if excluded else ucb_value(mean, std, math.sqrt(beta)),
        beta=beta,
        mean=mean,
        std=std,
        hyperparameters=engine.hyperparameters.as_dict(),
    )


#: The parameters of a GP-UCB strategy: ``GPUCBParams`` (``gp-ucb``) or an extension (``gp-bucb``'s).
UCBParamsT = TypeVar("UCBParamsT", bound=GPUCBParams, default=GPUCBParams)


@register
class GPUCBStrategy(Strategy[RowRequest, Answer, UCBParamsT]):
    """``gp-ucb``: the random initial rows, then one row per round at the UCB argmax (PO-GP-UCB Alg. 2).

    Generic over its parameters (``UCBParamsT``): ``gp-bucb`` extends it with its own (``GPBUCBParams``)."""

    name: ClassVar[str] = "gp-ucb"
    description: ClassVar[str] = (
        "GP-UCB over the released rows (Srinivas et al. 2010; PO-GP-UCB, Kharkovskii et al. 2020, "
        "Algorithm 2): after `initial_points` random rows, each round queries the one row maximising "
        "mu(z) + beta_t^(1/2) sigma(z), beta_t = beta_scale * 2 ln(n t^2 pi^2 / (6 delta')) (the "
        "theorem's at beta_scale 1). Hyper-parameters fixed or refitted by maximum likelihood on a schedule."
    )
    Params: ClassVar[type[StrategyParams]] = GPUCBParams

    def __init__(self, Z: npt.ArrayLike, params: UCBParamsT, state: Mapping[str, Any]) -> None:
        super().__init__(Z, params, state)
        self.engine = self.make_engine(params)
        self.initial = [int(i) for i in self.state.get("initial_indices", [])]

    def make_engine(self, params: UCBParamsT) -> GPUCB:
        return GPUCB(self.Z, **params.engine_options())

    @classmethod
    def with_output_privacy(cls, params: UCBParamsT, *, epsilon: float, B: float, R: float) -> UCBParamsT:
        """The fit's noise floor from the grant's output mechanism when the study left it out."""
        if params.noise_variance_floor is not None:
            return params
        floor = CTL(epsilon=epsilon, B=B, R=R).noise_variance  # the curator's output mechanism's
        return type(params).model_validate(params.model_dump() | {"noise_variance_floor": floor})

    @classmethod
    def initial_state(
        cls, params: UCBParamsT, *, n: int, budget: int, rng: np.random.Generator
    ) -> dict[str, Any]:
        return initial_rows(params, n=n, budget=budget, rng=rng)

    def plan(self, *, budget: int, rng: np.random.Generator) -> list[RowRequest]:
        t = self.engine.gp.t  # observations so far
        blocked = self.unavailable
        if t < len(self.initial) and (blocked is None or not blocked[self.initial[t]]):
            index = self.initial[t]
            return [RowRequest(index, row_details(self.engine, index, source="initial"))]
        s = self.engine.suggest(blocked)
        return [RowRequest(s.index, row_details(self.engine, s.index, source="gp-ucb"))]

    def posterior_mean(self, index: int) -> float | None:
        return self.engine.gp.posterior_at(int(index))[0]

    def observe(self, answers: Sequence[Answer]) -> None:
        for answer in answers:
            self.engine.observe(answer.request.index, answer.y)

    def replay(self, rounds: Sequence[Sequence[Answer]]) -> None:
        """One batch posterior after replaying the scheduled refits (``GPUCB.from_history``)."""
        observations = [(a.request.index, a.y) for answers in rounds for a in answers]
        self.engine = GPUCB.from_history(self.Z, observations, **self.params.engine_options())
