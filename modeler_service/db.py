"""The modeler's database: the kit's engine and sessions (``shared.servicekit.db``, where the SQLite and
PostgreSQL policy is written down) bound to the modeler's alembic environment and version table, and
``transaction``, which reports a database failure as the modeler's ``StorageError`` (503)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.config import Config
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import modeler_service
from modeler_service.exceptions import StorageError
from shared.servicekit import db as kit
from shared.servicekit.migrations import Migrations

#: alembic environment of this service: <repo>/migrations/modeler (located from the package, not the cwd).
MIGRATIONS_DIR = Path(modeler_service.__file__).resolve().parent.parent / "migrations" / "modeler"
VERSION_TABLE = "alembic_version_modeler"
MIGRATIONS = Migrations("modeler", MIGRATIONS_DIR, VERSION_TABLE)

make_engine = kit.make_engine


class Database(kit.Database):
    """The modeler's engine and session factories (``session(write=...)``; migrations: ``MIGRATIONS``)."""

    migrations = MIGRATIONS


def alembic_config() -> Config:
    return MIGRATIONS.config()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """``alembic upgrade <revision>`` on this engine (idempotent; run at every start-up)."""
    MIGRATIONS.upgrade(engine, revision)


@contextmanager
def transaction(db: Database, *, write: bool = True) -> Iterator[Session]:
    """One session, one transaction: commit on success, roll back on error, DB failure -> ``StorageError``."""
    with kit.transaction(db, write=write, error=StorageError) as session:
        yield session
