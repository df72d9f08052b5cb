"""SQLAlchemy 2 models of the curator service.

Every table is prefixed ``curator_`` because the curator and the modeler may share one PostgreSQL
database (each with its own alembic version table). Arrays (features, outcomes, released Z) are not in the
database: they live as .npy files in the data dir; a row here records the file's relative path and sha256.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from shared.hashchain import GENESIS_HASH

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[str]: JSON(),
        float: Double(),
    }


class Dataset(Base):
    __tablename__ = "curator_datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
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
    #: Cached sigma_min of the centred, scaled features (data-dependent, curator-private, immutable).
    sigma_min: Mapped[float | None]
    epsilon_budget: Mapped[float]
    delta_budget: Mapped[float]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Release(Base):
    """An immutable (epsilon, delta)-DP release Z of one dataset. M and any seed are never stored."""

    __tablename__ = "curator_releases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("curator_datasets.id"), index=True)
    n: Mapped[int]
    r: Mapped[int]
    epsilon: Mapped[float]
    delta: Mapped[float]
    lift: Mapped[str] = mapped_column(String(16))
    lifted: Mapped[bool] = mapped_column(Boolean)
    omega: Mapped[float]
    sigma_min: Mapped[float]
    scaling: Mapped[dict[str, Any]]
    formal_guarantee: Mapped[bool] = mapped_column(Boolean)
    z_path: Mapped[str] = mapped_column(String(500))
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Head of this release's query-log chain: entries so far and the last hash (catches truncation).
    chain_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    chain_head: Mapped[str] = mapped_column(String(64), default=GENESIS_HASH, server_default=GENESIS_HASH)


class LedgerEntry(Base):
    """One spend of a dataset's privacy budget (basic composition: the epsilons and deltas add up).

    ``reserved`` while the release is being computed (it already counts against the budget), ``spent``
    once the release is stored (in the same transaction as the release row).
    """

    __tablename__ = "curator_ledger_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("curator_datasets.id"), index=True)
    release_id: Mapped[int | None] = mapped_column(ForeignKey("curator_releases.id"), unique=True)
    epsilon: Mapped[float]
    delta: Mapped[float]
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Partner(Base):
    """A partner (the modeler): a hashed bearer token, grants and a query quota."""

    __tablename__ = "curator_partners"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    max_queries: Mapped[int]
    queries_used: Mapped[int] = mapped_column(default=0)
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
    """One "what is the outcome of row i?" question. Committed (pending) before the outcome is evaluated."""

    __tablename__ = "curator_queries"
    __table_args__ = (
        UniqueConstraint("partner_id", "idempotency_key"),
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
    # The query log's hash chain (one chain per release, in order of completion; see shared.hashchain):
    # set in the transaction that records the outcome, so a pending query is not in the chain yet.
    chain_seq: Mapped[int | None]
    prev_hash: Mapped[str | None] = mapped_column(String(64))
    hash: Mapped[str | None] = mapped_column(String(64))


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
