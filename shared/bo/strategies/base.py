"""The interface every optimisation strategy of the modeler implements, and the registry that names them.

A study runs in *rounds*. In each round the strategy plans one or more *requests* to the curator (today: the
outcome of a row of the release, by index; later kinds such as a private gradient use the same shape), the
modeler records the whole round in its write-ahead log, sends the requests, waits for every answer, records
them in the audit log and hands them back to the strategy::

    state   = Strategy.initial_state(params, n=n, budget=iterations, rng=rng)   # once, at creation; private
    s       = Strategy(Z, params, state)
    round   = s.plan(budget=queries_left, rng=rng)   # [RowRequest(index, details), ...], 1 <= len <= budget
    ...the curator answers each request...
    s.observe([Answer(request, y), ...])                 # the whole round at once
    s       = Strategy.from_history(Z, params, state, rounds)   # after a restart: the same state again
                                                                # (``replay``: override to be faster)

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
from typing import Any, ClassVar, Literal, Self, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, ValidationError

from shared.errors import InputDataError

__all__ = [
    "REGISTRY",
    "Answer",
    "RequestKind",
    "RowRequest",
    "Strategy",
    "StrategyParams",
    "catalogue",
    "get_strategy",
    "parse_params",
    "register",
    "round_rng",
]

RequestKind = Literal["row", "gradient"]


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


class StrategyParams(BaseModel):
    """Base of each strategy's parameter model: unknown keys are refused, types are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Strategy(ABC):
    """One optimisation strategy over the n rows of a released Z (see the module docstring)."""

    #: Registry name (the study's ``strategy``).
    name: ClassVar[str]
    #: One paragraph for ``GET /v1/strategies``: what it does, and the paper/algorithm it follows.
    description: ClassVar[str]
    #: The pydantic model of the study's ``strategy_params``.
    Params: ClassVar[type[StrategyParams]]
    #: The request kinds it plans.
    kinds: ClassVar[tuple[RequestKind, ...]] = ("row",)

    def __init__(self, Z: npt.ArrayLike, params: StrategyParams, state: Mapping[str, Any]) -> None:
        self.Z = np.ascontiguousarray(Z, dtype=np.float64)
        if self.Z.ndim != 2 or self.Z.shape[0] < 1:
            raise InputDataError(f"Z must be a non-empty n x r array, got shape {self.Z.shape}")
        self.params = params
        self.state = dict(state)

    @property
    def n(self) -> int:
        return int(self.Z.shape[0])

    @classmethod
    def initial_state(
        cls, params: StrategyParams, *, n: int, budget: int, rng: np.random.Generator
    ) -> dict[str, Any]:
        """Private, JSON-serialisable choices made once when the study is created (e.g. random first rows).

        Raise ``InputDataError`` when the parameters do not fit this release (n rows) or budget.
        """
        return {}

    @classmethod
    def fresh_plays_per_row(cls, params: StrategyParams, *, budget: int) -> int:
        """How many fresh noisy answers of one same row the strategy may ask for (default 1).

        Repeated-play strategies (e.g. MoMA-GP-UCB, which plays one row k times per epoch) return their k,
        computed from ``params`` and the study's ``budget`` exactly as ``initial_state`` does; the modeler
        checks it against what the curator's grant allows before creating the study.
        """
        return 1

    @classmethod
    def output_privacy(cls, params: StrategyParams) -> tuple[float, float, float] | None:
        """``(epsilon, B, R)`` the strategy assumes the curator's output mechanism uses, or None (default).

        Local-DP strategies (Zhou & Tan 2021) set their truncation levels and beta_t from the Laplace scale
        2(B + R)/epsilon of the curator's CTL(epsilon) mechanism; the modeler checks these against the values
        the curator declares on its grant.
        """
        return None

    @abstractmethod
    def plan(self, *, budget: int, rng: np.random.Generator) -> list[RowRequest]:
        """The next round: between 1 and ``budget`` requests (``budget`` >= 1 queries are left).

        Must not change the strategy's state; ``rng`` is for strategies that choose at random.
        """

    @abstractmethod
    def observe(self, answers: Sequence[Answer]) -> None:
        """Condition on the answers of one whole round (in request order)."""

    @classmethod
    def from_history(
        cls,
        Z: npt.ArrayLike,
        params: StrategyParams,
        state: Mapping[str, Any],
        rounds: Sequence[Sequence[Answer]],
    ) -> Self:
        """The strategy in the state it reaches after observing ``rounds`` in order."""
        strategy = cls(Z, params, state)
        strategy.replay(rounds)
        return strategy

    def replay(self, rounds: Sequence[Sequence[Answer]]) -> None:
        """Observe ``rounds`` in order, on a fresh strategy (override to do it faster than round by round)."""
        for answers in rounds:
            self.observe(answers)


REGISTRY: dict[str, type[Strategy]] = {}

S = TypeVar("S", bound=type[Strategy])


def register(cls: S) -> S:
    """Class decorator: make a strategy available by its ``name``."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"a strategy named {cls.name!r} is registered already")
    REGISTRY[cls.name] = cls
    return cls


def get_strategy(name: str) -> type[Strategy]:
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
