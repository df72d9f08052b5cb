"""The error bounds of a GP whose factor is stored in float32 (``factor_dtype="float32"``).

A float32 factor halves the bytes the GP-UCB loop reads per step, and is not exact. ``Float32Bounds`` (a base
of ``shared.bo.gp.GaussianProcess``) bounds how far it moves the posterior from the float64 GP with the same
observations, in O(t) per step: ``float32_bounds`` derives the bound in its docstring, ``ucb_bound`` turns it
into a bound on GP-UCB's acquisition.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

__all__ = ["F32_UNIT", "Float32Bounds"]

#: float32's unit roundoff.
F32_UNIT = 2.0**-24


class SignalVariance(Protocol):
    """What the bounds read of the GP's hyper-parameters (``shared.bo.gp.Hyperparameters`` has it)."""

    @property
    def signal_variance(self) -> float: ...


class Float32Bounds:
    """The bounds, from the GP's state: its hyper-parameters, t, the weights ``w = L^{-1} y`` and
    ``u = L^{-1} 1``, and ``_err``, a bound per stored row of the factor on its distance to the float64
    row."""

    hp: SignalVariance
    factor_dtype: str
    t: int
    _w: FloatArray
    _u: FloatArray
    _err: FloatArray

    @property
    def m(self) -> float:
        """The constant prior mean in use (the GP's)."""
        raise NotImplementedError

    def _row_error_bound(self, lvec: FloatArray, l_tt: float) -> float:
        """A bound on ``max_j |stored row t - float64 row t|`` (``float32_bounds``): the error the rows read
        carry, amplified by ``|l| / l_tt``, plus sgemv's float32 sum and the rounding of l and of the row."""
        t = lvec.size
        s = math.sqrt(self.hp.signal_variance)
        gamma = t * F32_UNIT / (1.0 - t * F32_UNIT)
        kappa = F32_UNIT + gamma * (1.0 + F32_UNIT)
        abs_l = np.abs(lvec)
        before = ((1.0 + kappa) * float(abs_l @ self._err[:t]) + kappa * s * float(abs_l.sum())) / l_tt
        return before + F32_UNIT * (s + before)

    def float32_bounds(self) -> tuple[float, float]:
        """Bounds on how far a float32 factor moves the posterior from the float64 GP with the same
        observations: ``(max |mean difference|, max |variance difference|)`` over every candidate; (0, 0)
        for a float64 factor. First order in float64's unit roundoff (the float64 GP's own rounding is
        neglected beside float32's 2^-24).

        Derivation (u = 2^-24, s2 the signal variance): L, l, l_tt, w and u come from kernel values alone and
        are the same in both GPs; only the rows of A differ. Row t is ``(k - l^T A) / l_tt``; with A's rows
        off by at most e_i, l rounded to float32, sgemv's sum off by at most gamma_t sum |l_i| |A_i|
        (gamma_t = t u / (1 - t u), any summation order) and |A_i| <= s (sum_i A_i^2 = s2 - var <= s2), then
        rounded to float32: e_t <= e' + u (s + e') with e' = ((1 + kappa) sum |l_i| e_i + kappa s sum |l_i|)
        / l_tt, kappa = u + gamma_t (1 + u). The mean is ``m + sum_i (w_i - m u_i) A_i``, so it moves by at
        most ``sum_i (|w_i| + |m| |u_i|) e_i``; the variance ``s2 - sum_i A_i^2`` by at most
        ``2 s |e| + |e|^2`` (Cauchy-Schwarz: sum_i e_i |A_i| <= |e| s). ``ucb_bound`` turns them into a bound
        on GP-UCB's acquisition."""
        if self.factor_dtype != "float32" or self.t == 0:
            return 0.0, 0.0
        t, err = self.t, self._err[: self.t]
        mean = float(np.abs(self._w[:t]) @ err) + abs(self.m) * float(np.abs(self._u[:t]) @ err)
        norm = float(np.linalg.norm(err))
        return mean, 2.0 * math.sqrt(self.hp.signal_variance) * norm + norm * norm

    def ucb_bound(self, c: float, std: float | None = None) -> float:
        """A bound on ``|mean + c std - (the float64 GP's mean + c std)|`` (``float32_bounds``): over every
        candidate, or at a candidate whose (float32) std is ``std``, where ``|sqrt(a) - sqrt(b)| <=
        |a - b| / sqrt(b)`` sharpens the uniform ``sqrt(|a - b|)``."""
        mean, var = self.float32_bounds()
        spread = math.sqrt(var)
        if std is not None and std > 0:
            spread = min(spread, var / std)
        return mean + float(c) * spread
