"""The lab's side of ``manual`` datasets: the queries waiting for a measurement (with the sample they are
about), measurements posted in bulk from a CSV, and the corrections of posted values. Admin only."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from shared.protocol.schemas.access import QueryCorrectionPublic, QueryPublic
from shared.protocol.schemas.common import QueryStatus

#: ``GET /v1/queries?status=``: what the lab's list may hold.
LabStatus = Literal["pending", "complete"]


class LabQueryPublic(BaseModel):
    """One query of a ``manual`` dataset as the lab sees it (``GET /v1/queries``; admin only)."""

    id: int
    release_id: int
    dataset_id: int
    dataset_name: str
    index: int = Field(description="Row index (0-based) in the dataset and its releases.")
    sample_id: str | None = Field(
        description="The row's id from the dataset's id column (`id_column` at upload); null when the "
        "dataset has none. Never shown to a partner."
    )
    partner_id: int
    partner_name: str
    status: QueryStatus
    y: float | None = Field(description="The current value as answered (null while pending).")
    created_at: datetime
    completed_at: datetime | None
    delivered_at: datetime | None = Field(
        description="When the partner was first sent the query complete: before it, a posted value may be "
        "corrected; after it, only superseded."
    )
    corrections: int = Field(description="How many times the value was corrected or superseded.")


class LabQueriesPublic(BaseModel):
    data: list[LabQueryPublic]
    count: int


class PostedLine(BaseModel):
    """One measurement line of a bulk upload and the queries it answered."""

    line: int = Field(description="Line number in the CSV (the header is line 1).")
    query_ids: list[int]


class ResultsPosted(BaseModel):
    """``POST /v1/queries/results``: every line's measurement, posted in one transaction."""

    count: int = Field(description="Queries answered.")
    lines: list[PostedLine]
    queries: list[QueryPublic] = Field(description="The queries answered, as the admin sees them.")


class CorrectionsPublic(BaseModel):
    """``GET /v1/releases/{id}/corrections``: changed outcomes in the order they were recorded."""

    data: list[QueryCorrectionPublic]
    count: int
