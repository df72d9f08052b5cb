"""alembic environment of the curator service (version table ``alembic_version_curator``).

Run programmatically by ``curator_service.db.upgrade`` at start-up (the caller passes a connection in
``config.attributes["connection"]``), or from the command line with ``POBO_CURATOR_DATABASE_URL`` set.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection, create_engine, text

from curator_service.db import VERSION_TABLE
from curator_service.models import Base

config = context.config
target_metadata = Base.metadata
#: Serialises concurrent start-ups on PostgreSQL (any constant unique to this service).
_PG_LOCK_KEY = 0x706F626F_63757261  # "pobocura"


def _run(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=os.environ.get("POBO_CURATOR_DATABASE_URL", "sqlite:///pobo-data/curator/curator.db"),
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from curator_service.config import Settings

    engine = create_engine(Settings().resolved_database_url())
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
