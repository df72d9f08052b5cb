"""Public request and response bodies of the pobo HTTP API (the curator part).

Both the curator service and its clients (the modeler's ``shared/client.py``) import these, so they are
pure pydantic: this module never imports FastAPI or SQLAlchemy. Field names follow ``API.md``; extra
fields only ever get added.

Privacy split (DESIGN.md): ``ReleasePublic`` is what a partner (the modeler) may see; ``ReleaseDetail``
adds the curator-private diagnostics (``sigma_min``, ``lifted``, the scaling) and is only served to the
curator's admin.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "AccessLogEntry",
    "AccessLogPublic",
    "DatasetPublic",
    "DatasetsPublic",
    "GrantCreate",
    "Health",
    "LiftMode",
    "ObjectiveMode",
    "PartnerCreate",
    "PartnerCreated",
    "PartnerPublic",
    "PartnersPublic",
    "PrivacyReport",
    "PrivacyRow",
    "QueriesPublic",
    "QueryCreate",
    "QueryPublic",
    "QueryResult",
    "QueryStatus",
    "ReleaseCreate",
    "ReleaseDetail",
    "ReleasePublic",
    "ReleaseRows",
    "ReleasesPublic",
    "ScalingInfo",
    "ScalingKind",
]

ObjectiveMode = Literal["column", "manual"]
LiftMode = Literal["auto", "always"]
QueryStatus = Literal["complete", "pending"]
ScalingKind = Literal["none", "per_feature", "max_norm"]


class _Request(BaseModel):
    """Request bodies reject unknown fields: a typo (or an attempt to pass a ``seed``) is a 422."""

    model_config = ConfigDict(extra="forbid")


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


class DatasetPublic(BaseModel):
    """Metadata of an uploaded dataset (never any row data)."""

    id: int
    name: str
    n: int = Field(description="Number of data rows.")
    d: int = Field(description="Number of feature columns.")
    features: list[str]
    objective: str | None = Field(description="Name of the outcome column (stored apart, never released).")
    objective_mode: ObjectiveMode
    noise_std: float
    scaling: ScalingInfo
    sha256: str = Field(description="sha256 of the uploaded CSV file, as received.")
    features_sha256: str = Field(description="sha256 of the stored (scaled) float64 feature array.")
    epsilon_budget: float
    delta_budget: float
    epsilon_spent: float
    delta_spent: float
    created_at: datetime


class DatasetsPublic(BaseModel):
    data: list[DatasetPublic]
    count: int


class PrivacyRow(BaseModel):
    r: int
    omega: float
    feasible: bool = Field(description="sigma_min >= omega(r): Algorithm 1 releases without lifting.")


class PrivacyReport(BaseModel):
    """Curator-private: the data-dependent sigma_min and which r avoid the singular-value lifting."""

    dataset_id: int
    epsilon: float
    delta: float
    sigma_min: float = Field(description="Smallest singular value of the centred, scaled features.")
    recommended_r: int | None = Field(description="Largest feasible r (the paper's guideline), or null.")
    table: list[PrivacyRow]
    epsilon_spent: float
    delta_spent: float
    epsilon_left: float
    delta_left: float
    fits_budget: bool = Field(description="Whether a release at (epsilon, delta) fits in the budget left.")
    scaling: ScalingInfo


# --------------------------------------------------------------------------------------------- releases


class ReleaseCreate(_Request):
    """Parameters of one (epsilon, delta)-DP random-projection release (Algorithm 1)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"epsilon": 1.0, "delta": 1e-4, "r": 15, "lift": "auto"}]},
    )

    epsilon: float = Field(
        ge=EPSILON_MIN,
        le=EPSILON_MAX,
        allow_inf_nan=False,
        description=f"Privacy parameter epsilon in [{EPSILON_MIN:g}, {EPSILON_MAX:g}].",
    )
    delta: float = Field(
        ge=DELTA_MIN, lt=1, description=f"Privacy parameter delta in [{DELTA_MIN:g}, 1)."
    )
    r: int = Field(ge=1, le=10_000, description="Dimension of the released rows.")
    lift: LiftMode = Field(
        default="auto",
        description='"auto": lift the singular values only when sigma_min < omega (the paper); '
        '"always": lift unconditionally (Blocki et al.), removing the data-dependent branch.',
    )


class ReleasePublic(BaseModel):
    """What a partner sees of a release: the public parameters only."""

    id: int
    dataset_id: int
    n: int
    r: int
    epsilon: float
    delta: float
    lift: LiftMode
    omega: float
    sha256: str = Field(description="sha256 of the release's .npy file (the bytes of GET .../rows as npy).")
    created_at: datetime


class ReleaseDetail(ReleasePublic):
    """The admin's view: adds the curator-private diagnostics."""

    lifted: bool
    sigma_min: float
    scaling: ScalingInfo
    formal_guarantee: bool = Field(description="False when the scaling was data-dependent (max_norm).")


class ReleasesPublic(BaseModel):
    data: list[ReleaseDetail | ReleasePublic]
    count: int


class ReleaseRows(BaseModel):
    rows: list[list[float]]
    sha256: str
    offset: int = 0
    n: int


# --------------------------------------------------------------------------------------------- partners


class PartnerCreate(_Request):
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


class GrantCreate(_Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"release_ids": [2, 3]}]})

    release_ids: list[RowId] = Field(min_length=1, max_length=1000)


# ---------------------------------------------------------------------------------------------- queries


class QueryCreate(_Request):
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


class QueryResult(_Request):
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
