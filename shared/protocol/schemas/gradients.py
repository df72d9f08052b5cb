"""Private gradient oracles (DP-GIBO): the curator answers clipped, averaged, noised loss gradients.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 lines 5-8, Lemma 3.1. An oracle is created
by the curator's admin on one dataset with a loss, public bounds on theta, a clipping bound B (``clip``), a
mu-GDP budget ``mu`` for ``steps`` steps and a ``delta``; its whole cost (epsilon at delta) is charged to the
population's ledger at creation. A granted partner sends each step's data-independent inputs (theta, the new
batch of design points, the kernel) and gets only the noisy gradient.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.protocol.schemas.common import DELTA_MIN, Request

#: Most coordinates of an oracle's theta, points one step may add, and points a whole design may hold.
MAX_DIMENSION = 1000
MAX_POINTS_PER_STEP = 1001
MAX_DESIGN_POINTS = 20_000
MAX_STEPS = 100_000
#: Largest |value| of a bound, a coordinate or the clip (keeps every width and noise std a finite float).
MAX_MAGNITUDE = 1e12
#: Smallest mu: below it the noise std 2 B sqrt(T) / (n mu) stops being a meaningful finite number.
MU_MIN = 1e-6

Bound = list[float]


class GradientOracleCreate(Request):
    """``POST /v1/datasets/{id}/gradient-oracles`` (admin)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "loss": "logistic-regression",
                    "dimension": 10,
                    "intercept": True,
                    "bounds": [[-5.0, 5.0]] * 10,
                    "clip": 1.0,
                    "mu": 1.0,
                    "steps": 30,
                    "delta": 1e-5,
                }
            ]
        }
    )

    loss: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9._-]*$",
        description='"gaussian-location", "huber-regression", "logistic-regression", or the name of a '
        "plug-in loss the curator's operator registered in its settings.",
    )
    dimension: int = Field(ge=1, le=MAX_DIMENSION, description="Entries of theta.")
    bounds: list[Bound] = Field(
        min_length=1,
        max_length=MAX_DIMENSION,
        description="[[lo, hi] x dimension]: public box; every theta and design point must lie inside.",
    )
    clip: float = Field(
        gt=0,
        le=MAX_MAGNITUDE,
        allow_inf_nan=False,
        description="B: each row's gradient is clipped to norm B.",
    )
    mu: float = Field(
        ge=MU_MIN, le=1e3, allow_inf_nan=False, description="mu-GDP of all `steps` steps together."
    )
    steps: int = Field(ge=1, le=MAX_STEPS, description="T: how many steps the oracle answers.")
    delta: float = Field(ge=DELTA_MIN, lt=1, description="The delta at which mu is converted to epsilon.")
    intercept: bool = Field(
        default=False,
        description="huber-regression / logistic-regression: theta[0] multiplies a constant 1, so "
        "dimension = features + 1.",
    )
    delta_huber: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="huber-regression: the Huber constant c (1)."
    )
    weight_clip: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="huber-regression: the per-row loss weight min(1, weight_clip / ||x||^2) (2).",
    )

    @model_validator(mode="after")
    def _bounds_fit(self) -> GradientOracleCreate:
        if len(self.bounds) != self.dimension:
            raise ValueError(f"bounds must have one [lo, hi] per dimension: {self.dimension} pairs")
        for k, pair in enumerate(self.bounds):
            if len(pair) != 2 or not all(math.isfinite(v) for v in pair) or not pair[0] < pair[1]:
                raise ValueError(f"bounds[{k}] must be [lo, hi] with finite lo < hi")
            if max(abs(pair[0]), abs(pair[1])) > MAX_MAGNITUDE:
                raise ValueError(f"bounds[{k}] must lie within [-{MAX_MAGNITUDE:g}, {MAX_MAGNITUDE:g}]")
        if self.loss != "huber-regression" and (self.delta_huber is not None or self.weight_clip is not None):
            raise ValueError("delta_huber and weight_clip are parameters of huber-regression only")
        return self


class GradientOraclePublic(BaseModel):
    """An oracle as the admin and its granted partners see it (public parameters only)."""

    id: int
    dataset_id: int
    loss: str
    dimension: int
    bounds: list[Bound]
    clip: float
    mu: float
    steps: int
    steps_used: int
    steps_left: int
    epsilon: float = Field(description="What the whole oracle cost: mu-GDP converted at delta.")
    delta: float
    mu_spent: float = Field(description="mu * sqrt(steps_used / steps): the GDP of the steps answered.")
    n: int = Field(description="Rows the gradients average over.")
    noise_std: float = Field(
        description="Std of the Gaussian noise per coordinate: 2 clip sqrt(steps)/(n mu)."
    )
    intercept: bool
    delta_huber: float | None = None
    weight_clip: float | None = None
    created_at: datetime


