"""SQLAlchemy 2 models of the curator service.

Every table is prefixed ``curator_`` because the curator and the modeler may share one PostgreSQL
database (each with its own alembic version table). Arrays (features, outcomes, released Z) are not in the
database: they live as .npy files in the data dir; a row here records the file's relative path and sha256.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.servicekit.hashchain import GENESIS_HASH
from shared.servicekit.models import column_types, new_metadata
from shared.servicekit.models import utcnow as utcnow  # re-exported: the services import it from here


class Base(DeclarativeBase):
    metadata = new_metadata()
    type_annotation_map = column_types({list[str]: JSON(), float: Double()})


class Population(Base):
    """The people behind one or more datasets. The (epsilon, delta) budget is theirs: every release of any
    of its datasets is charged here, so uploading the same people again never yields a fresh budget."""

    __tablename__ = "curator_populations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: Set when the curator declared the population by name (upload field ``population``); else NULL.
    name: Mapped[str | None] = mapped_column(String(200), unique=True)
    epsilon_budget: Mapped[float]
    delta_budget: Mapped[float]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: The population's one neighbouring relation (migration 0006): per feature, the declared scale at its
    #: first upload, in that column's raw units: [{"name", "scale", "std", "dataset_id", "column"}]. A later
    #: dataset's releases are charged in these units (``services.populations``). NULL: built from the
    #: datasets when the population is next joined (populations made before 0006).
    reference: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)


class Dataset(Base):
    __tablename__ = "curator_datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    population_id: Mapped[int] = mapped_column(ForeignKey("curator_populations.id"), index=True)
    #: Why the dataset belongs to its population ("declared", "identical rows as dataset 3", ...).
    population_reason: Mapped[str | None] = mapped_column(String(300))
    n: Mapped[int]
    d: Mapped[int]
    features: Mapped[list[str]]
    objective: Mapped[str | None] = mapped_column(String(500))
    objective_mode: Mapped[str] = mapped_column(String(16))
    noise_std: Mapped[float]
    #: {"kind": ..., "scales": {...} | None, "max_norm": c | None, "divisors": [d floats] | None,
    #:  "factor": float | None}: what was applied to the stored features (curator-private).
    scaling: Mapped[dict[str, Any]]
    formal_guarantee: Mapped[bool] = mapped_column(Boolean)
    csv_sha256: Mapped[str] = mapped_column(String(64))
    features_path: Mapped[str] = mapped_column(String(500))
    features_sha256: Mapped[str] = mapped_column(String(64))
    outcomes_path: Mapped[str | None] = mapped_column(String(500))
    outcomes_sha256: Mapped[str | None] = mapped_column(String(64))
    #: Order-independent content hashes of the raw feature rows and columns (``fingerprint.py``); NULL for
    #: uploads made before populations existed.
    rows_hash: Mapped[str | None] = mapped_column(String(32))
    column_hashes: Mapped[list[str | None] | None] = mapped_column(JSON)
    #: Per column, features then the outcome: ``fingerprint.ColumnSignature.to_json()`` (migration 0006);
    #: NULL for uploads made before, which match by the exact hashes above only.
    column_signatures: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    #: Per feature: the population's reference units in one of this dataset's scaled units (1: the same
    #: relation); ``reference_factor`` is their largest. A release is charged as a change of norm
    #: max(1, reference_factor) sqrt(rows_per_person) in scaled units (``services.releases``).
    reference_factors: Mapped[list[float] | None] = mapped_column(JSON)
    reference_factor: Mapped[float] = mapped_column(Double, default=1.0, server_default="1.0")
    #: Declared: at most this many rows of one person in this dataset (group privacy; default 1).
    rows_per_person: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: The upload contradicted a fingerprint match and the admin declared the people distinct (recorded).
    acknowledged_distinct_people: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: Cached sigma_min of the centred, scaled features (data-dependent, curator-private, immutable).
    sigma_min: Mapped[float | None]
    #: The upload's id column (migration 0008): its name, and the ids themselves as a fixed-width UTF-8
    #: bytes .npy (row i's sample id at [i]; unique, never released, never shown to a partner).
    id_column: Mapped[str | None] = mapped_column(String(200))
    ids_path: Mapped[str | None] = mapped_column(String(500))
    ids_sha256: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: When the dataset was erased (migration 0009; ``services.erasure``): its rows, outcomes, sample ids and
    #: every array derived from them are gone, the row stays as a tombstone for the ledger and the logs.
    erased_at: Mapped[datetime | None]


class Release(Base):
    """An immutable release Z of one dataset. M, the noise and any seed are never stored.

    ``mechanism``: ``gaussian`` (the default; ``noise_std`` set) or ``po-gp-ucb`` (the paper's Algorithm 1;
    ``lift``, ``lifted``, ``omega``, ``sigma_min`` set; no formal guarantee).
    """

    __tablename__ = "curator_releases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("curator_datasets.id"), index=True)
    mechanism: Mapped[str] = mapped_column(String(16))
    n: Mapped[int]
    r: Mapped[int]
    epsilon: Mapped[float]
    delta: Mapped[float]
    noise_std: Mapped[float | None]
    lift: Mapped[str | None] = mapped_column(String(16))
    lifted: Mapped[bool | None] = mapped_column(Boolean)
    omega: Mapped[float | None]
    sigma_min: Mapped[float | None]
    scaling: Mapped[dict[str, Any]]
    formal_guarantee: Mapped[bool] = mapped_column(Boolean)
    allow_large_delta: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    acknowledged_no_guarantee: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    z_path: Mapped[str] = mapped_column(String(500))
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Head of this release's query-log chain: entries so far and the last hash (catches truncation).
    chain_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    chain_head: Mapped[str] = mapped_column(String(64), default=GENESIS_HASH, server_default=GENESIS_HASH)
    #: Set when its dataset was erased (migration 0009): Z is gone; a partner's request is a 410.
    erased_at: Mapped[datetime | None]


class LedgerEntry(Base):
    """One spend of a population's privacy budget (basic composition: the epsilons and deltas add up).

    ``reserved`` while the release is being computed (it already counts against the budget), ``spent``
    once the release is stored (in the same transaction as the release row). ``native`` keeps the
    mechanism's own parameters (the Gaussian release's noise multiplier) for tighter accountants.
    """

    __tablename__ = "curator_ledger_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    population_id: Mapped[int] = mapped_column(ForeignKey("curator_populations.id"), index=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("curator_datasets.id"), index=True)
    release_id: Mapped[int | None] = mapped_column(ForeignKey("curator_releases.id"), unique=True)
    #: The gradient oracle this entry pays for (mechanism ``dp-gibo``; migration 0005).
    gradient_oracle_id: Mapped[int | None] = mapped_column(
        ForeignKey("curator_gradient_oracles.id"), unique=True
    )
    mechanism: Mapped[str] = mapped_column(String(16))
    #: What the population is charged, in its reference relation (>= the nominal epsilon).
    epsilon: Mapped[float]
    delta: Mapped[float]
    #: The epsilon the release or oracle was asked for (NULL: as ``epsilon``; migration 0006).
    nominal_epsilon: Mapped[float | None]
    native: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    #: False for a charge without a proven guarantee (Algorithm 1, allow_large_delta, max_norm scaling): the
    #: population then has no formal guarantee (migration 0006).
    formal_guarantee: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Partner(Base):
    """A partner (the modeler): hashed bearer tokens (``PartnerToken``), grants and a query quota."""

    __tablename__ = "curator_partners"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    max_queries: Mapped[int]
    queries_used: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]
    #: Output privacy of every outcome answered to this partner (``services.outputs.OutputPolicy`` as a
    #: dict: epsilon, B, R, fresh_repeats, max_epsilon_per_row, store_raw, charged_epsilon); NULL: raw y.
    output_privacy: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class PartnerToken(Base):
    """One bearer token of a partner, stored as its sha256 (migration 0007): a partner may hold several at
    once, so a new token can be handed over before the old one is revoked. A token authenticates while
    neither it nor its partner is revoked."""

    __tablename__ = "curator_partner_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    partner_id: Mapped[int] = mapped_column(ForeignKey("curator_partners.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


class Grant(Base):
    __tablename__ = "curator_grants"
    __table_args__ = (UniqueConstraint("partner_id", "release_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    partner_id: Mapped[int] = mapped_column(ForeignKey("curator_partners.id"))
    release_id: Mapped[int] = mapped_column(ForeignKey("curator_releases.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Query(Base):
    """One "what is the outcome of row i?" question: committed with its answer (``column`` datasets) or
    pending until the curator posts the measurement (``manual``)."""

    __tablename__ = "curator_queries"
    __table_args__ = (
        UniqueConstraint("partner_id", "idempotency_key"),
        UniqueConstraint("release_id", "chain_seq"),  # one link per chain position (migration 0002)
        Index("ix_curator_queries_release_id_id", "release_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    release_id: Mapped[int] = mapped_column(ForeignKey("curator_releases.id"))
    partner_id: Mapped[int] = mapped_column(ForeignKey("curator_partners.id"), index=True)
    row_index: Mapped[int]
    status: Mapped[str] = mapped_column(String(16))
    y: Mapped[float | None]
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    completed_at: Mapped[datetime | None]
    # The query log's hash chain (one chain per release, in order of completion; see servicekit.hashchain):
    # set in the transaction that records the outcome, so a pending query is not in the chain yet.
    chain_seq: Mapped[int | None]
    prev_hash: Mapped[str | None] = mapped_column(String(64))
    hash: Mapped[str | None] = mapped_column(String(64))
    # Output privacy (migration 0004). ``output_key`` names the privatised answer a query is about (dataset,
    # row and CTL parameters); a repeat under a cached-answer grant points at the query that drew the noise
    # (``source_query_id``) and is answered with its value, at no cost. ``charged_epsilon``: what this answer
    # cost its person (0 for a cached repeat, NULL for a raw answer). ``y_raw``: the measured outcome, kept
    # only when the grant opted in (``store_raw``); never shown to a partner.
    output_key: Mapped[str | None] = mapped_column(String(120), index=True)
    source_query_id: Mapped[int | None] = mapped_column(Integer, index=True)
    charged_epsilon: Mapped[float | None]
    y_raw: Mapped[float | None]
    #: When a partner was first sent this query complete (migration 0008): by ``GET /v1/queries/{id}``, a
    #: long-poll, the release's list or a replayed creation. Until then the lab may *correct* the value;
    #: afterwards a new value *supersedes* it (``services.corrections``). A ``column`` answer sent in the
    #: answer to its creation is not recorded here (such answers are never corrected).
    delivered_at: Mapped[datetime | None]


class QueryCorrection(Base):
    """A changed outcome of a completed ``manual`` query (migration 0008), a link of its release's chain.

    ``kind``: ``correction`` (replaced before any partner was sent the query complete) or ``supersession``
    (a new value after delivery: one more answer about the person, charged as such). Both values are kept
    here; the query row holds the current one. ``previous_y`` / ``y`` are the values as answered
    (privatised under an output-private grant); ``*_raw`` the measured ones, kept only when the grant has
    ``store_raw``."""

    __tablename__ = "curator_query_corrections"
    __table_args__ = (UniqueConstraint("release_id", "chain_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    query_id: Mapped[int] = mapped_column(ForeignKey("curator_queries.id"), index=True)
    release_id: Mapped[int] = mapped_column(ForeignKey("curator_releases.id"))
    partner_id: Mapped[int] = mapped_column(ForeignKey("curator_partners.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    previous_y: Mapped[float]
    y: Mapped[float]
    previous_y_raw: Mapped[float | None]
    y_raw: Mapped[float | None]
    reason: Mapped[str] = mapped_column(String(500))
    #: Output epsilon this change cost its person: a supersession under output privacy is one more answer;
    #: NULL for a raw grant's supersession (unbounded) and for a correction (no new answer was sent).
    charged_epsilon: Mapped[float | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    chain_seq: Mapped[int]
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class OutputCharge(Base):
    """One answer about one person (a dataset row): the per-person output ledger of a population.

    ``epsilon`` is what the privatised answer cost that person (OpenDP's map of CTL); NULL marks an answer
    disclosed as it is (a grant without output privacy), which leaves that person's output epsilon unbounded.
    Cached repeats are not charged and have no entry.
    """

    __tablename__ = "curator_output_charges"
    __table_args__ = (
        Index("ix_curator_output_charges_population_row", "population_id", "dataset_id", "row_index"),
        UniqueConstraint("query_id", "answer_no"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The dataset's population, copied (no foreign key: on PostgreSQL its key-share lock would queue a raw
    #: answer behind the population lock that privatised answers take, in the opposite order: a deadlock).
    population_id: Mapped[int] = mapped_column(Integer)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("curator_datasets.id"))
    row_index: Mapped[int]
    #: Not a foreign key on purpose: the charge outlives any change to the query log (a deleted query row
    #: must not give its person their epsilon back).
    query_id: Mapped[int] = mapped_column(Integer)
    #: 0: the query's answer; k > 0: its k-th supersession (one more answer about the person; 0008).
    answer_no: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    partner_id: Mapped[int] = mapped_column(ForeignKey("curator_partners.id"))
    epsilon: Mapped[float | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class GradientOracle(Base):
    """A private gradient oracle (DP-GIBO) on one dataset: its loss, public bounds, clip B, and a mu-GDP
    budget for ``steps`` steps, charged whole to the population's ledger at creation (migration 0005)."""

    __tablename__ = "curator_gradient_oracles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("curator_datasets.id"), index=True)
    loss: Mapped[str] = mapped_column(String(64))
    #: Loss parameters: {"intercept": bool, "delta_huber": c | None, "weight_clip": w | None}.
    loss_params: Mapped[dict[str, Any]] = mapped_column(JSON)
    dimension: Mapped[int]
    bounds: Mapped[list[list[float]]] = mapped_column(JSON)
    clip: Mapped[float]
    mu: Mapped[float]
    steps: Mapped[int]
    steps_used: Mapped[int] = mapped_column(Integer, default=0)
    epsilon: Mapped[float]
    delta: Mapped[float]
    n: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    #: Set when its dataset was erased (migration 0009): the oracle answers no more steps (410).
    erased_at: Mapped[datetime | None]


class GradientStep(Base):
    """One answered step of an oracle: its data-independent inputs and the noisy gradient released."""

    __tablename__ = "curator_gradient_steps"
    __table_args__ = (
        UniqueConstraint("oracle_id", "step"),
        UniqueConstraint("oracle_id", "partner_id", "idempotency_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    oracle_id: Mapped[int] = mapped_column(ForeignKey("curator_gradient_oracles.id"))
    step: Mapped[int]
    partner_id: Mapped[int] = mapped_column(ForeignKey("curator_partners.id"), index=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    #: sha256 of the canonical request body (a replay with another body under the same key is a 409).
    request_sha256: Mapped[str] = mapped_column(String(64))
    theta: Mapped[list[float]] = mapped_column(JSON)
    points: Mapped[list[list[float]]] = mapped_column(JSON)
    kernel: Mapped[dict[str, Any]] = mapped_column(JSON)
    noise_var: Mapped[float]
    jitter: Mapped[float]
    gradient: Mapped[list[float]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class OracleGrant(Base):
    __tablename__ = "curator_oracle_grants"
    __table_args__ = (UniqueConstraint("partner_id", "oracle_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    partner_id: Mapped[int] = mapped_column(ForeignKey("curator_partners.id"))
    oracle_id: Mapped[int] = mapped_column(ForeignKey("curator_gradient_oracles.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AccessLog(Base):
    """Who called what, when, with which status. Never a request or response body."""

    __tablename__ = "curator_access_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(64))
    partner_id: Mapped[int | None] = mapped_column(index=True)
    method: Mapped[str] = mapped_column(String(10))
    path: Mapped[str] = mapped_column(String(500))
    status_code: Mapped[int]
    duration_ms: Mapped[float]
