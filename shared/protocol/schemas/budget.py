"""What privacy costs and protects: populations and their budgets, the ledger, the privacy report."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.protocol.schemas.common import Mechanism, ScalingInfo


class PopulationBudget(BaseModel):
    """A population's budget and what its datasets have spent of it (basic composition)."""

    dataset_ids: list[int] = Field(description="The datasets of the population (all spend from this budget).")
    epsilon_budget: float
    delta_budget: float
    epsilon_spent: float
    delta_spent: float
    epsilon_pld: float | None = Field(
        default=None,
        description="Informational: the spent charges composed with privacy loss distributions "
        "(dp-accounting) at delta_spent, tighter than the sum; null when nothing was spent, or when a charge "
        "carried no guarantee (formal_guarantee false: no finite epsilon holds). The budget itself is "
        "enforced by the plain sums.",
    )
    formal_guarantee: bool = Field(
        default=True,
        description="False once any charge of the population carried no proven guarantee (a po-gp-ucb "
        "release, an allow_large_delta release, a release of max_norm-scaled data): the epsilons spent are "
        "then labels, not a bound.",
    )
    smallest_n: int | None = Field(
        default=None,
        description="The fewest rows of any dataset of the population; the population's total delta (spent "
        "plus asked) must stay below 1 / smallest_n unless a release sends allow_large_delta.",
    )


class ReferenceColumn(BaseModel):
    """One feature of a population's neighbouring relation: its declared scale at its first upload."""

    feature: str = Field(description="The feature's name in the dataset that introduced it.")
    scale: float = Field(
        description="One unit of the relation, in that dataset's own units of the feature (its declared "
        "scale; 1 when none was declared)."
    )
    dataset_id: int = Field(description="The dataset that introduced the feature.")


class PopulationPublic(PopulationBudget):
    """The people behind one or more datasets, and their budget (admin only)."""

    id: int
    name: str | None = Field(description="The declared name (upload field `population`), or null.")
    reference: list[ReferenceColumn] = Field(
        default_factory=list,
        description="The population's neighbouring relation: one person's row moves by Euclidean norm <= 1 "
        "in these units. Every release of every dataset of the population is charged in them.",
    )
    created_at: datetime


class PopulationsPublic(BaseModel):
    data: list[PopulationPublic]
    count: int


class PrivacyRow(BaseModel):
    r: int
    omega: float
    feasible: bool = Field(description="sigma_min >= omega(r): Algorithm 1 releases without lifting.")


class FeatureProtection(BaseModel):
    """What a unit of the DP relation means for one feature, in the curator's own units."""

    feature: str
    scale: float = Field(description="Divisor applied before release (1 when the feature was not scaled).")
    covered_change: float = Field(
        description="The change of this feature alone (curator's units) that the guarantee covers at the "
        "release's epsilon: the DP unit (norm 1 in scaled units) expressed in this feature."
    )
    reference_change: float | None = Field(
        default=None,
        description="The population's unit for this feature, in this dataset's units (its reference scale "
        "times the unit factor between the columns); null when the feature is not part of the relation.",
    )


class GuaranteeAtChange(BaseModel):
    """Group privacy for the Gaussian release: a row change of norm c is protected at a larger epsilon."""

    change: float = Field(description="Row change in scaled units (norm); 1 is the DP unit.")
    epsilon: float | None = Field(
        description="The epsilon (at the same delta) that protects a change of this size; null when none is "
        "proven: the change moves the release by so many noise standard deviations that pobo's Gaussian "
        "sampler is not proven accurate enough there at this delta."
    )


class OutputRowTotal(BaseModel):
    """The output epsilon spent on one row (one person of one dataset) by the answers about it."""

    dataset_id: int
    index: int
    answers: int = Field(description="Charged answers and raw disclosures about this row.")
    epsilon: float | None = Field(
        description="Sum of the charged epsilons; null when answered raw (unbounded)."
    )


class OutputLedger(BaseModel):
    """A population's output privacy: every answer about one of its people, privatised or raw."""

    answers_privatised: int = Field(description="Answers with fresh CTL noise (each charged).")
    answers_cached: int = Field(description="Repeats answered with a row's earlier noisy answer (free).")
    answers_raw: int = Field(description="Outcomes disclosed as measured (grants without output privacy).")
    epsilon_per_answer: list[float] = Field(description="The distinct epsilons charged per answer.")
    largest_row_total: float | None = Field(
        description="Largest output epsilon spent on one row of one dataset; null when a row was answered "
        "raw."
    )
    largest_person_total: float | None = Field(
        description="Bound on the largest output epsilon spent on one person across the population's "
        "datasets: the sum over datasets of each dataset's largest row total (a person has at most one row "
        "per dataset, and rows are not matched across datasets); null when unbounded."
    )
    unbounded: bool = Field(description="Some outcome of this population was disclosed raw.")
    statement: str = Field(description="The output guarantee in words.")
    rows: list[OutputRowTotal] = Field(
        default_factory=list, description="Per-row totals, largest first (the ledger lists up to 1000)."
    )


