"""SQLAlchemy 2 models of the modeler service.

Every table is prefixed ``modeler_`` because the modeler and the curator may share one PostgreSQL database
(each service has its own alembic version table). The released Z is not in the database: it is a .npy file
in the data dir; the study row records its relative path and sha256.

Four tables about studies:

* ``modeler_studies``: one optimisation over one curator release, or (a ``gradient-oracle`` strategy such
  as DP-GIBO) over one curator gradient oracle: then the release columns are null, ``gradient_oracle``
  holds the oracle's public parameters and ``theta`` the strategy's current point. Holds the curator token
  *encrypted* (Fernet), the strategy's name and parameters, its private state and seed (never shown to the
  curator), the run state, and the *write-ahead intent* of the round in flight (``pending_round``: planned
  before the curator is asked, so a restarted process re-sends exactly the same requests with the same
  Idempotency-Keys).
* ``modeler_study_tags``: a study's tags in lower case, one row each, for filtering the list in SQL.
* ``modeler_audit_entries``: append-only, one row per curator request, keyed by (round, request),
  hash-chained (``modeler_service.audit``). The strategy is rebuilt from these rows: the audit log *is* the
  state.
* ``modeler_audit_supersessions``: append-only, one row per value the curator superseded after the study
  had been sent it (a lab's re-measurement, ``modeler_service.supersessions``), hash-chained per study in a
  chain of its own beside the entries' (whose ``seq`` is the query number and stays so). A strategy rebuilt
  from the audit log observes an entry's latest value.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.servicekit.hashchain import GENESIS_HASH  # the hash before the first audit entry of every study
from shared.servicekit.models import column_types, new_metadata
from shared.servicekit.models import utcnow as utcnow  # re-exported: the services import it from here


class Base(DeclarativeBase):
    metadata = new_metadata()
    type_annotation_map = column_types()


class Study(Base):
    __tablename__ = "modeler_studies"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    #: a name for people and labels to find the study by (migration 0009); the tags as written, in order
    #: (``StudyTag`` holds them again, folded to lower case, for filtering in SQL)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    tags: Mapped[Any] = mapped_column(JSON, default=list, server_default="[]")

    # where the data is, and how to reach it
    curator_url: Mapped[str] = mapped_column(String(2048))
    curator_token_enc: Mapped[str] = mapped_column(Text)  # Fernet(settings key).encrypt(token); never echoed
    # a release study: the release; null for a gradient-oracle study
    release_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    n: Mapped[int] = mapped_column(Integer)  # rows of the release (gradient oracle: rows it averages over)
    r: Mapped[int] = mapped_column(Integer)  # columns of Z (gradient oracle: the dimension d of theta)
    release_epsilon: Mapped[float | None] = mapped_column(Double, nullable=True)
    release_delta: Mapped[float | None] = mapped_column(Double, nullable=True)
    release_mechanism: Mapped[str | None] = mapped_column(String(16), nullable=True)  # gaussian | po-gp-ucb
    release_formal_guarantee: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    release_noise_std: Mapped[float | None] = mapped_column(Double, nullable=True)  # gaussian only
    release_lift: Mapped[str | None] = mapped_column(String(16), nullable=True)  # po-gp-ucb only
    release_omega: Mapped[float | None] = mapped_column(Double, nullable=True)  # po-gp-ucb only
    z_file: Mapped[str | None] = mapped_column(String(255), nullable=True)  # relative to the data dir
    z_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # a gradient-oracle study: the oracle and its public parameters (GET /v1/gradient-oracles/{id})
    gradient_oracle_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gradient_oracle: Mapped[Any | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    #: the strategy's current point (a gradient-oracle study: theta^(t) as a JSON list), else null
    theta: Mapped[Any | None] = mapped_column(JSON(none_as_null=True), nullable=True)

    # the strategy (a name in shared.bo.strategies.REGISTRY and its validated parameters)
    strategy: Mapped[str] = mapped_column(String(32))
    strategy_params: Mapped[Any] = mapped_column(JSON)
    #: private choices the strategy made at creation (e.g. its random first rows); never shown to the curator
    strategy_state: Mapped[Any] = mapped_column(JSON)
    iterations_total: Mapped[int] = mapped_column(Integer)  # the query budget (curator queries)
    seed: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # private; never shown to the curator

    # run state
    status: Mapped[str] = mapped_column(String(32), default="ready", index=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: while ``waiting_for_curator``: when the runner tries again, and how many attempts failed in a row
    retry_at: Mapped[datetime | None] = mapped_column(nullable=True)
    retry_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    run_target: Mapped[int | None] = mapped_column(Integer, nullable=True)  # iterations_done to reach
    iterations_done: Mapped[int] = mapped_column(Integer, default=0)  # queries recorded
    rounds_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    audit_head: Mapped[str] = mapped_column(String(64), default=GENESIS_HASH)
    best_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    best_y: Mapped[float | None] = mapped_column(Double, nullable=True)
    #: whether the grant answers outcomes through output privacy (noisy answers; migration 0008); null:
    #: unknown (a study created before it) or not a release study
    outputs_private: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    #: whether a round of the study ever waited for a measurement (a ``manual`` dataset): the runner then
    #: records the curator's supersessions after its rounds (migration 0008)
    awaits_measurements: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: the supersession chain's length and head (``AuditSupersession``; migration 0008)
    supersessions_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    supersessions_head: Mapped[str] = mapped_column(
        String(64), default=GENESIS_HASH, server_default=GENESIS_HASH
    )

    #: write-ahead intent of the round in flight: ``{"round": k, "requests": [{"request", "kind", "index",
    #: "details", "key", "query_id"}, ...]}``, written before the first request is sent and cleared in the
    #: transaction that records the round's outcomes
    pending_round: Mapped[Any | None] = mapped_column(JSON(none_as_null=True), nullable=True)


class StudyTag(Base):
    """One tag of a study, folded to lower case (``GET /v1/studies?tag=`` filters on it in SQL); written
    with the study's ``tags`` by ``repository.set_tags`` alone (migration 0009)."""

    __tablename__ = "modeler_study_tags"
    __table_args__ = (Index("ix_modeler_study_tags_tag", "tag"),)

    study_id: Mapped[str] = mapped_column(ForeignKey("modeler_studies.id"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(50), primary_key=True)


class AuditEntry(Base):
    """One curator request of a round and its outcome; append-only and hash-chained per study.

    ``hash_version`` 1: an entry written before rounds existed (its GP-UCB numbers are in ``details``; its
    hash covers them in the old layout, ``modeler_service.audit``); 2: the current layout.
    """

    __tablename__ = "modeler_audit_entries"
    __table_args__ = (
        UniqueConstraint("study_id", "seq"),
        UniqueConstraint("study_id", "round", "request"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("modeler_studies.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)  # the query number within the study, 1, 2, ...
    at: Mapped[datetime] = mapped_column()
    round: Mapped[int] = mapped_column(Integer)
    request: Mapped[int] = mapped_column(Integer)  # position within the round, 0-based
    kind: Mapped[str] = mapped_column(String(16))  # "row" or "gradient"
    row_index: Mapped[int | None] = mapped_column("row_index", Integer, nullable=True)
    y: Mapped[float | None] = mapped_column(Double, nullable=True)
    details: Mapped[Any] = mapped_column(JSON)  # the strategy's numbers (JSON object)
    curator_query_id: Mapped[int] = mapped_column(Integer)  # row: the query id; gradient: the step number
    hash_version: Mapped[int] = mapped_column(Integer, default=2, server_default="2")
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class AuditSupersession(Base):
    """A value of an audit entry that the curator superseded after the study had been sent it (the lab
    re-measured the sample): both values, the curator's correction id, and the entry it supersedes.

    Append-only and hash-chained per study (``modeler_service.audit.supersession_hash``), apart from the
    entries' chain so that an entry's ``seq`` stays its query number. ``curator_at``: when the curator
    recorded the change; ``at``: when the modeler recorded it.
    """

    __tablename__ = "modeler_audit_supersessions"
    __table_args__ = (
        UniqueConstraint("study_id", "seq"),
        UniqueConstraint("study_id", "correction_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[str] = mapped_column(ForeignKey("modeler_studies.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)  # 1, 2, ... within the study
    at: Mapped[datetime] = mapped_column()
    correction_id: Mapped[int] = mapped_column(Integer)  # the curator's id of the change
    curator_query_id: Mapped[int] = mapped_column(Integer)
    audit_seq: Mapped[int] = mapped_column(Integer)  # the seq of the audit entry whose value it supersedes
    previous_y: Mapped[float] = mapped_column(Double)
    y: Mapped[float] = mapped_column(Double)
    curator_at: Mapped[datetime] = mapped_column()
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


# ------------------------------------------------------------------------- federations (DP-FTS-DE, issue 16)


class Federation(Base):
    """A DP-FTS-DE federation run by the modeler as its coordinator (``modeler_service.federations``).

    ``params`` holds the public parameters declared at creation (box, P, M, q, z, S, rounds, budget, delta,
    round_seconds, temperature schedule); ``rff`` the published feature map. ``status``: ``registering``
    (agents may register), ``running`` (the agent list is frozen; ``current_round`` is open), ``done``.
    """

    __tablename__ = "modeler_federations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    params: Mapped[Any] = mapped_column(JSON)
    rff: Mapped[Any] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="registering", index=True)
    #: why a ``done`` federation stopped: "rounds" (all run) or "budget" (the next round would pass it)
    stop_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    participants: Mapped[int | None] = mapped_column(Integer, nullable=True)  # N of the frozen list
    current_round: Mapped[int] = mapped_column(Integer, default=0)  # 0 before start
    rounds_closed: Mapped[int] = mapped_column(Integer, default=0)
    epsilon_pld: Mapped[float] = mapped_column(Double, default=0.0)
    epsilon_rdp: Mapped[float] = mapped_column(Double, default=0.0)
    epsilon_replace_one_pld: Mapped[float] = mapped_column(Double, default=0.0)


class FederationAgent(Base):
    """One registered agent: its token only as a sha256 digest; ``position`` (its index n in the frozen
    list) and ``region`` (i_n, round robin) are set when the federation starts."""

    __tablename__ = "modeler_federation_agents"
    __table_args__ = (
        UniqueConstraint("federation_id", "name"),
        UniqueConstraint("federation_id", "seq"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    federation_id: Mapped[str] = mapped_column(ForeignKey("modeler_federations.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)  # registration order, 1, 2, ...
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    region: Mapped[int | None] = mapped_column(Integer, nullable=True)


class FederationRound(Base):
    """Round t of a federation: open until its deadline, then closed exactly once with its Poisson sample
    (``sampled``: positions in the frozen list; never published), aggregates [P][M] and epsilon so far."""

    __tablename__ = "modeler_federation_rounds"
    __table_args__ = (UniqueConstraint("federation_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    federation_id: Mapped[str] = mapped_column(ForeignKey("modeler_federations.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="open")
    opened_at: Mapped[datetime] = mapped_column(default=utcnow)
    deadline: Mapped[datetime] = mapped_column()
    closed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    sampled: Mapped[Any | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    aggregates: Mapped[Any | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    epsilon_pld: Mapped[float | None] = mapped_column(Double, nullable=True)
    epsilon_rdp: Mapped[float | None] = mapped_column(Double, nullable=True)
    #: whether the round keeps receipts of accepted submissions (every round opened since migration 0007;
    #: a round closed before it has none, so an agent's standing in it is unknown)
    receipts: Mapped[bool] = mapped_column(Boolean, default=True, server_default=false())


class FederationSubmission(Base):
    """An agent's raw omega for one round: never logged nor exposed, deleted when the round closes."""

    __tablename__ = "modeler_federation_submissions"
    __table_args__ = (UniqueConstraint("round_id", "agent_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("modeler_federation_rounds.id"), index=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("modeler_federation_agents.id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    omega: Mapped[Any] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class FederationReceipt(Base):
    """The record that one agent's submission to one round was accepted before the round closed, so that it
    is in the round's aggregate (if the round's secret Poisson sample drew the agent). Written in the
    transaction that stores the submission and kept when the round's submissions are purged at its close:
    a replay of the same Idempotency-Key is then answered "accepted in round t", and the agent reads its
    standing in the round (``you`` of ``GET .../rounds/{t}``).

    Never the omega: ``request_digest`` is HMAC-SHA256 of the submitted body under ``request_salt`` (random
    per receipt), enough to tell a retry from another submission under the same key.
    """

    __tablename__ = "modeler_federation_receipts"
    __table_args__ = (
        UniqueConstraint("round_id", "agent_id"),
        UniqueConstraint("agent_id", "idempotency_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("modeler_federation_rounds.id"), index=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("modeler_federation_agents.id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_salt: Mapped[str] = mapped_column(String(32))
    request_digest: Mapped[str] = mapped_column(String(64))
    accepted_at: Mapped[datetime] = mapped_column(default=utcnow)
