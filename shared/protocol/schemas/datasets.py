"""Dataset metadata (never row data)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from shared.protocol.schemas.common import ObjectiveMode, ScalingInfo


class DatasetPublic(BaseModel):
    """Metadata of an uploaded dataset (never any row data)."""

    id: int
    name: str
    population_id: int = Field(description="The population whose budget this dataset's releases spend.")
    population_name: str | None = Field(description="Its declared name, if any.")
    population_reason: str | None = Field(
        description='Why the dataset belongs to that population: "declared", "new", or the match found '
        'at upload (e.g. "identical rows as dataset 3").'
    )
    n: int = Field(description="Number of data rows.")
    d: int = Field(description="Number of feature columns.")
    features: list[str]
    objective: str | None = Field(description="Name of the outcome column (stored apart, never released).")
    objective_mode: ObjectiveMode
    noise_std: float
    scaling: ScalingInfo
    sha256: str = Field(description="sha256 of the uploaded CSV file, as received.")
    features_sha256: str = Field(description="sha256 of the stored (scaled) float64 feature array.")
    epsilon_budget: float = Field(description="The population's epsilon budget (shared by its datasets).")
    delta_budget: float = Field(description="The population's delta budget (shared by its datasets).")
    epsilon_spent: float = Field(description="Spent from the population's budget, by any of its datasets.")
    delta_spent: float
    rows_per_person: int = Field(default=1, description="Declared: at most this many rows per person.")
    reference_factor: float = Field(
        default=1.0,
        description="How far this dataset's scaled row moves (Euclidean norm) when one person's row moves by "
        "1 in its population's relation (1: the same relation; above 1: its releases are charged more than "
        "their epsilon, e.g. finer declared scales, or two columns holding one feature in two units).",
    )
    acknowledged_distinct_people: bool = Field(
        default=False,
        description="The upload matched another population's people and the admin declared them distinct.",
    )
    id_column: str | None = Field(
        default=None,
        description="The column of sample ids named at upload (`id_column`): the ids are kept by the curator "
        "for the lab (`GET /v1/queries`), never a feature, never released.",
    )
    created_at: datetime
    erased_at: datetime | None = Field(
        default=None,
        description="When the dataset was erased (`DELETE /v1/datasets/{id}`): its rows, outcomes, sample "
        "ids and releases' files are gone; the record stays for the ledger and the query logs.",
    )


class DatasetsPublic(BaseModel):
    data: list[DatasetPublic]
    count: int
