"""Types and bounds shared by the wire schemas (pure pydantic, like the whole package)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ObjectiveMode = Literal["column", "manual"]
LiftMode = Literal["auto", "always"]
Mechanism = Literal["gaussian", "po-gp-ucb"]
QueryStatus = Literal["complete", "pending"]
ScalingKind = Literal["none", "per_feature", "max_norm"]


class Request(BaseModel):
    """Base of every request body of both services.

    Unknown fields are refused (a typo, or an attempt to pass a ``seed``, is a 422), and types are strict:
    a client's mistake is never silently coerced (``{"index": true}`` or ``{"index": "12"}`` is a 422, not
    row 1 or 12; an integer field refuses 2.0); an integer is still accepted where a number is expected.
    Subclasses' ``model_config`` is merged with this one by pydantic.
    """

    model_config = ConfigDict(extra="forbid", strict=True)


# --------------------------------------------------------------------------------------------- datasets


#: Bounds of a release's epsilon: below EPSILON_MIN omega = 16 sqrt(r) ln(2/delta) ln(16 r/delta) / epsilon
#: stops being a finite float64 for tiny delta; above EPSILON_MAX there is no privacy left to speak of.
EPSILON_MIN = 1e-6
EPSILON_MAX = 1e6
#: Database ids and row indices are 32-bit integers (PostgreSQL INTEGER).
ID_MAX = 2**31 - 1
RowId = Annotated[int, Field(ge=1, le=ID_MAX)]
#: Smallest delta: below it 2/delta (inside omega's logarithms) overflows float64.
DELTA_MIN = 1e-300


class ScalingInfo(BaseModel):
    """How the features were scaled before any release (this decides what the DP unit protects).

    Neighbouring datasets differ in one row by Euclidean norm <= 1 *in the scaled units*:

    * ``none``: the curator's own units are the DP unit (formal guarantee holds).
    * ``per_feature``: column j was divided by the curator-declared ``scales[j]`` (features not listed keep
      scale 1). Declared, data-independent scales keep the formal guarantee.
    * ``max_norm``: every row was multiplied by ``max_norm / max_i ||x_i||`` so the largest row norm is
      ``max_norm`` (the paper's normalisation). The factor depends on the data itself, so this path is
      **outside the formal (epsilon, delta) guarantee**; it exists to reproduce the paper.
    """

    kind: ScalingKind
    scales: dict[str, float] | None = None
    max_norm: float | None = None
    formal_guarantee: bool
    note: str
