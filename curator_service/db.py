"""The curator's database: the kit's engine and sessions (``shared.servicekit.db``, where the SQLite and
PostgreSQL policy is written down) bound to the curator's alembic environment and version table."""

from __future__ import annotations

from shared.servicekit import db as kit
from shared.servicekit.migrations import Migrations

#: alembic environment of this service: <source>/migrations/curator, version table alembic_version_curator.
MIGRATIONS = Migrations.of("curator")
MIGRATIONS_DIR, VERSION_TABLE = MIGRATIONS.directory, MIGRATIONS.version_table
alembic_config, upgrade = MIGRATIONS.config, MIGRATIONS.upgrade


class Database(kit.Database):
    """The curator's engine and session factories (``session(write=...)``; migrations: ``MIGRATIONS``)."""

    migrations = MIGRATIONS
