"""Random search over the rows of a released Z: the registry strategy ``random`` (a baseline).

Each round queries one row drawn uniformly from the rows not queried yet (sampling without replacement, the
pure random search baseline of Bergstra & Bengio, "Random Search for Hyper-Parameter Optimization", JMLR 13
(2012), restricted to the finite candidate set). The draw uses the generator the modeler passes to ``plan``
(a seeded per-round stream in tests and benchmarks, ``round_rng``; OS entropy otherwise), so the strategy
keeps no secret state of its own: its state is the set of rows queried, which ``from_history`` rebuilds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from shared.bo.strategies.base import Answer, RowRequest, Strategy, StrategyParams, register
from shared.errors import InputDataError, StrategyError

__all__ = ["RandomParams", "RandomRowsStrategy"]


class RandomParams(StrategyParams):
    """``random`` takes no parameters (any key is refused)."""


@register
class RandomRowsStrategy(Strategy[RowRequest, Answer, RandomParams]):
    """``random``: one row per round, uniform over the rows not queried yet."""

    name: ClassVar[str] = "random"
    description: ClassVar[str] = (
        "Random search (baseline): each round queries one row drawn uniformly from the rows not queried "
        "yet (without replacement), until every row has been queried. No parameters."
    )
    Params: ClassVar[type[StrategyParams]] = RandomParams

    def __init__(self, Z: npt.ArrayLike, params: RandomParams, state: Mapping[str, Any]) -> None:
        super().__init__(Z, params, state)
        self._queried = np.zeros(self.n, dtype=bool)

    @property
    def queried(self) -> npt.NDArray[np.bool_]:
        """[n] True for every row observed so far (a copy)."""
        return self._queried.copy()

    def plan(self, *, budget: int, rng: np.random.Generator) -> list[RowRequest]:
        if budget < 1:
            raise InputDataError(f"budget must be >= 1, got {budget}")
        free = ~self._queried if self.unavailable is None else ~(self._queried | self.unavailable)
        left = np.flatnonzero(free)
        if left.size == 0:
            excluded = "" if self.unavailable is None else " or is excluded under the study's grant"
            raise StrategyError(f"every one of the {self.n} candidates has been queried already{excluded}")
        index = int(left[int(rng.integers(left.size))])
        return [RowRequest(index, {"source": "random", "candidates": int(left.size)})]

    def _mark(self, indices: Sequence[int], ys: Sequence[float]) -> None:
        idx = np.asarray(indices, dtype=np.int64)
        y = np.asarray(ys, dtype=np.float64)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.n):
            raise InputDataError(f"observation indices must be in [0, {self.n - 1}]")
        if not np.isfinite(y).all():
            bad = int(np.flatnonzero(~np.isfinite(y))[0])
            raise InputDataError(f"y must be finite, got {float(y[bad])!r} in observation {bad}")
        self._queried[idx] = True

    def observe(self, answers: Sequence[Answer]) -> None:
        self._mark([a.request.index for a in answers], [a.y for a in answers])

    def replay(self, rounds: Sequence[Sequence[Answer]]) -> None:
        """The rows queried in ``rounds``, marked at once."""
        answers = [a for round_ in rounds for a in round_]
        self._mark([a.request.index for a in answers], [a.y for a in answers])
