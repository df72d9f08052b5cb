"""The modeler's database: the kit's engine and sessions (``shared.servicekit.db``, where the SQLite and
PostgreSQL policy is written down) bound to the modeler's alembic environment and version table, and
``transaction`` (and ``driver_transaction``), which report a database failure as the modeler's
``StorageError`` (503)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from modeler_service.exceptions import StorageError
from shared.servicekit import db as kit
from shared.servicekit.migrations import Migrations

#: alembic environment of this service: <source>/migrations/modeler, version table alembic_version_modeler.
MIGRATIONS = Migrations.of("modeler")
MIGRATIONS_DIR, VERSION_TABLE = MIGRATIONS.directory, MIGRATIONS.version_table
alembic_config, upgrade = MIGRATIONS.config, MIGRATIONS.upgrade


class Database(kit.Database):
    """The modeler's engine and session factories (``session(write=...)``; migrations: ``MIGRATIONS``)."""

    migrations = MIGRATIONS


@contextmanager
def driver_transaction(db: Database) -> Iterator[Any]:
    """A write transaction on a driver cursor (``kit.Database.driver_transaction``; the hot path's
    statements, ``round_sql``): commit on success, roll back on error, DB failure -> ``StorageError``."""
    try:
        with db.driver_transaction() as cursor:
            yield cursor
    except SQLAlchemyError as exc:
        raise kit.storage_error(exc, StorageError) from exc


@contextmanager
def transaction(db: Database, *, write: bool = True) -> Iterator[Session]:
    """One session, one transaction: commit on success, roll back on error, DB failure -> ``StorageError``."""
    with kit.transaction(db, write=write, error=StorageError) as session:
        yield session
