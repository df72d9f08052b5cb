"""Releases: what the curator publishes, and who may see which of its fields."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from shared.protocol.schemas.common import (
    DELTA_MIN,
    EPSILON_MAX,
    EPSILON_MIN,
    LiftMode,
    Mechanism,
    Request,
    ScalingInfo,
)

# --------------------------------------------------------------------------------------------- releases


NO_GUARANTEE_REASON = (
    "mechanism 'po-gp-ucb' (the paper's Algorithm 1) has no formal privacy guarantee when the dataset has "
    "more rows than features + 1: its output lies in the column space of the data, so two datasets that "
    "differ in one row are told apart with certainty, and anyone who knows d + 1 rows can reconstruct every "
    "row when r >= d"
)


class ReleaseCreate(Request):
    """Parameters of one release: the Gaussian mechanism (default) or the paper's Algorithm 1."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"epsilon": 1.0, "delta": 1e-5},
                {"epsilon": 2.0, "delta": 1e-6, "r": 5},
                {
                    "epsilon": 5.5,
                    "delta": 1e-4,
                    "r": 21,
                    "mechanism": "po-gp-ucb",
                    "lift": "auto",
                    "acknowledge_no_guarantee": True,
                },
            ]
        },
    )

    epsilon: float = Field(
        ge=EPSILON_MIN,
        le=EPSILON_MAX,
        allow_inf_nan=False,
        description=f"Privacy parameter epsilon in [{EPSILON_MIN:g}, {EPSILON_MAX:g}].",
    )
    delta: float = Field(
        ge=DELTA_MIN,
        lt=1,
        description=f"Privacy parameter delta in [{DELTA_MIN:g}, 1); below 1/n unless allow_large_delta.",
    )
    r: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="gaussian: optional; r < d adds a random projection to r dimensions (post-processing). "
        "po-gp-ucb: required, the dimension of the released rows.",
    )
    mechanism: Mechanism = Field(
        default="gaussian",
        description='"gaussian" (default): Gaussian noise on the scaled rows, (epsilon, delta)-DP. '
        '"po-gp-ucb": the paper\'s Algorithm 1, kept to reproduce the paper; NOT differentially private '
        "when n > d + 1, needs acknowledge_no_guarantee.",
    )
    lift: LiftMode | None = Field(
        default=None,
        description='po-gp-ucb only. "auto" (default): lift the singular values only when sigma_min < omega '
        '(the paper; a data-dependent branch); "always": lift unconditionally (Blocki et al.).',
    )
    acknowledge_no_guarantee: StrictBool = Field(
        default=False,
        description="Required true for po-gp-ucb: the curator acknowledges that it carries no guarantee.",
    )
    allow_large_delta: StrictBool = Field(
        default=False,
        description="Needed for delta >= 1/n (such a delta allows publishing a whole row with probability "
        "delta); recorded on the release.",
    )

    @model_validator(mode="after")
    def _mechanism_fields(self) -> ReleaseCreate:
        if self.mechanism == "po-gp-ucb":
            if self.r is None:
                raise ValueError(
                    "r is required for mechanism 'po-gp-ucb' (the dimension of the released rows)"
                )
            if not self.acknowledge_no_guarantee:
                raise ValueError(
                    f'{NO_GUARANTEE_REASON}; send "acknowledge_no_guarantee": true to release it anyway, '
                    "or use the default mechanism 'gaussian'"
                )
            if self.lift is None:
                self.lift = "auto"
        elif self.lift is not None:
            raise ValueError("lift applies only to mechanism 'po-gp-ucb'; a Gaussian release has no lifting")
        return self


class ReleasePublic(BaseModel):
    """What a partner sees of a release: the public parameters only."""

    id: int
    dataset_id: int
    mechanism: Mechanism
    formal_guarantee: bool = Field(
        description="True only for a Gaussian release of declared-scale data with delta < 1/n: then the "
        "release is (epsilon, delta)-DP for one row moving by norm <= 1 in scaled units."
    )
    n: int
    r: int
    epsilon: float
    delta: float
    noise_std: float | None = Field(
        description="gaussian: standard deviation of the noise added to each scaled feature (before any "
        "projection). Null for po-gp-ucb."
    )
    lift: LiftMode | None = Field(description="po-gp-ucb only.")
    omega: float | None = Field(description="po-gp-ucb only: Algorithm 1's lifting threshold.")
    sha256: str = Field(description="sha256 of the release's .npy file (the bytes of GET .../rows as npy).")
    created_at: datetime


class ReleaseDetail(ReleasePublic):
    """The admin's view: adds the curator-private diagnostics and what was acknowledged."""

    lifted: bool | None = Field(description="po-gp-ucb only: whether the singular values were lifted.")
    sigma_min: float | None = Field(description="po-gp-ucb only: data-dependent, curator-private.")
    scaling: ScalingInfo
    allow_large_delta: bool
    acknowledged_no_guarantee: bool


class ReleasesPublic(BaseModel):
    data: list[ReleaseDetail | ReleasePublic]
    count: int


class ReleaseRows(BaseModel):
    rows: list[list[float]]
    sha256: str
    offset: int = 0
    n: int


class RowExclusions(BaseModel):
    """The rows of a release that the caller's grant can no longer be answered about (``GET
    /v1/releases/{id}/exclusions``): their person's output allotment under this grant
    (``max_epsilon_per_row``) leaves no room for one more charged answer. What it lists depends only on the
    curator's settings and the grant's own answers, never on another partner's queries."""

    release_id: int
    n: int = Field(description="Rows in the release.")
    excluded: list[int] = Field(
        description="Row indices this grant cannot be answered about any more (empty when `only_allowed` "
        "is set)."
    )
    only_allowed: list[int] | None = Field(
        description="When not null, every row *not* listed here is excluded: no new person can afford an "
        "answer (this grant's answers about the same people in the population's other datasets count "
        "towards each person's bound); the listed rows have a cached answer, repeated at no charge."
    )
    max_epsilon_per_row: float | None = Field(
        description="The grant's per-person allotment; null: no cap, nothing is ever excluded."
    )
    charged_epsilon: float | None = Field(description="What one answer costs its person; null: raw answers.")
    statement: str = Field(description="The rule, in one paragraph.")
