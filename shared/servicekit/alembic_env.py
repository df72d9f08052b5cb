"""The body of both services' alembic ``env.py``: each env.py names its metadata and version table and
calls :func:`run_env`.

Online (the usual case) the migrations run on the connection the caller put in
``config.attributes["connection"]`` (``servicekit.migrations.run_migrations``, at every start-up), or,
from the alembic command line, on a fresh engine for the service's configured database. Offline
(``alembic upgrade --sql``) they are rendered against the service's ``<PREFIX>DATABASE_URL``. On
PostgreSQL a transaction-scoped advisory lock, one key per service, serialises concurrent start-ups (two
containers, several workers' supervisors); SQLite's write lock does that by itself. Batch mode
(``render_as_batch``) lets migrations alter tables on SQLite.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from alembic import context
from sqlalchemy import Connection, MetaData, create_engine, text

__all__ = ["run_env"]


def _configure_and_run(
    connection: Connection, target_metadata: MetaData, version_table: str, lock: int
) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock})
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=version_table,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_env(
    target_metadata: MetaData,
    version_table: str,
    *,
    pg_lock_key: int,
    offline_url_variable: str,
    offline_default_url: str,
    database_url: Callable[[], str],
) -> None:
    """Run the migrations alembic asked for (called at import of a service's ``env.py``).

    ``pg_lock_key``: the service's advisory-lock key (any 64-bit constant unique to it).
    ``offline_url_variable`` / ``offline_default_url``: where offline mode finds its URL.
    ``database_url()``: the service's configured URL (its settings), for a command-line run.
    """
    if context.is_offline_mode():
        context.configure(
            url=os.environ.get(offline_url_variable, offline_default_url),
            target_metadata=target_metadata,
            version_table=version_table,
            render_as_batch=True,
            literal_binds=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection, target_metadata, version_table, pg_lock_key)
        return
    engine = create_engine(database_url())
    try:
        with engine.begin() as conn:
            _configure_and_run(conn, target_metadata, version_table, pg_lock_key)
    finally:
        engine.dispose()
