"""Demo objectives for federation agents (``pobo agent run --objective NAME``), rescaled to a box.

Pure numpy. Each objective is MAXIMISED (DP-FTS-DE maximises phi(x)^T omega). A point x of the federation's
box [lower, upper] is first mapped to the unit cube, u = (x - lower) / (upper - lower); ``perturbation``
moves the optimum of one agent by a small random offset (seeded by ``seed``) so that agents' objectives
differ a little, as in the paper's synthetic setting (small random perturbations of one function).

* ``sphere``: f(u) = -||u - c||^2 / d with c = 0.5 + offset (clipped to [0, 1]); maximum 0 at c.
* ``branin``: the first two coordinates u_1, u_2 mapped to Branin's domain [-5, 10] x [0, 15], shifted by
  the offset; f = -(branin - 0.397887) / 50 - ||u_rest - c_rest||^2 / d (d >= 2); maximum about 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError
from shared.federated.regions import as_box

FloatArray = npt.NDArray[np.float64]
Objective = Callable[[FloatArray], float]

__all__ = ["OBJECTIVES", "Objective", "branin", "make_objective"]

OBJECTIVES = ("sphere", "branin")
BRANIN_MIN = 0.397887


def branin(x1: float, x2: float) -> float:
    """Branin-Hoo on [-5, 10] x [0, 15]; minimum 0.397887 at three points."""
    a, b, c = 1.0, 5.1 / (4.0 * math.pi**2), 5.0 / math.pi
    r, s, t = 6.0, 10.0, 1.0 / (8.0 * math.pi)
    return float(a * (x2 - b * x1**2 + c * x1 - r) ** 2 + s * (1.0 - t) * math.cos(x1) + s)


def make_objective(
    name: str,
    lower: npt.ArrayLike,
    upper: npt.ArrayLike,
    *,
    perturbation: float = 0.0,
    seed: int | None = None,
) -> Objective:
    """The objective ``name`` on the box, its optimum moved by N(0, perturbation^2) per unit-cube axis."""
    lo, hi = as_box(lower, upper)
    d = lo.shape[0]
    if not (math.isfinite(perturbation) and perturbation >= 0):
        raise InputDataError(f"perturbation must be a finite number >= 0, got {perturbation!r}")
    offset: FloatArray = np.asarray(
        np.random.default_rng(seed).normal(0.0, perturbation, d) if perturbation > 0 else np.zeros(d),
        dtype=np.float64,
    )
    centre: FloatArray = np.clip(0.5 + offset, 0.0, 1.0)

    def unit(x: FloatArray) -> FloatArray:
        xv = np.asarray(x, dtype=np.float64).reshape(d)
        u: FloatArray = (xv - lo) / (hi - lo)
        return u

    if name == "sphere":

        def sphere(x: FloatArray) -> float:
            return float(-np.sum((unit(x) - centre) ** 2) / d)

        return sphere
    if name == "branin":
        if d < 2:
            raise InputDataError(f"branin needs a box of dimension >= 2, got {d}")

        def branin_objective(x: FloatArray) -> float:
            u = unit(x)
            x1 = -5.0 + 15.0 * float(np.clip(u[0] + offset[0], 0.0, 1.0))
            x2 = 15.0 * float(np.clip(u[1] + offset[1], 0.0, 1.0))
            rest = float(np.sum((u[2:] - centre[2:]) ** 2)) / d
            return float(-(branin(x1, x2) - BRANIN_MIN) / 50.0 - rest)

        return branin_objective
    raise InputDataError(f"objective must be one of {OBJECTIVES}, got {name!r}")
