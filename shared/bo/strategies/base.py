"""The interface every optimisation strategy of the modeler implements, and the registry that names them.

A study runs in *rounds*. In each round the strategy plans one or more *requests* to the curator (the
outcome of a row of the release, by index; or a private gradient step, below, in the same shape), the
modeler records the whole round in its write-ahead log, sends the requests, waits for every answer, records
them in the audit log and hands them back to the strategy::

    params  = parse_params(name, raw)                     # the strategy's own ``Params`` model, validated
    state   = Strategy.initial_state(params, n=n, budget=iterations, rng=rng)   # once, at creation; private
    s       = Strategy(Z, params, state)
    round   = s.plan(budget=queries_left, rng=rng)   # [RowRequest(index, details), ...], 1 <= len <= budget
    ...the curator answers each request...
    s.observe([Answer(request, y), ...])                 # the whole round at once
    s       = Strategy.from_history(Z, params, state, rounds)   # after a restart: the same state again
                                                                # (``replay``: override to be faster)

A strategy is generic over its request, answer and parameter types, ``Strategy[RequestT, AnswerT, P]``:
a row strategy is a ``Strategy[RowRequest, Answer, XParams]`` (``XParams`` its ``Params`` model, a
``StrategyParams``), and its methods receive ``params: XParams``, already validated as such by
``parse_params``. Code that holds any registered strategy uses ``Strategy[Any, Any, Any]`` (``REGISTRY``,
``get_strategy``); a bare ``Strategy[RequestT, AnswerT]`` has ``P = StrategyParams``.

Strategies of a second kind run on a curator's private *gradient oracle* (``runs_on = "gradient-oracle"``,
DP-GIBO, a ``Strategy[GradientRequest, GradientAnswer, DPGIBOParams]``; row strategies have ``RowRequest``
and ``Answer``, the defaults) instead of a release: they get a ``GradientDomain`` (the oracle's public
dimension, bounds and steps) in place of Z, plan ``GradientRequest`` s (theta, the new batch of design
points, the kernel) and observe ``GradientAnswer`` s (the curator's noisy gradient)::

    s       = Strategy(domain, params, state)
    round   = s.plan(budget=steps_left, rng=rng)      # [GradientRequest(theta, points, kernel, ...)]
    outcome = s.outcome(answers)                       # numbers the audit entries add (theta_next); no change
    s.observe([GradientAnswer(request, gradient, step), ...])
    s.point()                                          # the current theta (None for row strategies)

The audit entry of a gradient answer holds the request's body, the gradient and the outcome's numbers in
its ``details`` (``gradient_record``), from which ``gradient_answer_from_record`` rebuilds the answer for
``from_history``.

``details`` is a JSON-serialisable dict per request: the numbers that justify the choice (acquisition value,
beta, posterior mean and std, hyper-parameters, ...). The modeler stores it in the hash-chained audit entry
and never interprets it. ``plan`` must not change the strategy's state (the modeler may plan, lose the race
for the study to another worker and plan again); only ``observe`` does.

Strategies are pure numerics (numpy/scipy/pydantic): no web or database imports.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import TypeVar

from shared.errors import InputDataError

__all__ = [
    "REGISTRY",
    "Answer",
    "GradientAnswer",
    "GradientDomain",
    "GradientRequest",
    "RequestKind",
    "RoundOutcome",
    "RowRequest",
    "RunsOn",
    "Strategy",
    "StrategyParams",
    "catalogue",
    "get_strategy",
    "gradient_answer_from_record",
    "gradient_record",
    "parse_params",
    "register",
    "round_rng",
]

RequestKind = Literal["row", "gradient"]
#: What a strategy runs on: a released Z (row requests) or a private gradient oracle (gradient requests).
RunsOn = Literal["release", "gradient-oracle"]


@dataclass(frozen=True)
class RowRequest:
    """Ask the curator for the outcome of row ``index`` of the release; ``details`` go to the audit log."""

    index: int
    details: Mapping[str, Any] = field(default_factory=dict)
    kind: ClassVar[RequestKind] = "row"


@dataclass(frozen=True)
class Answer:
    """A request of a round and the curator's answer to it."""

    request: RowRequest
    y: float


