"""The curator's database: the kit's engine and sessions (``shared.servicekit.db``, where the SQLite and
PostgreSQL policy is written down) bound to the curator's alembic environment and version table."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from sqlalchemy import Engine

import curator_service
from shared.servicekit import db as kit
from shared.servicekit.migrations import Migrations

#: alembic environment of this service: <repo>/migrations/curator (located from the package, not the cwd).
MIGRATIONS_DIR = Path(curator_service.__file__).resolve().parent.parent / "migrations" / "curator"
VERSION_TABLE = "alembic_version_curator"
MIGRATIONS = Migrations("curator", MIGRATIONS_DIR, VERSION_TABLE)

make_engine = kit.make_engine


class Database(kit.Database):
    """The curator's engine and session factories (``session(write=...)``; migrations: ``MIGRATIONS``)."""

    migrations = MIGRATIONS


def alembic_config() -> Config:
    return MIGRATIONS.config()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """``alembic upgrade <revision>`` on this engine (idempotent; run at every start-up)."""
    MIGRATIONS.upgrade(engine, revision)
