"""Descent steps of DP-GIBO on the released (noisy) gradient, with projection onto the box.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 line 8 (gradient descent
theta - eta (g_t + sigma w_t)) and Remark 4.1 (AdaGrad on the privatised gradient, same privacy: it is
post-processing of the released g_t + sigma w_t). The projection onto the box bounds is also
post-processing; it is not in Algorithm 1, which has no constraint set.

Notation (shapes in brackets)::

    theta    [d]      current point;  g [d] released (noisy) gradient;  bounds [d, 2] (lo, hi)
    GD:      theta' = Pi_box(theta - eta g)
    AdaGrad: G_t = G_{t-1} + g * g (per coordinate, G_{-1} = 0)
             theta' = Pi_box(theta - eta g / (sqrt(G_t) + eps))
    Pi_box   coordinate-wise clip to [lo, hi]

Section 3.4 (noisy observations) changes nothing here: the paper accounts for the observation noise
sigma^2 in line 6 only (k(D, D) + sigma^2 I in the per-user posterior-mean gradient), which is
``GradientGP(..., noise_var=sigma^2)`` / ``run_dp_gibo(..., obs_noise_var=sigma^2)``; the descent step is the
same. The state of each updater is a JSON-serialisable dict (``to_state`` / ``from_state``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.kernels import as_theta
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["AdaGrad", "GradientDescent", "Updater", "make_updater", "project_to_bounds"]


def project_to_bounds(theta: npt.ArrayLike, bounds: npt.ArrayLike) -> FloatArray:
    """Coordinate-wise clip of theta [d] to bounds [d, 2]."""
    t = as_theta(theta)
    bd = np.asarray(bounds, dtype=np.float64)
    if bd.shape != (t.shape[0], 2) or not np.isfinite(bd).all() or not (bd[:, 0] <= bd[:, 1]).all():
        raise InputDataError(
            f"bounds must be finite, of shape [{t.shape[0]}, 2] with lo <= hi, got shape {bd.shape}"
        )
    out: FloatArray = np.clip(t, bd[:, 0], bd[:, 1])
    return out


def _check_lr(lr: float) -> None:
    if not (math.isfinite(lr) and lr > 0):
        raise InputDataError(f"learning rate must be a finite number > 0, got {lr!r}")


def _grad(g: npt.ArrayLike, d: int) -> FloatArray:
    out = np.asarray(g, dtype=np.float64)
    if out.shape != (d,) or not np.isfinite(out).all():
        raise InputDataError(f"gradient must be a finite vector of shape [{d}], got shape {out.shape}")
    return out


class Updater(Protocol):
    def step(self, theta: npt.ArrayLike, g: npt.ArrayLike, bounds: npt.ArrayLike) -> FloatArray: ...

    def to_state(self) -> dict[str, Any]: ...


@dataclass
class GradientDescent:
    """theta' = Pi_box(theta - lr g) (Alg. 1 line 8); stateless apart from lr."""

    lr: float

    def __post_init__(self) -> None:
        _check_lr(self.lr)

    def step(self, theta: npt.ArrayLike, g: npt.ArrayLike, bounds: npt.ArrayLike) -> FloatArray:
        t = as_theta(theta)
        return project_to_bounds(t - self.lr * _grad(g, t.shape[0]), bounds)

    def to_state(self) -> dict[str, Any]:
        return {"kind": "gd", "lr": float(self.lr)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GradientDescent:
        return cls(lr=float(state["lr"]))


@dataclass
class AdaGrad:
    """AdaGrad (Remark 4.1): per-coordinate accumulated squared released gradients."""

    lr: float
    eps: float = 1e-8
    accum: list[float] | None = field(default=None)

    def __post_init__(self) -> None:
        _check_lr(self.lr)
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise InputDataError(f"eps must be a finite number > 0, got {self.eps!r}")
        if self.accum is not None:
            a = np.asarray(self.accum, dtype=np.float64)
            if a.ndim != 1 or not np.isfinite(a).all() or (a < 0).any():
                raise InputDataError("AdaGrad accum must be a list of finite numbers >= 0")
            self.accum = [float(v) for v in a]

    def step(self, theta: npt.ArrayLike, g: npt.ArrayLike, bounds: npt.ArrayLike) -> FloatArray:
        t = as_theta(theta)
        gg = _grad(g, t.shape[0])
        acc = np.zeros(t.shape[0]) if self.accum is None else np.asarray(self.accum, dtype=np.float64)
        if acc.shape != gg.shape:
            raise InputDataError(f"AdaGrad state has dimension {acc.shape[0]}, gradient has {gg.shape[0]}")
        acc = acc + gg * gg
        self.accum = [float(v) for v in acc]
        return project_to_bounds(t - self.lr * gg / (np.sqrt(acc) + self.eps), bounds)

    def to_state(self) -> dict[str, Any]:
        return {"kind": "adagrad", "lr": float(self.lr), "eps": float(self.eps), "accum": self.accum}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> AdaGrad:
        acc = state.get("accum")
        return cls(lr=float(state["lr"]), eps=float(state["eps"]), accum=None if acc is None else list(acc))


def make_updater(state: dict[str, Any]) -> GradientDescent | AdaGrad:
    """Rebuild an updater from its ``to_state()`` dict."""
    kind = state.get("kind")
    if kind == "gd":
        return GradientDescent.from_state(state)
    if kind == "adagrad":
        return AdaGrad.from_state(state)
    raise InputDataError(f"updater kind must be 'gd' or 'adagrad', got {kind!r}")