@dataclass(frozen=True)
class GradientRequest:
    """Ask the curator's gradient oracle for one private gradient step (DP-GIBO, Algorithm 1 lines 5-8).

    ``theta`` [d] and the new batch ``points`` [b, d] (Z_t, appended to the oracle's design: line 5) are
    data-independent, as are the ``kernel`` spec (``{"kind": "se", "lengthscale", "signal_variance"}`` or
    ``{"kind": "polynomial", "degree", "offset"}``), ``noise_var`` (sigma^2 of Section 3.4) and ``jitter``;
    ``body()`` is the wire body of ``POST /v1/gradient-oracles/{id}/steps``. ``details`` go to the audit log.
    """

    theta: tuple[float, ...]
    points: tuple[tuple[float, ...], ...]
    kernel: Mapping[str, Any]
    noise_var: float = 0.0
    jitter: float = 1e-8
    details: Mapping[str, Any] = field(default_factory=dict)
    kind: ClassVar[RequestKind] = "gradient"

    def body(self) -> dict[str, Any]:
        """The step's inputs as sent to the curator (JSON: lists and plain floats)."""
        return {
            "theta": [float(v) for v in self.theta],
            "points": [[float(v) for v in p] for p in self.points],
            "kernel": dict(self.kernel),
            "noise_var": float(self.noise_var),
            "jitter": float(self.jitter),
        }


@dataclass(frozen=True)
class GradientAnswer:
    """A gradient request and the curator's answer: the released noisy gradient [d] and its step number."""

    request: GradientRequest
    gradient: tuple[float, ...]
    step: int | None = None


#: The keys of a gradient audit entry's ``details`` that hold the request's body and the answer.
GRADIENT_BODY_KEYS = ("theta", "points", "kernel", "noise_var", "jitter")
GRADIENT_ANSWER_KEYS = ("gradient", "step")


