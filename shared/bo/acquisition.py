"""The upper-confidence-bound (UCB) acquisition of the GP-UCB family, written once: the score, the choice of
a row and the numbers recorded with each request.

Notation (shapes in brackets)::

    mean, std [n]   posterior mean mu and standard deviation sigma of f at the n candidates
    ucb       [n]   mu + scale sigma
    i_t       = argmax_i ucb_i     the first maximum: ties -> the smallest index; excluded rows are at -inf

with ``scale`` (and the ``beta`` recorded) per algorithm:

- ``scale = beta_t^{1/2}``: GP-UCB (Srinivas et al. 2010; PO-GP-UCB, Kharkovskii et al. 2020, Alg. 2 line 4;
  ``strategies.gp_ucb``, whose GP computes the scores in its own update pass, ``GaussianProcess.ucb_values``)
  and GP-BUCB (Desautels, Krause & Burdick 2014, Alg. 1: the mean of the last feedback, the hallucinated std;
  ``strategies.gp_bucb``);
- ``scale = beta_t``: TGP-UCB, ATA-GP-UCB and MoMA-GP-UCB (Zhou & Tan, AAAI 2021, Alg. 2 line 6, Alg. 1 line
  4, Alg. 3 line 5; Chowdhury & Gopalan, NeurIPS 2019; ``strategies.heavy_tailed``).

Before a strategy's first UCB row come its random initial rows (``UCB.choose``: the initial row of the play
while there is one). Each request's audit ``details`` start with the same five numbers, in this order (tests
and the services read them): ``source`` (the strategy's name, or "initial"), ``acquisition`` (the UCB score
of the row), ``beta``, ``mean`` and ``std`` (mu and sigma at the row); the strategy's own keys follow
(``ucb_details``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.bo.parallel import argmax
from shared.errors import StrategyError

FloatArray = npt.NDArray[np.float64]

__all__ = ["UCB", "first_argmax", "ucb_details", "ucb_scores", "ucb_value"]


def ucb_scores(mean: FloatArray, std: FloatArray, scale: float) -> FloatArray:
    """``mean + scale * std`` [n], a new array."""
    out: FloatArray = mean + scale * std
    return out


def ucb_value(mean: float, std: float, scale: float) -> float:
    """``mean + scale * std`` at one row (the same arithmetic as ``ucb_scores``' entry)."""
    return mean + scale * std


def first_argmax(values: FloatArray) -> int:
    """The index of the first maximum (ties -> the smallest index; the first NaN if any), as ``np.argmax``,
    searched in parallel over a large n (``shared.bo.parallel.argmax``)."""
    return argmax(values)


def ucb_details(
    *, source: str, acquisition: float, beta: float, mean: float, std: float, **extra: Any
) -> dict[str, Any]:
    """The audit details of a UCB request: source, acquisition, beta, mean, std, then ``extra`` in order."""
    return {
        "source": source,
        "acquisition": float(acquisition),
        "beta": float(beta),
        "mean": float(mean),
        "std": float(std),
        **extra,
    }


@dataclass(frozen=True)
class UCB:
    """The UCB scores at every candidate, with the posterior mean and std and the beta they came from."""

    values: FloatArray  # [n] mean + scale * std (excluded rows at -inf)
    mean: FloatArray  # [n]
    std: FloatArray  # [n]
    beta: float

    @classmethod
    def of(cls, mean: FloatArray, std: FloatArray, beta: float, *, scale: float) -> UCB:
        """``mean + scale * std`` (scale = beta^{1/2} for GP-UCB / GP-BUCB, beta for the heavy-tailed)."""
        return cls(ucb_scores(mean, std, scale), mean, std, float(beta))

    def exclude(self, rows: npt.NDArray[np.bool_] | npt.NDArray[np.int64]) -> None:
        """Set the scores of ``rows`` (indices or a boolean mask [n]) to -inf: never chosen by the argmax."""
        self.values[rows] = -np.inf

    def argmax(self) -> int:
        """The first maximum of the scores (``first_argmax``)."""
        return first_argmax(self.values)

    def choose(
        self,
        initial: Sequence[int],
        play: int,
        source: str,
        *,
        unavailable: npt.NDArray[np.bool_] | None = None,
    ) -> tuple[int, str]:
        """``(row, source)`` of play ``play`` (0-based): the initial row ``initial[play]`` ("initial") while
        there is one, else the first argmax of the scores (``source``). ``unavailable`` [n]: rows that must
        not be chosen (``Strategy.unavailable``), excluded first; an initial row among them is skipped for
        the argmax, and ``StrategyError`` is raised when no row is left."""
        if unavailable is not None:
            self.exclude(unavailable)
        if play < len(initial) and (unavailable is None or not unavailable[int(initial[play])]):
            return int(initial[play]), "initial"
        index = self.argmax()
        if unavailable is not None and not np.isfinite(self.values[index]):
            raise StrategyError(
                f"no row is left to choose: all {self.values.size} are excluded (queried already, or their "
                "person cannot afford another answer under the study's grant)"
            )
        return index, source

    def details(self, index: int, *, source: str, **extra: Any) -> dict[str, Any]:
        """``ucb_details`` of row ``index``: its score, beta, mean and std, then ``extra``."""
        return ucb_details(
            source=source,
            acquisition=self.values[index],
            beta=self.beta,
            mean=self.mean[index],
            std=self.std[index],
            **extra,
        )
