"""The create-study form of the console, built from the strategies' parameter JSON schemas.

One input per property of a strategy's ``params_schema`` (``GET /v1/strategies``), named ``param.<name>``:
a number or integer is ``<input type=number>`` (with the schema's bounds), a boolean a checkbox, an enum a
``<select>``, a string a text input; anything else (an object, an array, a choice of shapes such as
``hyperparameters``: ``"mle"`` or fixed values) is a text input that takes JSON (or a bare string). An empty
input leaves the parameter to its default. No HTTP here: the pages call ``field_specs``, ``read_params`` and
``study_body``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from modeler_service.schemas import StrategyInfo, StudyCreate, target_field
from shared.bo.strategies import get_strategy

__all__ = ["FieldSpec", "FormProblems", "field_specs", "read_params", "split_tags", "study_body"]

#: The study fields of the form (besides the parameters); ``seed`` and the API v1 shorthands are not offered.
STUDY_FIELDS = (
    *("curator_url", "curator_token", "release_id", "gradient_oracle_id", "iterations", "strategy"),
    *("name", "tags"),
)


@dataclass
class FieldSpec:
    """One parameter input."""

    name: str
    label: str
    kind: str  # number | integer | boolean | enum | string | json
    description: str = ""
    required: bool = False
    nullable: bool = False
    default: Any = None
    has_default: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive: str = ""  # a note on exclusive bounds, for the hint
    options: list[str] = field(default_factory=list)
    value: str = ""  # what the input shows
    checked: bool = False  # boolean inputs

    @property
    def input_name(self) -> str:
        return f"param.{self.name}"

    @property
    def input_id(self) -> str:
        return f"param-{self.name}"

    @property
    def step(self) -> str:
        return "1" if self.kind == "integer" else "any"

    @property
    def default_text(self) -> str:
        if not self.has_default:
            return ""
        return _show(self.default)


class FormProblems(Exception):
    """The form's input is not valid: ``messages`` (field name -> messages), shown above the form."""

    def __init__(self, messages: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{k}: {m}" for k, m in messages))
        self.messages = messages


def _show(value: Any) -> str:
    """A default or a value as the input shows it (JSON for structures, plain text for scalars)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, separators=(", ", ": "))


def _simple(prop: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, bool]:
    """The property's single non-null shape (None: several shapes, or a $ref) and whether null is allowed."""
    if "anyOf" in prop:
        shapes = [s for s in prop["anyOf"] if s.get("type") != "null"]
        nullable = len(shapes) < len(prop["anyOf"])
        if len(shapes) == 1 and "$ref" not in shapes[0] and "anyOf" not in shapes[0]:
            return shapes[0], nullable
        return None, nullable
    if "oneOf" in prop or "$ref" in prop or "allOf" in prop:
        return None, False
    return prop, False


def field_specs(info: StrategyInfo) -> list[FieldSpec]:
    """The inputs of a strategy's parameters, in the schema's order, required ones first."""
    schema = info.params_schema
    required = set(schema.get("required", []))
    specs: list[FieldSpec] = []
    for name, prop in schema.get("properties", {}).items():
        shape, nullable = _simple(prop)
        spec = FieldSpec(
            name=name,
            label=str(prop.get("title") or name),
            kind="json",
            description=str(prop.get("description", "")),
            required=name in required,
            nullable=nullable,
            default=prop.get("default"),
            has_default="default" in prop,
        )
        if shape is not None:
            kind = shape.get("type")
            if "enum" in shape:
                spec.kind = "enum"
                spec.options = [str(o) for o in shape["enum"]]
            elif kind in ("number", "integer"):
                spec.kind = str(kind)
                low, high = shape.get("minimum"), shape.get("maximum")
                xlow, xhigh = shape.get("exclusiveMinimum"), shape.get("exclusiveMaximum")
                notes = []
                if low is None and xlow is not None:
                    low = xlow + 1 if kind == "integer" else xlow
                    if kind != "integer":
                        notes.append(f"> {_show(xlow)}")
                if high is None and xhigh is not None:
                    high = xhigh - 1 if kind == "integer" else xhigh
                    if kind != "integer":
                        notes.append(f"< {_show(xhigh)}")
                spec.minimum, spec.maximum, spec.exclusive = low, high, ", ".join(notes)
            elif kind == "boolean":
                spec.kind = "boolean"
            elif kind == "string" and "const" not in shape:
                spec.kind = "string"
        if spec.kind == "boolean":
            spec.checked = bool(spec.default) if spec.has_default else False
        elif spec.kind == "enum" and spec.has_default:
            spec.value = _show(spec.default)
        specs.append(spec)
    specs.sort(key=lambda s: not s.required)
    return specs


def fill(specs: list[FieldSpec], form: Mapping[str, Any]) -> None:
    """Show the values a submitted form had (after a refusal): the user corrects, not retypes."""
    for spec in specs:
        raw = form.get(spec.input_name)
        if spec.kind == "boolean":
            spec.checked = raw is not None
        elif isinstance(raw, str):
            spec.value = raw


def read_params(specs: list[FieldSpec], form: Mapping[str, Any]) -> dict[str, Any]:
    """``strategy_params`` from the form: each input coerced to its schema type; an empty input is left out
    (the default applies). ``FormProblems`` lists every input that is not of its type."""
    params: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for spec in specs:
        raw = form.get(spec.input_name)
        if spec.kind == "boolean":
            params[spec.name] = raw is not None
            continue
        text = raw.strip() if isinstance(raw, str) else ""
        if not text:
            continue
        if spec.kind == "integer":
            try:
                params[spec.name] = int(text)
            except ValueError:
                problems.append((spec.name, f"{text!r} is not a whole number"))
        elif spec.kind == "number":
            try:
                number = float(text)
            except ValueError:
                problems.append((spec.name, f"{text!r} is not a number"))
                continue
            if not math.isfinite(number):
                problems.append((spec.name, "must be a finite number"))
                continue
            params[spec.name] = number
        elif spec.kind == "json":
            try:
                params[spec.name] = json.loads(text)
            except ValueError:
                params[spec.name] = text  # a bare string ("mle")
        else:
            params[spec.name] = text
    if problems:
        raise FormProblems(problems)
    return params


def check_params(strategy: str, params: dict[str, Any]) -> None:
    """The strategy's own validation of ``params``, one message per bad input (``FormProblems``)."""
    try:
        get_strategy(strategy).Params.model_validate(params)
    except ValidationError as exc:
        raise FormProblems(
            [
                (".".join(str(p) for p in e.get("loc", ())) or "parameters", str(e.get("msg")))
                for e in exc.errors()
            ]
        ) from None


def _int(form: Mapping[str, Any], name: str, problems: list[tuple[str, str]]) -> int | None:
    raw = form.get(name)
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        problems.append((name, f"{text!r} is not a whole number"))
        return None


def split_tags(text: object) -> list[str]:
    """The tags typed in one text input, separated by commas and/or spaces (empty: none)."""
    if not isinstance(text, str):
        return []
    return [tag for tag in re.split(r"[\s,]+", text) if tag]


def study_body(form: Mapping[str, Any], strategy: StrategyInfo, params: dict[str, Any]) -> StudyCreate:
    """The ``StudyCreate`` of the form (``FormProblems`` for a bad field: the API's own validation)."""
    problems: list[tuple[str, str]] = []
    body: dict[str, Any] = {
        "curator_url": str(form.get("curator_url") or "").strip(),
        "curator_token": str(form.get("curator_token") or "").strip(),
        "strategy": strategy.name,
        "strategy_params": params,
    }
    source = target_field(strategy.runs_on)
    source_id = _int(form, source, problems)
    if source_id is not None:
        body[source] = source_id
    iterations = _int(form, "iterations", problems)
    if iterations is not None:
        body["iterations"] = iterations
    name = str(form.get("name") or "").strip()
    if name:
        body["name"] = name
    tags = split_tags(form.get("tags"))
    if tags:
        body["tags"] = tags
    if problems:
        raise FormProblems(problems)
    try:
        return StudyCreate.model_validate(body)
    except ValidationError as exc:
        messages = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e.get("loc", ())) or "study"
            messages.append((loc, str(e.get("msg"))))  # the message only: never the input (the token)
        raise FormProblems(messages) from None
