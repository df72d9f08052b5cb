"""Request and response bodies of the modeler's study API (``API.md``, modeler part; named fields are fixed):
the contract the modeler serves and ``shared.protocol.client.ModelerClient`` reads."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

# the audit log's bodies (``audit``), re-exported: one study contract
from shared.protocol.schemas.audit import AuditEntryPublic as AuditEntryPublic
from shared.protocol.schemas.audit import AuditLog as AuditLog
from shared.protocol.schemas.audit import AuditSupersessionPublic as AuditSupersessionPublic
from shared.protocol.schemas.audit import AuditSync as AuditSync
from shared.protocol.schemas.audit import AuditVerification as AuditVerification
from shared.protocol.schemas.common import Request
from shared.protocol.schemas.gradients import GradientOracleInfo
from shared.protocol.schemas.rounds import PendingQuery as PendingQuery
from shared.protocol.schemas.rounds import PendingRound as PendingRound
from shared.protocol.schemas.rounds import RoundQuery as RoundQuery
from shared.protocol.schemas.rounds import RunAccepted as RunAccepted
from shared.protocol.schemas.rounds import RunRequest as RunRequest
from shared.protocol.schemas.rounds import StepResult as StepResult
from shared.protocol.schemas.rounds import StepTimings as StepTimings
from shared.protocol.schemas.rounds import StudyStatus as StudyStatus

#: The strategy of a study that names none (the API's documented default): PO-GP-UCB's GP-UCB.
DEFAULT_STRATEGY = "gp-ucb"


#: API v1 named these parameters at the top level of a study (they were GP-UCB's); they remain shorthands
#: for the ``strategy_params`` key of the same name, for the strategies that take it.
TOP_LEVEL_PARAMS = ("delta_prime", "hyperparameters", "initial_points", "exclude_queried")


def target_field(runs_on: str) -> str:
    """The ``StudyCreate`` field naming what a strategy runs on (``Strategy.runs_on``): ``<runs_on>_id``."""
    return runs_on.replace("-", "_") + "_id"


def _registry_enum(schema: dict[str, Any]) -> None:
    """The JSON schema of a strategy name: the registry's names when the schema is generated."""
    from shared.bo.strategies import REGISTRY  # the registry as it is when the schema is made

    schema["enum"] = sorted(REGISTRY)


#: A study's tags: at most this many, each 1-50 characters of these (``StudyCreate.tags``).
MAX_TAGS = 20
TAG_PATTERN = r"^[A-Za-z0-9_.:-]{1,50}$"
_TAG = re.compile(TAG_PATTERN)
_NAME_DESCRIPTION = (
    "A name for people (1-200 characters; leading and trailing spaces are dropped). Not unique: the id "
    "names the study. GET /v1/studies?name= finds it by a part of it."
)
_TAGS_DESCRIPTION = (
    f"Labels to find the study by (GET /v1/studies?tag=): at most {MAX_TAGS}, each 1-50 characters of "
    "letters, digits and '-', '_', '.', ':' (e.g. \"cohort-2024\", \"site:berlin\"). Kept as written, "
    "compared ignoring case; a repeat is dropped."
)


def check_tag(tag: str) -> str:
    """``tag`` if it is a valid tag, else a ValueError that says what a tag may be."""
    if not _TAG.fullmatch(tag):
        raise ValueError(
            f"tag {tag!r} is not a valid tag: use 1-50 characters of letters, digits, '-', '_', '.' or ':' "
            "(no spaces or commas; give several tags as several list items)"
        )
    return tag


def clean_tags(tags: list[str] | None) -> list[str] | None:
    """The tags checked (``check_tag``), at most ``MAX_TAGS``, repeats (ignoring case) dropped."""
    if tags is None:
        return None
    seen: dict[str, str] = {}
    for tag in tags:
        seen.setdefault(check_tag(tag).lower(), tag)
    if len(seen) > MAX_TAGS:
        raise ValueError(f"a study has at most {MAX_TAGS} tags, got {len(seen)}: drop some")
    return list(seen.values())


def clean_name(name: str | None) -> str | None:
    """The name without its surrounding spaces; one of spaces only is refused."""
    if name is None:
        return None
    stripped = name.strip()
    if not stripped:
        raise ValueError("name must have at least one character besides spaces (or leave it out)")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in stripped):
        raise ValueError("name must be one line of text without control characters")
    return stripped


