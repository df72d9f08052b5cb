"""The modeler's audit log as its API shows it (``GET /v1/studies/{id}/audit``, ``.../verify``, ``.../sync``):
the hash-chained entries of a study's answered requests and the supersessions recorded beside them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class AuditEntryPublic(BaseModel):
    seq: int
    at: datetime
    iteration: int = Field(description="Same as seq (API v1).")
    round: int
    request: int
    kind: str = Field(
        description='The request kind: "row" (a row\'s outcome) or "gradient" (a gradient step).'
    )
    index: int | None
    y: float | None
    details: dict[str, Any]
    acquisition: float | None = Field(default=None, description="details.acquisition, if reported.")
    beta: float | None = Field(default=None, description="details.beta, if reported.")
    mean: float | None = Field(default=None, description="details.mean, if reported.")
    std: float | None = Field(default=None, description="details.std, if reported.")
    curator_query_id: int = Field(description="The curator's query id (row) or step number (gradient).")
    hash_version: int
    prev_hash: str
    hash: str


class AuditSupersessionPublic(BaseModel):
    """A value the study had been sent and the curator then superseded (the lab re-measured the sample):
    both values, in a hash chain of its own beside the entries'. The strategy uses the latest value."""

    seq: int = Field(description="Position in the study's supersession chain (1, 2, ...).")
    at: datetime = Field(description="When the modeler recorded it.")
    correction_id: int = Field(
        description="The curator's id of the change (`GET /v1/releases/{id}/corrections`)."
    )
    curator_query_id: int
    audit_seq: int = Field(description="The `seq` (iteration) of the audit entry whose value it supersedes.")
    round: int
    request: int
    index: int | None = Field(description="The row of that entry.")
    previous_y: float = Field(
        description="The value it supersedes: the entry's `y`, or an earlier supersession's `y`."
    )
    y: float = Field(description="The new value, as the curator answered it.")
    curator_at: datetime = Field(description="When the curator recorded the change.")
    prev_hash: str
    hash: str


class AuditLog(BaseModel):
    entries: list[AuditEntryPublic]
    count: int
    supersessions: list[AuditSupersessionPublic] = Field(
        default_factory=list,
        description="Values of the entries above that the curator superseded after the study had been sent "
        "them, in the order recorded (`POST /v1/studies/{id}/audit/sync`; the runner records them after "
        "every round that waited for a measurement). Each entry keeps the value it was sent.",
    )


class AuditVerification(BaseModel):
    ok: bool = Field(description="Both chains verify: the entries' and the supersessions'.")
    entries: int
    first_bad_seq: int | None = Field(description="First entry that does not check out, if any.")
    supersessions: int = Field(default=0, description="Supersessions checked.")
    first_bad_supersession_seq: int | None = Field(
        default=None, description="First supersession that does not check out, if any."
    )


class AuditSync(BaseModel):
    """``POST /v1/studies/{id}/audit/sync``: the curator's supersessions of the study's values, recorded."""

    recorded: int = Field(description="Supersessions recorded by this call (0: the audit was current).")
    supersessions: int = Field(description="Supersessions in the study's audit log now.")
