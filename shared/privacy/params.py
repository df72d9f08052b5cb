"""Checks of the privacy parameters every mechanism takes (typed errors naming the value got)."""

from __future__ import annotations

import math

import numpy as np

from shared.errors import InputDataError

__all__ = ["check_epsilon_delta", "check_r"]


def check_epsilon_delta(epsilon: float, delta: float) -> tuple[float, float]:
    """(epsilon, delta) as floats: epsilon finite and > 0, 0 < delta < 1; booleans are not numbers."""
    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
            raise InputDataError(f"{name} must be a number, got {type(value).__name__}")
    eps, dlt = float(epsilon), float(delta)
    if not math.isfinite(eps) or eps <= 0:
        raise InputDataError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not (0.0 < dlt < 1.0):
        raise InputDataError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    return eps, dlt


def check_r(r: int) -> int:
    """r as an int >= 1 (a projection dimension)."""
    if isinstance(r, bool) or not isinstance(r, int | np.integer):
        raise InputDataError(f"r must be an integer >= 1, got {r!r} ({type(r).__name__})")
    if int(r) < 1:
        raise InputDataError(f"r must be an integer >= 1, got {r}")
    return int(r)