def _name_field(description: str = _NAME_DESCRIPTION) -> Any:
    return Field(default=None, min_length=1, max_length=200, description=description)


def _tags_field(description: str = _TAGS_DESCRIPTION) -> Any:
    return Field(
        default=None,
        description=description,
        json_schema_extra={"maxItems": MAX_TAGS, "items": {"type": "string", "pattern": TAG_PATTERN}},
    )


def _words(runs_on: str) -> str:
    return runs_on.replace("-", " ")


class FixedHyperparameters(Request):
    """Fixed kernel hyper-parameters (API v1 shorthand; validated by the strategy)."""

    lengthscale: float = Field(gt=0, allow_inf_nan=False)
    signal_variance: float = Field(gt=0, allow_inf_nan=False)
    noise_variance: float = Field(gt=0, allow_inf_nan=False)


class StudyCreate(Request):
    """A study over a curator release (``release_id``), or for a strategy that runs on a gradient oracle
    (``dp-gibo``) over a curator gradient oracle (``gradient_oracle_id``), run by a strategy of the registry
    (``GET /v1/strategies``: each entry's ``runs_on`` says which of the two it needs)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "curator_url": "http://127.0.0.1:8001",
                    "release_id": 1,
                    "curator_token": "<partner token from the curator>",
                    "strategy": "gp-ucb",
                    "iterations": 50,
                    "strategy_params": {"delta_prime": 0.05, "hyperparameters": "mle", "initial_points": 1},
                },
                {
                    "curator_url": "http://127.0.0.1:8001",
                    "release_id": 1,
                    "curator_token": "<partner token from the curator>",
                    "strategy": "gp-bucb",
                    "iterations": 50,
                    "strategy_params": {"batch_size": 5},
                    "name": "Dose search, cohort A",
                    "tags": ["cohort-a", "site:berlin"],
                },
                {
                    "curator_url": "http://127.0.0.1:8001",
                    "gradient_oracle_id": 1,
                    "curator_token": "<partner token from the curator>",
                    "strategy": "dp-gibo",
                    "iterations": 20,
                    "strategy_params": {"updater": "adagrad", "tolerance": 0.01},
                },
            ]
        },
    )

    curator_url: str = Field(
        min_length=8,
        max_length=2048,
        # printable ASCII URL characters only (RFC 3986); an internationalised host goes in punycode
        pattern=r"^https?://[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+$",
        description="Base URL of the curator service (http:// or https://, ASCII).",
    )
    release_id: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="The curator release to optimise over (strategies that run on a release).",
    )
    gradient_oracle_id: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="The curator gradient oracle to optimise with (strategies that run on a gradient oracle: "
        "dp-gibo); give it instead of release_id.",
    )
    curator_token: SecretStr = Field(
        min_length=1,
        max_length=4096,
        description="Partner token for the curator (stored encrypted, never echoed).",
    )

    @field_validator("curator_token")
    @classmethod
    def _token_is_header_safe(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value()
        if not all(0x21 <= ord(c) <= 0x7E for c in token):
            raise ValueError("curator_token must be printable ASCII without spaces (a Bearer token)")
        return value

    strategy: str = Field(
        default=DEFAULT_STRATEGY,
        description="A strategy of the registry (GET /v1/strategies).",
        json_schema_extra=_registry_enum,
    )

    @field_validator("strategy")
    @classmethod
    def _registered(cls, value: str) -> str:
        """A name of the registry as it is when the request arrives (a plug-in may have added one)."""
        from shared.bo.strategies import get_strategy  # (a client never loads the strategies)

        get_strategy(value)  # InputDataError (a ValueError): names what the registry has
        return value

    strategy_params: dict[str, Any] = Field(
        default_factory=dict,
        description="The strategy's parameters, validated against its JSON schema (GET /v1/strategies); "
        "an unknown key or a bad value is a 422 that lists what the strategy accepts.",
    )
    iterations: int = Field(ge=1, le=100_000, description="Query budget of the study (curator queries).")
    delta_prime: float | None = Field(
        default=None, description="Shorthand for strategy_params.delta_prime (API v1)."
    )
    hyperparameters: Literal["mle"] | FixedHyperparameters | None = Field(
        default=None, description="Shorthand for strategy_params.hyperparameters (API v1)."
    )
    initial_points: int | None = Field(
        default=None, description="Shorthand for strategy_params.initial_points (API v1)."
    )
    exclude_queried: bool | None = Field(
        default=None, description="Shorthand for strategy_params.exclude_queried (API v1)."
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        le=2**63 - 1,
        description="For benchmarks and tests only: seed of the modeler's own random choices (the "
        "strategy's random first rows, the random strategy's draws). Leave unset in real studies (default: "
        "fresh OS entropy). Stored by the modeler, never sent to the curator, never shown; it has no effect "
        "on the curator's release or noise.",
    )
    name: str | None = _name_field()
    tags: list[str] | None = _tags_field()

    _name_ok = field_validator("name")(clean_name)
    _tags_ok = field_validator("tags")(clean_tags)

    @model_validator(mode="after")
    def _one_source(self) -> StudyCreate:
        """Exactly one target id, the one the strategy runs on: ``<runs_on>_id`` (``release_id``,
        ``gradient_oracle_id``)."""
        from shared.bo.strategies import REGISTRY

        cls = REGISTRY.get(str(self.strategy))
        runs_on = (cls or REGISTRY[DEFAULT_STRATEGY]).runs_on
        wanted = target_field(runs_on)
        for other in sorted({c.runs_on for c in REGISTRY.values()} - {runs_on}):
            field = target_field(other)
            if getattr(self, field, None) is not None:
                users = sorted(n for n, c in REGISTRY.items() if c.runs_on == other)
                raise ValueError(
                    f"strategy {self.strategy!r} runs on a curator {_words(runs_on)}, not a {_words(other)}: "
                    f"give {wanted} instead of {field} (strategies that use a {_words(other)}: "
                    f"{', '.join(users)})"
                )
        if getattr(self, wanted, None) is None:
            raise ValueError(
                f"strategy {self.strategy!r} runs on a curator {_words(runs_on)}: give {wanted} (the one the "
                "curator granted your partner token)"
            )
        return self

    def merged_params(self) -> dict[str, Any]:
        """``strategy_params`` with the top-level shorthands folded in (both given: a 422)."""
        params = dict(self.strategy_params)
        for key in TOP_LEVEL_PARAMS:
            value = getattr(self, key)
            if value is None:
                continue
            if key in params:
                raise ValueError(f"{key} is given both at the top level and in strategy_params: give it once")
            params[key] = value.model_dump() if isinstance(value, BaseModel) else value
        return params


class StrategyInfo(BaseModel):
    name: str
    description: str
    kinds: list[str] = Field(
        description='The request kinds it sends: "row" (a row\'s outcome by index) or "gradient" (a private '
        "gradient step of a curator gradient oracle)."
    )
    runs_on: str = Field(
        description="What a study of it needs: release_id (release) or gradient_oracle_id (gradient-oracle)."
    )
    params_schema: dict[str, Any] = Field(description="JSON schema of its strategy_params.")


class StrategiesPublic(BaseModel):
    strategies: list[StrategyInfo]


class BestPoint(BaseModel):
    """The best row so far: the largest outcome answered, a row played several times in one round (an
    epoch of MoMA-GP-UCB) counting with the mean of those answers. Under output privacy the answers are
    noisy, so this is the best *answer*, not the best row's true outcome.

    A gradient-oracle study (DP-GIBO) has no rows and no outcomes: its best is the current ``theta`` (what
    Algorithm 1 returns after the steps so far), with ``index`` and ``y`` null."""

    index: int | None
    y: float | None
    noisy: bool | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="Release studies: true when the grant privatises outcomes (CTL), so `y` is a noisy "
        "answer (the largest of many noisy answers overstates the row's outcome); false for raw answers. "
        "Absent when unknown (a study created before this field) and for gradient-oracle studies.",
    )
    posterior_mean: float | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="`GET /v1/studies/{id}` of a study with noisy answers: the strategy's posterior mean "
        "of the objective at `index` given every answer, the estimate of its true outcome (absent when "
        "the strategy keeps no model, e.g. `random`).",
    )
    theta: list[float] | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="Gradient-oracle studies only: the current theta (absent for release studies).",
    )


class ReleaseInfo(BaseModel):
    """The public parameters of the release the study runs on (what the curator showed this partner)."""

    id: int
    n: int
    r: int
    epsilon: float
    delta: float
    mechanism: Literal["gaussian", "po-gp-ucb"]
    formal_guarantee: bool = Field(description="Whether the curator's release carries a proven DP guarantee.")
    noise_std: float | None = Field(description="gaussian: noise std added to each scaled feature.")
    lift: str | None = Field(description="po-gp-ucb only.")
    omega: float | None = Field(description="po-gp-ucb only.")
    sha256: str


class StudyPublic(BaseModel):
    id: str
    name: str | None = Field(default=None, description="The study's name (null: none given).")
    tags: list[str] = Field(default_factory=list, description="The study's tags, as written.")
    status: StudyStatus
    release_id: int | None = Field(description="The release (null for a gradient-oracle study).")
    gradient_oracle_id: int | None = Field(
        default=None, description="The gradient oracle (gradient-oracle studies only, else null)."
    )
    curator_url: str
    n: int = Field(description="Rows of the release (gradient oracle: the rows its gradients average over).")
    r: int = Field(description="Columns of Z (gradient oracle: the dimension d of theta).")
    strategy: str
    strategy_params: dict[str, Any]
    iterations_total: int
    iterations_done: int
    rounds_done: int
    run_target: int | None = Field(description="iterations_done at which the current run stops.")
    best: BestPoint | None
    pending: PendingQuery | None = Field(description="The first unanswered request of the round in flight.")
    pending_round: PendingRound | None = Field(description="The round in flight, if any.")
    error: str | None = Field(
        description="failed: why (and what to do); waiting_for_curator: the last transient error."
    )
    retry_at: datetime | None = Field(
        default=None, description="waiting_for_curator: when the runner asks the curator again."
    )
    retry_attempts: int = Field(
        default=0, description="waiting_for_curator: failed attempts in a row (the backoff grows with them)."
    )
    release: ReleaseInfo | None = Field(
        description="The release's public parameters (null: gradient oracle)."
    )
    gradient_oracle: GradientOracleInfo | None = Field(
        default=None, description="The gradient oracle's public parameters (gradient-oracle studies only)."
    )
    created_at: datetime
    updated_at: datetime


class StudiesPublic(BaseModel):
    data: list[StudyPublic]
    count: int


def _header_safe(value: SecretStr | None) -> SecretStr | None:
    if value is not None and not all(0x21 <= ord(c) <= 0x7E for c in value.get_secret_value()):
        raise ValueError("curator_token must be printable ASCII without spaces (a Bearer token)")
    return value


class StudyUpdate(Request):
    """``PATCH /v1/studies/{id}``: a new partner token (rotated at the curator), a new budget, a new name
    or new tags (each optional; what is left out stays)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"iterations": 200},
                {"curator_token": "<the partner's new token>"},
                {"name": "Dose search, cohort A (final)", "tags": ["cohort-a", "final"]},
            ]
        },
    )

    curator_token: SecretStr | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="The partner's new token (after a rotation at the curator): checked against the "
        "curator, stored encrypted, used from the study's next request on; allowed while the study runs.",
    )
    iterations: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="The study's new query budget: at least the queries it has made, and what it adds "
        "must fit what the curator's grant has left (the partner's quota, the oracle's steps); not while the "
        "study runs. A done study with a larger budget is ready again (POST .../run).",
    )

    name: str | None = _name_field(
        "The study's new name (1-200 characters; null removes it); allowed in any status."
    )
    tags: list[str] | None = _tags_field(
        f"The study's new tags, replacing all of its tags ([] removes them; at most {MAX_TAGS}, each 1-50 "
        "characters of letters, digits, '-', '_', '.', ':'); allowed in any status."
    )

    _token_is_header_safe = field_validator("curator_token")(_header_safe)
    _name_ok = field_validator("name")(clean_name)
    _tags_ok = field_validator("tags")(clean_tags)

    @model_validator(mode="after")
    def _something(self) -> StudyUpdate:
        if self.curator_token is None and self.iterations is None and not self.relabels:
            raise ValueError("name what to change: curator_token, iterations, name and/or tags")
        return self

    @property
    def relabels(self) -> bool:
        """Whether it changes the name or the tags (a ``"name": null`` removes the name)."""
        return "name" in self.model_fields_set or self.tags is not None

    @property
    def asks_curator(self) -> bool:
        """Whether the change needs the curator (a new token or budget); a name or tags do not."""
        return self.curator_token is not None or self.iterations is not None
