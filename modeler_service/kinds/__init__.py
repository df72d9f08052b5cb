"""The registry of request kinds: the one place of the modeler that knows which kinds there are.

Every other module of ``modeler_service`` reaches a request kind through this registry: by its name
(``kind_named``: a planned request, an audit entry), by the strategy that issues it (``kind_for``) or by the
study (``kind_of``). A new kind is a ``RequestKind`` subclass registered with ``register_kind`` (the
built-in ``row`` and ``gradient`` below), beside a strategy registered in ``shared.bo.strategies`` whose
``kinds`` name it.
"""

from __future__ import annotations

from typing import Any

from modeler_service.exceptions import StorageError
from modeler_service.kinds.base import PlannedRequest, Recorded, RequestKind, Services, StudyFacts
from modeler_service.kinds.gradient import GradientKind
from modeler_service.kinds.row import RowKind
from modeler_service.models import Study
from shared.bo.strategies import Strategy, get_strategy
from shared.errors import StrategyError

__all__ = [
    "KINDS",
    "PlannedRequest",
    "Recorded",
    "RequestKind",
    "Services",
    "StudyFacts",
    "facts_of",
    "kind_for",
    "kind_named",
    "kind_of",
    "register_kind",
]

#: Every request kind, by name.
KINDS: dict[str, RequestKind] = {}


def register_kind(kind: RequestKind) -> RequestKind:
    """Add ``kind`` to the registry (a second kind of the same name is a programming error)."""
    if kind.name in KINDS and KINDS[kind.name] is not kind:
        raise ValueError(f"request kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind


def kind_named(name: str) -> RequestKind:
    """The kind called ``name`` (a stored request or audit entry names it)."""
    try:
        return KINDS[name]
    except KeyError:
        raise StorageError(
            f"request kind {name!r} is not known to this modeler (known: {', '.join(sorted(KINDS))}); was it "
            "written by a newer version?"
        ) from None


def kind_for(strategy: type[Strategy[Any, Any]]) -> RequestKind:
    """The kind a strategy issues (its first declared kind; they all run on the same target)."""
    if not strategy.kinds or strategy.kinds[0] not in KINDS:
        raise StrategyError(
            f"strategy {strategy.name!r} issues request kinds {list(strategy.kinds)}, and this modeler knows "
            f"only {sorted(KINDS)}"
        )
    kind = KINDS[strategy.kinds[0]]
    if kind.runs_on != strategy.runs_on:
        raise StrategyError(
            f"strategy {strategy.name!r} runs on {strategy.runs_on!r}, but its request kind {kind.name!r} "
            f"runs on {kind.runs_on!r}"
        )
    return kind


def kind_of(study: Study) -> RequestKind:
    """The kind of the requests of ``study`` (that of its strategy)."""
    return kind_for(get_strategy(study.strategy))


def facts_of(study: Study) -> StudyFacts:
    """The study's fixed attributes that planning a round reads."""
    target = kind_of(study).target_id(study)
    return StudyFacts(study.id, study.strategy, study.seed, study.n, target, study.iterations_total)


register_kind(RowKind())
register_kind(GradientKind())