class GradientOracleInfo(BaseModel):
    """The public parameters of the gradient oracle a study runs on, as the curator showed this partner
    when the study was created (``GET /v1/gradient-oracles/{id}``)."""

    id: int
    dataset_id: int
    loss: str
    dimension: int
    bounds: list[list[float]]
    clip: float = Field(description="B: each row's gradient is clipped to norm B.")
    mu: float = Field(description="mu-GDP of all the oracle's steps together.")
    steps: int = Field(description="T: how many steps the oracle answers in all.")
    steps_left: int = Field(description="Steps left when the study was created.")
    epsilon: float
    delta: float
    n: int = Field(description="Rows the gradients average over.")
    noise_std: float = Field(
        description="Std of the Gaussian noise per coordinate: 2 clip sqrt(steps)/(n mu)."
    )
    intercept: bool
    delta_huber: float | None = None
    weight_clip: float | None = None

    @classmethod
    def of(cls, oracle: GradientOraclePublic) -> GradientOracleInfo:
        """The part of the curator's answer a modeler's study keeps (and shows in ``StudyPublic``)."""
        return cls(**{name: getattr(oracle, name) for name in cls.model_fields})


class GradientOraclesPublic(BaseModel):
    data: list[GradientOraclePublic]
    count: int


class GradientKernel(Request):
    """The surrogate's kernel, chosen by the modeler; the curator fits nothing."""

    kind: Literal["se", "polynomial"]
    lengthscale: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="se (1).")
    signal_variance: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="se (1).")
    degree: int | None = Field(default=None, ge=1, le=10, description="polynomial (2).")
    offset: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="polynomial (1).")

    @model_validator(mode="after")
    def _fields_of_kind(self) -> GradientKernel:
        other = ("degree", "offset") if self.kind == "se" else ("lengthscale", "signal_variance")
        given = [name for name in other if getattr(self, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} do not belong to the {self.kind!r} kernel")
        return self

    def spec(self) -> dict[str, float | int | str]:
        """The kernel as ``shared.bo.gibo.oracle.kernel_from_spec`` reads it (defaults filled in)."""
        if self.kind == "se":
            return {
                "kind": "se",
                "lengthscale": self.lengthscale if self.lengthscale is not None else 1.0,
                "signal_variance": self.signal_variance if self.signal_variance is not None else 1.0,
            }
        return {
            "kind": "polynomial",
            "degree": self.degree if self.degree is not None else 2,
            "offset": self.offset if self.offset is not None else 1.0,
        }


class GradientStepCreate(Request):
    """One step's data-independent inputs. The design of step t is every point sent in steps 1..t, in order
    (Algorithm 1 line 5: D_t = D_{t-1} u Z_t); the gradient is the GP posterior mean's at ``theta``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "theta": [0.0, 0.0],
                    "points": [[0.1, 0.0], [0.0, 0.1], [-0.1, -0.1]],
                    "kernel": {"kind": "se", "lengthscale": 0.5},
                }
            ]
        }
    )

    theta: list[float] = Field(min_length=1, max_length=MAX_DIMENSION)
    points: list[list[float]] = Field(
        max_length=MAX_POINTS_PER_STEP, description="The new batch Z_t (may be empty after the first step)."
    )
    kernel: GradientKernel
    noise_var: float = Field(
        default=0.0, ge=0, le=1e6, allow_inf_nan=False, description="sigma^2 of s3.4 (noisy observations)."
    )
    jitter: float = Field(default=1e-8, ge=0, le=1e-2, allow_inf_nan=False, description="Diagonal jitter.")


class GradientStepResult(BaseModel):
    """The answer of a step: the noisy gradient and nothing else (no per-row value, no clip count)."""

    step: int
    gradient: list[float]
    steps_left: int


class GradientStepRecord(BaseModel):
    """One answered step, as listed for the admin (all) and the partner that asked (its own)."""

    step: int
    partner_id: int
    theta: list[float]
    points: list[list[float]]
    kernel: dict[str, float | int | str]
    noise_var: float
    gradient: list[float]
    idempotency_key: str | None
    created_at: datetime


class GradientStepsPublic(BaseModel):
    data: list[GradientStepRecord]
    count: int