def gradient_record(answer: GradientAnswer, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``details`` of a gradient answer's audit entry: the request's details, the outcome's numbers
    (``extra``, e.g. theta_next), the step's inputs (the body) and the noisy gradient with its step."""
    return {
        **dict(answer.request.details),
        **dict(extra or {}),
        **answer.request.body(),
        "gradient": [float(v) for v in answer.gradient],
        "step": None if answer.step is None else int(answer.step),
    }


def gradient_answer_from_record(details: Mapping[str, Any]) -> GradientAnswer:
    """The answer ``gradient_record`` wrote (``InputDataError`` if a key is missing)."""
    missing = [k for k in (*GRADIENT_BODY_KEYS, "gradient") if k not in details]
    if missing:
        raise InputDataError(f"a gradient audit entry lacks {', '.join(missing)} in its details")
    rest = {k: v for k, v in details.items() if k not in GRADIENT_BODY_KEYS + GRADIENT_ANSWER_KEYS}
    step = details.get("step")
    request = GradientRequest(
        theta=tuple(float(v) for v in details["theta"]),
        points=tuple(tuple(float(v) for v in p) for p in details["points"]),
        kernel=dict(details["kernel"]),
        noise_var=float(details["noise_var"]),
        jitter=float(details["jitter"]),
        details=rest,
    )
    return GradientAnswer(
        request, tuple(float(v) for v in details["gradient"]), None if step is None else int(step)
    )


@dataclass(frozen=True)
class GradientDomain:
    """What a gradient-oracle strategy runs on in place of Z: the oracle's public ``dimension`` d, box
    ``bounds`` [d, 2] (every theta and design point must lie inside) and number of ``steps`` T."""

    dimension: int
    bounds: tuple[tuple[float, float], ...]
    steps: int
    #: The most design points the curator's oracle accepts over all steps, when known (checked at creation).
    max_design: int | None = None

    def __post_init__(self) -> None:
        if self.dimension < 1 or len(self.bounds) != self.dimension:
            raise InputDataError(
                f"a gradient domain needs one [lo, hi] per dimension: dimension {self.dimension}, "
                f"{len(self.bounds)} bounds"
            )
        for k, (lo, hi) in enumerate(self.bounds):
            if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
                raise InputDataError(f"bounds[{k}] must be finite with lo < hi, got [{lo}, {hi}]")

    @classmethod
    def from_public(cls, oracle: Mapping[str, Any], *, max_design: int | None = None) -> GradientDomain:
        """From the oracle's public parameters (``GET /v1/gradient-oracles/{id}``: dimension, bounds,
        steps)."""
        return cls(
            dimension=int(oracle["dimension"]),
            bounds=tuple((float(lo), float(hi)) for lo, hi in oracle["bounds"]),
            steps=int(oracle["steps"]),
            max_design=max_design,
        )

    def array(self) -> npt.NDArray[np.float64]:
        """The bounds as a float [d, 2] array (lo, hi)."""
        return np.asarray(self.bounds, dtype=np.float64).reshape(self.dimension, 2)


@dataclass(frozen=True)
class RoundOutcome:
    """What an answered round adds to the audit log before the strategy observes it (``Strategy.outcome``):
    per answer, numbers merged into its entry's ``details``; and the strategy's ``point`` after the round
    (gradient strategies: theta^(t+1); None for row strategies)."""

    details: tuple[Mapping[str, Any], ...]
    point: tuple[float, ...] | None = None


RequestT = TypeVar("RequestT", default=RowRequest)
AnswerT = TypeVar("AnswerT", default=Answer)


class StrategyParams(BaseModel):
    """Base of each strategy's parameter model: unknown keys are refused, types are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


#: A strategy's parameter model (its ``Params``), the type its methods receive ``params`` as.
P = TypeVar("P", bound=StrategyParams, default=StrategyParams)


class Strategy(ABC, Generic[RequestT, AnswerT, P]):
    """One optimisation strategy over the n rows of a released Z (see the module docstring); or, with
    ``runs_on = "gradient-oracle"`` (a ``Strategy[GradientRequest, GradientAnswer, P]``), over a curator's
    private gradient oracle, given its ``GradientDomain`` in place of Z. ``P`` is its ``Params`` model: the
    type of the ``params`` its methods receive (the modeler validates them with ``parse_params``)."""

    #: Registry name (the study's ``strategy``).
    name: ClassVar[str]
    #: One paragraph for ``GET /v1/strategies``: what it does, and the paper/algorithm it follows.
    description: ClassVar[str]
    #: The pydantic model of the study's ``strategy_params``.
    Params: ClassVar[type[StrategyParams]]
    #: The request kinds it plans.
    kinds: ClassVar[tuple[RequestKind, ...]] = ("row",)
    #: What a study of it runs on: a curator release (Z; ``release_id``) or a gradient oracle
    #: (``GradientDomain``; ``gradient_oracle_id``).
    runs_on: ClassVar[RunsOn] = "release"

    #: [n] True for the rows the strategy must not choose: the rows the curator can no longer answer under
    #: the study's grant (its output allotment for their person is used up), set by the modeler with
    #: ``exclude_rows``. Not part of the state (the modeler sets it again after a rebuild); None: no row.
    unavailable: npt.NDArray[np.bool_] | None = None

    def __init__(self, Z: Any, params: P, state: Mapping[str, Any]) -> None:
        self.Z = np.ascontiguousarray(Z, dtype=np.float64)
        if self.Z.ndim != 2 or self.Z.shape[0] < 1:
            raise InputDataError(f"Z must be a non-empty n x r array, got shape {self.Z.shape}")
        self.params: P = params
        self.state = dict(state)

    @property
    def n(self) -> int:
        return int(self.Z.shape[0])

    @classmethod
    def initial_state(cls, params: P, *, n: int, budget: int, rng: np.random.Generator) -> dict[str, Any]:
        """Private, JSON-serialisable choices made once when the study is created (e.g. random first rows).

        Raise ``InputDataError`` when the parameters do not fit this release (n rows) or budget.
        """
        return {}

    @classmethod
    def fresh_plays_per_row(cls, params: P, *, budget: int) -> int:
        """How many fresh noisy answers of one same row the strategy may ask for (default 1).

        Repeated-play strategies (e.g. MoMA-GP-UCB, which plays one row k times per epoch) return their k,
        computed from ``params`` and the study's ``budget`` exactly as ``initial_state`` does; the modeler
        checks it against what the curator's grant allows before creating the study.
        """
        return 1

    @classmethod
    def output_privacy(cls, params: P) -> tuple[float | None, float | None, float | None] | None:
        """``(epsilon, B, R)`` the strategy assumes the curator's output mechanism uses, or None (default).

        Local-DP strategies (Zhou & Tan 2021) set their truncation levels and beta_t from the Laplace scale
        2(B + R)/epsilon of the curator's CTL(epsilon) mechanism; the modeler checks these against the values
        the curator declares on its grant. A None entry is one the study left out: the modeler takes it from
        the grant (``with_output_privacy``).
        """
        return None

    @classmethod
    def with_answers(cls, params: P, *, fresh_repeats: bool) -> P:
        """``params`` completed from how the curator answers a repeated row: with fresh noise
        (``fresh_repeats``), or with the row's stored or cached answer. Default: unchanged."""
        return params

    @classmethod
    def with_output_privacy(cls, params: P, *, epsilon: float, B: float, R: float) -> P:
        """``params`` with the output mechanism's values the study left out taken from the grant (default:
        unchanged, for strategies that assume no output mechanism)."""
        return params

    @classmethod
    def check_domain(cls, params: P, domain: GradientDomain, *, budget: int) -> None:
        """Gradient-oracle strategies: raise ``InputDataError`` when ``params`` or the ``budget`` (steps) do
        not fit the oracle's domain (checked when the study is created). Default: nothing to check."""
        return None

    def exclude_rows(self, rows: npt.NDArray[np.bool_] | None) -> None:
        """From now on never choose the rows where ``rows`` [n] is True (None or none True: every row may be
        chosen). Row strategies honour ``unavailable`` in ``plan``; gradient strategies choose no rows."""
        if rows is None or not np.any(rows):
            self.unavailable = None
            return
        mask = np.asarray(rows, dtype=bool)
        if mask.shape != (self.n,):
            raise InputDataError(f"rows to exclude must be a mask over the {self.n} rows, got {mask.shape}")
        self.unavailable = mask.copy()

    @abstractmethod
    def plan(self, *, budget: int, rng: np.random.Generator) -> list[RequestT]:
        """The next round: between 1 and ``budget`` requests (``budget`` >= 1 queries are left).

        Must not change the strategy's state; ``rng`` is for strategies that choose at random.
        """

    @abstractmethod
    def observe(self, answers: Sequence[AnswerT]) -> None:
        """Condition on the answers of one whole round (in request order)."""

    def outcome(self, answers: Sequence[AnswerT]) -> RoundOutcome:
        """What the answers of a round add to their audit entries, computed *without* changing the state
        (the modeler records them before ``observe``). Default: nothing, and no point."""
        return RoundOutcome(details=tuple({} for _ in answers))

    def posterior_mean(self, index: int) -> float | None:
        """The strategy's posterior mean of the objective at row ``index`` given every answer observed, or
        None when it keeps no model (the default). Under output privacy the answers are noisy, and this is
        the study's estimate of the best row's true outcome."""
        return None

    def point(self) -> tuple[float, ...] | None:
        """The strategy's current point in its domain (gradient strategies: theta); None for row strategies,
        whose best is the best answer."""
        return None

    @classmethod
    def from_history(
        cls,
        Z: Any,
        params: P,
        state: Mapping[str, Any],
        rounds: Sequence[Sequence[AnswerT]],
    ) -> Self:
        """The strategy in the state it reaches after observing ``rounds`` in order."""
        strategy = cls(Z, params, state)
        strategy.replay(rounds)
        return strategy

    def replay(self, rounds: Sequence[Sequence[AnswerT]]) -> None:
        """Observe ``rounds`` in order, on a fresh strategy (override to do it faster than round by round)."""
        for answers in rounds:
            self.observe(answers)


REGISTRY: dict[str, type[Strategy[Any, Any, Any]]] = {}

S = TypeVar("S", bound=type[Strategy[Any, Any, Any]])


def register(cls: S) -> S:
    """Class decorator: make a strategy available by its ``name``."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"a strategy named {cls.name!r} is registered already")
    REGISTRY[cls.name] = cls
    return cls


def get_strategy(name: str) -> type[Strategy[Any, Any, Any]]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise InputDataError(
            f"unknown strategy {name!r}; the registry has: {', '.join(sorted(REGISTRY))} "
            "(GET /v1/strategies describes each)"
        ) from None


def _accepted(model: type[StrategyParams]) -> str:
    fields = model.model_fields
    if not fields:
        return "it takes no parameters"
    parts = []
    for key, info in fields.items():
        default = "" if info.is_required() else f" (default {info.get_default(call_default_factory=True)!r})"
        parts.append(f"{key}{default}")
    return "it accepts: " + ", ".join(parts)


def parse_params(name: str, raw: Mapping[str, Any] | None) -> StrategyParams:
    """Validate a study's ``strategy_params`` for strategy ``name``; the error lists what it accepts."""
    cls = get_strategy(name)
    try:
        return cls.Params.model_validate(dict(raw or {}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'strategy_params'}: {err['msg']}"
            for err in exc.errors()
        )
        raise InputDataError(
            f"strategy_params for {name!r} are not valid ({problems}); {_accepted(cls.Params)}"
        ) from None


def catalogue() -> list[dict[str, Any]]:
    """Every registered strategy: name, description and the JSON schema of its parameters."""
    return [
        {
            "name": cls.name,
            "description": cls.description,
            "kinds": list(cls.kinds),
            "runs_on": cls.runs_on,
            "params_schema": cls.Params.model_json_schema(),
        }
        for _, cls in sorted(REGISTRY.items())
    ]


def round_rng(seed: int | None, round_no: int) -> np.random.Generator:
    """The generator a round's plan may draw from: reproducible from a benchmark/test ``seed`` (one
    stream per round, so a re-plan after a lost race draws the same), else fresh OS entropy."""
    if seed is None:
        from shared.privacy.rng import os_entropy_rng

        return os_entropy_rng()
    return np.random.default_rng([int(seed), int(round_no)])
