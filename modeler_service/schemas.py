"""Request and response bodies of the modeler API (``API.md``, modeler part; named fields are fixed)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from shared.protocol.schemas import Request

StudyStatus = Literal["ready", "running", "awaiting_measurement", "waiting_for_curator", "done", "failed"]
StrategyName = Literal["gp-ucb"]


class FixedHyperparameters(Request):
    """Fixed squared-exponential kernel hyper-parameters (in the units of the released Z)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"lengthscale": 1.5, "signal_variance": 1.0, "noise_variance": 1e-4}],
        },
    )

    lengthscale: float = Field(gt=0, allow_inf_nan=False, description="Kernel lengthscale l > 0.")
    signal_variance: float = Field(gt=0, allow_inf_nan=False, description="Signal variance s2 > 0.")
    noise_variance: float = Field(gt=0, allow_inf_nan=False, description="Observation noise variance > 0.")


class StudyCreate(Request):
    """A GP-UCB study over a curator release (PO-GP-UCB, Alg. 2)."""

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
                    "delta_prime": 0.05,
                    "hyperparameters": "mle",
                    "initial_points": 1,
                }
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
    release_id: int = Field(ge=1, le=2**31 - 1, description="The curator release to optimise over.")
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

    strategy: StrategyName = Field(default="gp-ucb", description="Optimisation strategy.")
    iterations: int = Field(ge=1, le=100_000, description="Query budget of the study (curator queries).")
    delta_prime: float = Field(default=0.05, gt=0, lt=1, description="GP-UCB confidence parameter delta'.")
    hyperparameters: Literal["mle"] | FixedHyperparameters = Field(
        default="mle", description='"mle" (refitted by maximum likelihood on a schedule) or fixed values.'
    )
    initial_points: int = Field(
        default=1, ge=1, le=10_000, description="Random rows queried first (they count as iterations)."
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        le=2**63 - 1,
        description="For benchmarks and tests only: seed of the modeler's own random initial rows "
        "(reproducibility). Leave unset in real studies (default: fresh OS entropy). Stored by the modeler, "
        "never sent to the curator, never shown; it has no effect on the curator's release or noise.",
    )
    exclude_queried: bool = Field(default=True, description="Never suggest a row twice.")


class BestPoint(BaseModel):
    index: int
    y: float


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


class PendingQuery(BaseModel):
    iteration: int
    index: int
    curator_query_id: int | None


class StudyPublic(BaseModel):
    id: str
    status: StudyStatus
    release_id: int
    curator_url: str
    n: int
    r: int
    strategy: StrategyName
    iterations_total: int
    iterations_done: int
    run_target: int | None = Field(description="iterations_done at which the current run stops.")
    delta_prime: float
    hyperparameters: Literal["mle"] | FixedHyperparameters
    initial_points: int
    exclude_queried: bool
    best: BestPoint | None
    pending: PendingQuery | None = Field(description="The iteration in flight, if any.")
    error: str | None = Field(
        description="failed: why (and what to do); waiting_for_curator: the last transient error."
    )
    retry_at: datetime | None = Field(
        default=None, description="waiting_for_curator: when the runner asks the curator again."
    )
    retry_attempts: int = Field(
        default=0, description="waiting_for_curator: failed attempts in a row (the backoff grows with them)."
    )
    release: ReleaseInfo
    created_at: datetime
    updated_at: datetime


class StudiesPublic(BaseModel):
    data: list[StudyPublic]
    count: int


class StepTimings(BaseModel):
    """Server-side time of one step, in milliseconds (the GP arithmetic apart from the rest)."""

    gp_ms: float = Field(description="suggest + observe (GP posterior, UCB, hyper-parameter refits).")
    curator_ms: float = Field(description="The curator query round trip(s).")
    db_ms: float = Field(description="The modeler's own database transactions (intent, audit entry).")
    total_ms: float


class StepResult(BaseModel):
    iteration: int
    index: int
    status: Literal["complete", "pending"]
    y: float | None
    acquisition: float
    beta: float
    mean: float
    std: float
    source: Literal["initial", "gp-ucb"]
    curator_query_id: int
    timings: StepTimings


class RunRequest(Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"iterations": 20}]})

    iterations: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="How many iterations to run (default: the rest of the budget).",
    )


class RunAccepted(BaseModel):
    id: str
    status: StudyStatus
    iterations_done: int
    run_target: int


class AuditEntryPublic(BaseModel):
    seq: int
    at: datetime
    iteration: int
    index: int
    y: float
    source: str
    acquisition: float
    beta: float
    mean: float
    std: float
    hyperparameters: dict[str, Any]
    curator_query_id: int
    prev_hash: str
    hash: str


class AuditLog(BaseModel):
    entries: list[AuditEntryPublic]
    count: int


class AuditVerification(BaseModel):
    ok: bool
    entries: int
    first_bad_seq: int | None


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    database: Literal["ok", "unreachable"]