class PrivacyReport(BaseModel):
    """Curator-private: what a release at (epsilon, delta) protects, and Algorithm 1's diagnostics.

    ``guarantee`` states the protection in words; ``features`` in the curator's units, feature by feature.
    ``sigma_min``, ``table`` and ``recommended_r`` concern only the paper's Algorithm 1 (``po-gp-ucb``),
    which has no formal guarantee; they are computed from the data and are themselves outside any guarantee.
    """

    dataset_id: int
    population_id: int
    epsilon: float
    delta: float
    n: int
    d: int
    mechanism: Mechanism = Field(description="The default release mechanism this report describes.")
    formal_guarantee: bool = Field(
        description="Whether a Gaussian release at (epsilon, delta) would carry a proven guarantee and the "
        "population keep one (false with data-dependent max_norm scaling, delta >= 1/n, or a population "
        "that already holds a charge without a guarantee)."
    )
    population_formal_guarantee: bool = Field(
        default=True, description="Whether every charge of the population so far carried a guarantee."
    )
    charge_factor: float = Field(
        default=1.0,
        description="A release of this dataset is charged as a change of this norm (in its scaled units): "
        "max(1, the largest reference factor of its features) x sqrt(rows_per_person).",
    )
    charged_epsilon: float | None = Field(
        default=None,
        description="What a Gaussian release at (epsilon, delta) costs the population, in its relation "
        "(epsilon itself when charge_factor is 1); null when such a release would be refused (see warnings).",
    )
    rows_per_person: int = Field(default=1, description="Declared: at most this many rows per person.")
    noise_std: float = Field(description="Noise standard deviation of a Gaussian release, in scaled units.")
    guarantee: str = Field(description="What the Gaussian release protects, in one paragraph.")
    features: list[FeatureProtection]
    larger_changes: list[GuaranteeAtChange]
    large_delta: bool = Field(description="delta >= 1/n: a release needs allow_large_delta (see warnings).")
    outcomes: str = Field(description="What happens to the outcomes a partner asks for.")
    warnings: list[str]
    po_gp_ucb: str = Field(description="Why the paper's Algorithm 1 carries no guarantee here.")
    sigma_min: float = Field(
        description="Algorithm 1 only: smallest singular value of the centred, scaled features "
        "(data-dependent, curator-private)."
    )
    recommended_r: int | None = Field(
        description="Algorithm 1 only: largest r with sigma_min >= omega(r) (the paper's guideline; chosen "
        "from the data, so outside any guarantee), or null."
    )
    table: list[PrivacyRow]
    epsilon_spent: float
    delta_spent: float
    epsilon_left: float
    delta_left: float
    fits_budget: bool = Field(description="Whether a release at (epsilon, delta) fits in the budget left.")
    scaling: ScalingInfo
    output: OutputLedger | None = Field(
        default=None, description="Output privacy of the population's answers so far (rows omitted)."
    )


class LedgerEntryPublic(BaseModel):
    id: int
    dataset_id: int
    release_id: int | None
    gradient_oracle_id: int | None = Field(default=None, description="The gradient oracle charged here.")
    mechanism: str
    epsilon: float = Field(description="What the population was charged, in its relation.")
    delta: float
    nominal_epsilon: float | None = Field(
        default=None,
        description="The epsilon the release or oracle was made at (below epsilon when its dataset's scales "
        "are coarser than the population's, or a person has several rows).",
    )
    formal_guarantee: bool = Field(default=True, description="Whether this charge carries a guarantee.")
    native: dict[str, Any] | None = Field(
        description="The mechanism's own parameters (gaussian: noise_multiplier = sigma / sensitivity, "
        "sensitivity, sigma; dp-gibo: mu, steps), for accountants tighter than the sum."
    )
    status: Literal["reserved", "spent"]
    created_at: datetime


class LedgerPublic(PopulationBudget):
    """A population's ledger: every charge of every dataset of the population."""

    population_id: int
    entries: list[LedgerEntryPublic]
    output: OutputLedger | None = Field(
        default=None, description="The per-person output ledger: every answer about one of these people."
    )
