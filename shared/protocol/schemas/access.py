"""Partners, their grants and quotas, outcome queries, and the operational bodies (health, access log)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.protocol.schemas.common import ID_MAX, QueryStatus, Request, RowId

# --------------------------------------------------------------------------------------------- partners


class PartnerCreate(Request):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "modeler-lab", "release_ids": [1], "max_queries": 100}]},
    )

    name: str = Field(min_length=1, max_length=200)
    release_ids: list[RowId] = Field(
        default_factory=list, max_length=1000, description="Releases this partner may read."
    )
    max_queries: int = Field(ge=0, le=10**9, description="Query quota over all granted releases.")


class PartnerCreated(BaseModel):
    """Returned once, at creation: the only time the token is ever shown."""

    id: int
    name: str
    token: str
    release_ids: list[int]
    max_queries: int


class PartnerPublic(BaseModel):
    id: int
    name: str
    release_ids: list[int]
    max_queries: int
    queries_used: int
    revoked: bool
    created_at: datetime


class PartnersPublic(BaseModel):
    data: list[PartnerPublic]
    count: int


class GrantCreate(Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"release_ids": [2, 3]}]})

    release_ids: list[RowId] = Field(min_length=1, max_length=1000)


# ---------------------------------------------------------------------------------------------- queries


class QueryCreate(Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"index": 42}]})

    index: int = Field(ge=0, le=ID_MAX, description="Row index (0-based) into the release.")


class QueryPublic(BaseModel):
    id: int
    release_id: int
    partner_id: int
    index: int
    status: QueryStatus
    y: float | None
    idempotency_key: str | None = None
    created_at: datetime
    completed_at: datetime | None


class QueriesPublic(BaseModel):
    queries: list[QueryPublic]
    count: int


class QueryLogVerification(BaseModel):
    """``GET /v1/releases/{id}/queries/verify``: the release's query-log hash chain checked end to end."""

    ok: bool = Field(description="Every complete query is linked, in order, and the head matches.")
    entries: int = Field(description="Links checked (complete queries of the release).")
    first_bad_seq: int | None = Field(description="First chain position that does not check out, if any.")
    head: str = Field(description="sha256 of the last link as stored with the release (hex).")


class QueryResult(Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"y": 0.731}]})

    y: float = Field(description="The measured outcome (finite).")

    @field_validator("y")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("y must be a finite number")
        return value


# ----------------------------------------------------------------------------------------- operations


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    database: Literal["ok", "unreachable"]


class AccessLogEntry(BaseModel):
    id: int
    at: datetime
    actor: str = Field(description='"admin", "partner:<id>", or "anonymous" (a rejected token).')
    partner_id: int | None
    method: str
    path: str
    status_code: int
    duration_ms: float


class AccessLogPublic(BaseModel):
    entries: list[AccessLogEntry]
    count: int
