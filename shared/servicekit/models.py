"""What the two services' SQLAlchemy models share: constraint names, UTC timestamps, the type map.

Each service keeps its own declarative ``Base`` (its own ``MetaData``: the services may share one
PostgreSQL database but never each other's tables), defined in two lines from what is here::

    class Base(DeclarativeBase):
        metadata = new_metadata()
        type_annotation_map = column_types()
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, MetaData
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

__all__ = ["NAMING_CONVENTION", "UTCDateTime", "column_types", "new_metadata", "utcnow"]

#: Deterministic constraint and index names, so that migrations can name what they alter or drop (SQLite
#: and PostgreSQL would otherwise choose different names, or none).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC (the default of every timestamp column)."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    SQLite has no time zones: values are stored as naive UTC and come back marked UTC. A naive value
    handed in is taken to be UTC already.
    """

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


def new_metadata() -> MetaData:
    """A fresh ``MetaData`` with :data:`NAMING_CONVENTION` (one per service)."""
    return MetaData(naming_convention=NAMING_CONVENTION)


def column_types(extra: dict[Any, TypeEngine[Any]] | None = None) -> dict[Any, TypeEngine[Any]]:
    """``Mapped[...]`` annotations to column types: ``datetime`` as :class:`UTCDateTime`, ``dict[str, Any]``
    as JSON, plus a service's ``extra`` entries."""
    return {datetime: UTCDateTime(), dict[str, Any]: JSON(), **(extra or {})}
