"""How features are scaled before any release: this decides what the DP unit (norm 1) protects."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from curator_service.exceptions import InvalidInput

_SCALING_NOTES = {
    "none": "Features are released in the curator's units: neighbouring datasets differ in one row by "
    "Euclidean norm <= 1 in those units (formal guarantee holds).",
    "per_feature": "Column j was divided by the curator-declared scale s_j (unlisted features: s_j = 1); "
    "the DP unit is a row change of Euclidean norm <= 1 after that division (formal guarantee holds "
    "because the scales are declared, not computed from the data).",
    "max_norm": "Rows were rescaled so the largest row norm equals c (the paper's normalisation). The "
    "factor is computed from the data itself, so this release is OUTSIDE the formal (epsilon, delta) "
    "guarantee; use it to reproduce the paper, not to protect people.",
}


@dataclass(frozen=True)
class ScalingSpec:
    kind: str
    scales: dict[str, float] | None = None
    max_norm: float | None = None

    @property
    def formal_guarantee(self) -> bool:
        return self.kind != "max_norm"


def positive_finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise InvalidInput(f"{what} must be a finite number > 0, got {number!r}")
    return number


def parse_scaling(text: str | None) -> ScalingSpec:
    """``none`` | ``max_norm:<c>`` | a JSON object ``{"feature": scale, ...}``."""
    raw = (text or "none").strip()
    if raw == "none":
        return ScalingSpec("none")
    if raw.startswith("max_norm:"):
        try:
            c = float(raw.split(":", 1)[1])
        except ValueError:
            raise InvalidInput(
                f"scaling {raw!r}: expected max_norm:<c> with c a number > 0, e.g. max_norm:25"
            ) from None
        return ScalingSpec("max_norm", max_norm=positive_finite(c, "scaling max_norm c"))
    if raw.startswith("{"):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"scaling is not valid JSON: {exc.msg} at position {exc.pos}") from None
        if not isinstance(obj, dict) or not obj:
            raise InvalidInput("scaling JSON must be a non-empty object of feature name -> scale")
        scales = {str(k): positive_finite(v, f"scale of feature {k!r}") for k, v in obj.items()}
        return ScalingSpec("per_feature", scales=scales)
    raise InvalidInput(
        f'scaling must be "none", "max_norm:<c>" or a JSON object of per-feature scales, got {raw[:60]!r}'
    )


def scaling_public(stored: dict[str, Any]) -> dict[str, Any]:
    """The admin-visible part of a stored scaling record (drops the data-dependent factor)."""
    kind = stored["kind"]
    return {
        "kind": kind,
        "scales": stored.get("scales"),
        "max_norm": stored.get("max_norm"),
        "formal_guarantee": kind != "max_norm",
        "note": _SCALING_NOTES[kind],
    }


def covered_changes(stored: dict[str, Any], features: list[str]) -> list[tuple[str, float, float]]:
    """(feature, scale, covered change) per feature: the DP unit (norm 1 in scaled units) in the curator's
    own units, one feature at a time. A declared scale s_j covers a change of s_j; ``max_norm`` scaling
    multiplied every value by a data-dependent factor f, so it covers 1 / f (and no guarantee holds)."""
    kind = stored["kind"]
    if kind == "per_feature":
        divisors = stored.get("divisors") or [1.0] * len(features)
        return [(name, float(s), float(s)) for name, s in zip(features, divisors, strict=True)]
    if kind == "max_norm" and stored.get("factor"):
        inverse = 1.0 / float(stored["factor"])
        return [(name, inverse, inverse) for name in features]
    return [(name, 1.0, 1.0) for name in features]
