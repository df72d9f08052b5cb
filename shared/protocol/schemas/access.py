"""Partners, their grants and quotas, outcome queries, and the operational bodies (health, access log)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.protocol.schemas.common import EPSILON_MAX, EPSILON_MIN, ID_MAX, QueryStatus, Request, RowId

# --------------------------------------------------------------------------------------------- partners


class OutputPrivacy(Request):
    """CTL(epsilon) on every outcome answered to the partner (LDP-BO, Zhou & Tan 2021, Lemma 1).

    Each outcome is clipped to ``[-(B + R), B + R]`` and gets Laplace noise of scale ``2 (B + R) / epsilon``
    (OpenDP's sampler). ``B`` bounds ``|f|`` and ``R`` the measurement noise: the curator declares both from
    domain knowledge; they are public (the partner's strategy needs them) and must never be computed from
    the data (``B = max |y|`` would publish the maximum).
    """

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={"examples": [{"epsilon": 1.0, "B": 90.0, "R": 10.0}]},
    )

    epsilon: float = Field(
        ge=EPSILON_MIN, le=EPSILON_MAX, allow_inf_nan=False, description="Output epsilon per answer."
    )
    B: float = Field(ge=0, le=1e15, allow_inf_nan=False, description="Declared bound on |f| (public).")
    R: float = Field(ge=0, le=1e15, allow_inf_nan=False, description="Declared bound on the noise (public).")
    fresh_repeats: bool = Field(
        default=False,
        description="false (default): a repeated query of a row returns the row's cached noisy answer, "
        "free (fresh answers could be averaged back to y). true: every query gets fresh noise and is "
        "charged, up to max_epsilon_per_row (required then).",
    )
    max_epsilon_per_row: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Cap on one person's output epsilon, summed over every answer about them in the "
        "population (every grant, partner and dataset); a query past it is refused with 409, uncharged.",
    )
    store_raw: bool = Field(
        default=False,
        description="Keep the measured outcome beside the answer (curator-only, never served). Default: "
        "not stored; the query log's hash chain covers the privatised answer.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> OutputPrivacy:
        if self.B + self.R <= 0:
            raise ValueError("B + R must be > 0 (a bound on |f| plus a bound on the measurement noise)")
        if self.fresh_repeats and self.max_epsilon_per_row is None:
            raise ValueError(
                "fresh_repeats needs max_epsilon_per_row: fresh answers about one person add up, so set the "
                "most output epsilon one person may spend (e.g. 10 x epsilon for 10 fresh answers)"
            )
        return self


class OutputPrivacyPublic(BaseModel):
    """A partner's output privacy as granted, with the epsilon each answer is charged."""

    epsilon: float
    B: float
    R: float
    fresh_repeats: bool
    max_epsilon_per_row: float | None
    store_raw: bool
    clip: float = Field(description="Outcomes are clipped to [-clip, clip], clip = B + R.")
    laplace_scale: float = Field(description="2 (B + R) / epsilon.")
    charged_epsilon: float = Field(
        description="What one answer costs its person: OpenDP's privacy map of the sampler at distance "
        "2 (B + R) (a hair above epsilon: it accounts for the sampler's grid rounding)."
    )


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
    gradient_oracle_ids: list[RowId] = Field(
        default_factory=list, max_length=1000, description="Gradient oracles this partner may step (DP-GIBO)."
    )
    output_privacy: OutputPrivacy | None = Field(
        default=None,
        description="CTL(epsilon) on every outcome answered to this partner; absent: outcomes are "
        "answered as measured (their output epsilon is unbounded).",
    )


class PartnerUpdate(Request):
    """``PATCH /v1/partners/{id}``: what may change in a partner after it was created."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"max_queries": 500}]})

    max_queries: int | None = Field(
        default=None,
        ge=0,
        le=10**9,
        description="The new query quota over all granted releases: raised, or lowered to no less than the "
        "queries the partner has used.",
    )

    output_privacy: OutputPrivacy | None = Field(
        default=None,
        description="The partner's new output privacy. Tighter is always allowed (raw answers to CTL, a "
        "charge per answer no larger, fresh repeats not newly allowed, a per-row cap added or lowered). "
        "Looser only with a per-row cap (max_epsilon_per_row) before and after: within it, free; a larger "
        "cap is charged (the rise, delta 0) to the budget of each population whose releases the partner "
        "holds, 409 when one has no room. Answers already given keep their charges.",
    )

    @model_validator(mode="after")
    def _something(self) -> PartnerUpdate:
        if not self.model_fields_set & {"max_queries", "output_privacy"}:
            raise ValueError("name what to change: max_queries and/or output_privacy")
        if "max_queries" in self.model_fields_set and self.max_queries is None:
            raise ValueError("max_queries must be a number (the new quota)")
        return self


class PartnerCreated(BaseModel):
    """Returned once, at creation: the only time the token is ever shown."""

    id: int
    name: str
    token: str
    release_ids: list[int]
    max_queries: int
    output_privacy: OutputPrivacyPublic | None = None
    gradient_oracle_ids: list[int] = Field(default_factory=list)


class PartnerPublic(BaseModel):
    id: int
    name: str
    release_ids: list[int]
    max_queries: int
    queries_used: int
    revoked: bool
    created_at: datetime
    output_privacy: OutputPrivacyPublic | None = Field(
        default=None, description="CTL parameters of the partner's answers; null: answered raw."
    )
    gradient_oracle_ids: list[int] = Field(
        default_factory=list, description="Gradient oracles this partner may step (DP-GIBO)."
    )


class TokenCreated(BaseModel):
    """``POST /v1/partners/{id}/tokens``: a new bearer token of the partner, shown this once. The partner's
    other tokens stay valid until they are revoked (``DELETE /v1/partners/{id}/tokens/{token_id}``)."""

    id: int = Field(description="The token's id (to revoke it later); never the token itself.")
    partner_id: int
    token: str
    created_at: datetime


class TokenPublic(BaseModel):
    """One of a partner's tokens, without the token (the curator keeps only its hash)."""

    id: int
    partner_id: int
    created_at: datetime
    revoked: bool


class TokensPublic(BaseModel):
    data: list[TokenPublic]
    count: int


class PartnersPublic(BaseModel):
    data: list[PartnerPublic]
    count: int


class GrantCreate(Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"release_ids": [2, 3]}]})

    release_ids: list[RowId] = Field(default_factory=list, max_length=1000)
    gradient_oracle_ids: list[RowId] = Field(default_factory=list, max_length=1000)

    @model_validator(mode="after")
    def _something(self) -> GrantCreate:
        if not self.release_ids and not self.gradient_oracle_ids:
            raise ValueError("name at least one id in release_ids or gradient_oracle_ids")
        return self


