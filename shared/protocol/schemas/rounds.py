"""The wire schemas of a study's rounds and runs: a round's queries, a step's result and timings, a run's
request and acceptance (re-exported by ``shared.protocol.schemas.studies``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.protocol.schemas.common import Request

StudyStatus = Literal["ready", "running", "awaiting_measurement", "waiting_for_curator", "done", "failed"]


class PendingQuery(BaseModel):
    iteration: int = Field(description="The query number (seq) this request will have in the audit log.")
    index: int
    curator_query_id: int | None


class RoundQuery(BaseModel):
    """One request of a round and its answer so far."""

    request: int = Field(description="Position within the round, 0-based.")
    kind: str = Field(
        description='The request kind: "row" (a row\'s outcome) or "gradient" (a gradient step).'
    )
    index: int | None
    status: Literal["complete", "pending", "not_sent"]
    y: float | None
    curator_query_id: int | None
    details: dict[str, Any] = Field(description="The strategy's numbers that chose this request.")


class PendingRound(BaseModel):
    round: int
    queries: list[RoundQuery]


class StepTimings(BaseModel):
    """Server-side time of one step, in milliseconds (the GP arithmetic apart from the rest)."""

    gp_ms: float = Field(description="The strategy's arithmetic: plan + observe (posteriors, refits).")
    curator_ms: float = Field(description="The curator query round trip(s).")
    db_ms: float = Field(description="The modeler's own database transactions (intent, audit entry).")
    total_ms: float


class StepResult(BaseModel):
    """One round. A one-request round also fills the per-query fields of API v1 (``iteration``, ``index``,
    ``y`` and the strategy's ``acquisition``, ``beta``, ``mean``, ``std``, ``source`` when it reports them);
    with several requests they are null and ``queries`` has each one."""

    round: int
    queries: list[RoundQuery]
    status: Literal["complete", "pending"] = Field(description="complete when every request is answered.")
    iteration: int = Field(description="The query number (seq) of the round's last request.")
    index: int | None
    y: float | None
    acquisition: float | None = None
    beta: float | None = None
    mean: float | None = None
    std: float | None = None
    source: str | None = None
    curator_query_id: int | None
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
