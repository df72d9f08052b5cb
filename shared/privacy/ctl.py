"""CTL(epsilon): clip the outcome, then add Laplace noise -- the output mechanism of LDP-BO.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (AAAI 2021), Section 3, mechanism CTL and
Lemma 1: with f bounded by B (``|f(x)| <= B``) and the measurement noise by R, an outcome is clipped to
``[-(B + R), B + R]``; any two clipped outcomes differ by at most ``2 (B + R)``, so adding Laplace noise of
scale ``2 (B + R) / epsilon`` makes each answer epsilon-locally-DP for the person it is about::

    CTL(y) = clip(y, -(B + R), B + R) + Laplace(2 (B + R) / epsilon)

Clipping is what makes the sensitivity hold on real data: without it a measurement beyond B + R (an outlier,
a unit mistake) would leave through the noise. B and R are declared by the curator from domain knowledge and
are public; they must never be derived from the data (B = max |y| would publish the maximum).

The noise comes from OpenDP (``make_laplace``): it samples the discrete Laplace distribution on a grid of
2^k from a cryptographically secure generator seeded by the operating system on every call, and rounds the
input to that grid, which closes the floating-point attack on naive Laplace samplers (Mironov, CCS 2012).
There is no seed to set: a fresh draw in every forked worker, none reachable from a request. The epsilon a
curator charges per answer is OpenDP's privacy map at input distance ``2 (B + R)``: it accounts for the grid
rounding, so it is a hair above the nominal epsilon (``charged_epsilon``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError

__all__ = ["CTL"]


def _finite(name: str, value: float, *, positive: bool) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InputDataError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


@dataclass(frozen=True)
class CTL:
    """The CTL(epsilon) mechanism for outcomes bounded by ``B`` (the function) plus ``R`` (the noise).

    ``privatise(y)`` answers one or many outcomes, each about its own person; ``charged_epsilon`` is what one
    answer costs that person.
    """

    epsilon: float
    B: float
    R: float
    _measurements: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _finite("epsilon", self.epsilon, positive=True))
        object.__setattr__(self, "B", _finite("B", self.B, positive=False))
        object.__setattr__(self, "R", _finite("R", self.R, positive=False))
        if self.B + self.R <= 0:
            raise InputDataError("B + R must be > 0 (a bound on |f| plus a bound on the measurement noise)")

    @property
    def bound(self) -> float:
        """Outcomes are clipped to [-bound, bound], bound = B + R."""
        return self.B + self.R

    @property
    def sensitivity(self) -> float:
        """Largest difference of two clipped outcomes: 2 (B + R)."""
        return 2.0 * self.bound

    @property
    def scale(self) -> float:
        """Laplace scale 2 (B + R) / epsilon (LDP-BO, Lemma 1)."""
        return self.sensitivity / self.epsilon

    @property
    def noise_variance(self) -> float:
        """Variance of the Laplace noise added to a clipped outcome: 2 scale^2."""
        return 2.0 * self.scale * self.scale

    def _measurement(self, vector: bool) -> Any:
        key = "vector" if vector else "scalar"
        if key not in self._measurements:
            import opendp.prelude as dp

            dp.enable_features("contrib")
            atom = dp.atom_domain(T=float, nan=False)
            if vector:
                domain, metric = dp.vector_domain(atom), dp.l1_distance(T=float)
            else:
                domain, metric = atom, dp.absolute_distance(T=float)
            self._measurements[key] = dp.m.make_laplace(domain, metric, scale=self.scale)
        return self._measurements[key]

    @cached_property
    def charged_epsilon(self) -> float:
        """The epsilon one answer costs its person: OpenDP's privacy map at distance 2 (B + R)."""
        return float(self._measurement(vector=False).map(self.sensitivity))

    def clip(self, y: npt.ArrayLike) -> npt.NDArray[np.float64]:
        values = np.asarray(y, dtype=np.float64)
        if not np.isfinite(values).all():
            raise InputDataError("an outcome to privatise must be a finite number")
        return np.clip(values, -self.bound, self.bound)

    def privatise(self, y: float | npt.ArrayLike) -> Any:
        """CTL(y): clipped, plus fresh Laplace noise (OS entropy) -- a float for a float, else an array."""
        clipped = self.clip(y)
        if clipped.ndim == 0:
            return float(self._measurement(vector=False)(float(clipped)))
        flat = clipped.ravel().tolist()
        noisy = np.asarray(self._measurement(vector=True)(flat) if flat else [], dtype=np.float64)
        return noisy.reshape(clipped.shape)