# ---------------------------------------------------------------------------------------------- queries


class QueryCreate(Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"index": 42}]})

    index: int = Field(ge=0, le=ID_MAX, description="Row index (0-based) into the release.")


CorrectionKind = Literal["correction", "supersession"]


class QueryCorrectionPublic(BaseModel):
    """A changed outcome of a completed query (``POST /v1/queries/{id}/corrections``).

    ``correction``: the value was replaced before any partner was sent it (the partner only ever sees the
    new one; shown to the admin alone). ``supersession``: the partner had been sent ``previous_y``; ``y``
    is a new answer about the same person, recorded beside the old one in both parties' logs.
    """

    id: int
    query_id: int
    release_id: int
    kind: CorrectionKind
    previous_y: float = Field(description="The value replaced, as it was answered (privatised under CTL).")
    y: float = Field(description="The new value, as answered (privatised afresh under CTL).")
    charged_epsilon: float | None = Field(
        description="Output epsilon the new answer cost its person: a supersession under output privacy is "
        "one more answer (charged); null for a raw grant's supersession (unbounded) and for a correction "
        "(no answer had been sent)."
    )
    created_at: datetime
    chain_seq: int = Field(description="Its position in the release's query-log hash chain.")
    reason: str | None = Field(default=None, description="Admin view only: the lab's reason for the change.")


class QueryPublic(BaseModel):
    id: int
    release_id: int
    partner_id: int
    index: int
    status: QueryStatus
    y: float | None = Field(
        description="The outcome as answered: privatised (CTL) when the partner has output privacy."
    )
    idempotency_key: str | None = None
    created_at: datetime
    completed_at: datetime | None
    charged_epsilon: float | None = Field(
        default=None,
        description="Output epsilon this answer cost its person: null for a raw answer, 0 for a cached "
        "repeat.",
    )
    cached: bool | None = Field(
        default=None,
        description="Admin view only (null for a partner): answered with the partner's earlier noisy answer "
        "about the row (no fresh noise, no cost).",
    )
    corrections: list[QueryCorrectionPublic] = Field(
        default_factory=list,
        description="Changes of `y` after the query completed, oldest first; `y` above is the current value. "
        "A partner sees its supersessions (values it had been sent, then replaced); the admin sees "
        "corrections made before delivery too.",
    )
    delivered_at: datetime | None = Field(
        default=None,
        description="Admin view only: when a partner was first sent the query complete (until then a "
        "posted value may be corrected; afterwards it can only be superseded).",
    )


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


class QueryCorrectionCreate(QueryResult):
    """A new value for a completed ``manual`` query: the lab re-measured the sample, or a value was typed
    wrong."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"y": 0.713, "reason": "typo: 0.731 entered for 0.713"}]},
    )

    y: float = Field(description="The corrected measured outcome (finite).")
    reason: str = Field(
        min_length=1,
        max_length=500,
        description="Why the value changes (kept in the curator's query log; never shown to the partner). "
        "Do not put sample ids or other personal data here.",
    )

    @field_validator("reason")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("reason must not be blank: say why the value changes")
        return value.strip()


# ----------------------------------------------------------------------------------------- operations


class AccessLogEntry(BaseModel):
    id: int
    at: datetime
    actor: str = Field(
        description='"admin", "partner:<id>", or "anonymous" (a rejected token or console sign-in); a '
        'console action: "admin@console:<session tag>" (one tag per sign-in; the path is the console\'s).'
    )
    partner_id: int | None
    method: str
    path: str
    status_code: int
    duration_ms: float


class AccessLogPublic(BaseModel):
    entries: list[AccessLogEntry]
    count: int
