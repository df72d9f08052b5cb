"""The body of both services' alembic ``env.py``: each env.py calls :func:`run_env` with its metadata,
its :class:`~shared.servicekit.migrations.Migrations` and its settings class.

Online (the usual case) the migrations run on the connection the caller put in
``config.attributes["connection"]`` (``servicekit.migrations.run_migrations``, at every start-up), or,
from the alembic command line, on a fresh engine for the service's configured database. Offline
(``alembic upgrade --sql``) they are rendered for ``POBO_<SERVICE>_DATABASE_URL`` (default: the SQLite
file under ``pobo-data/<service>``). On PostgreSQL a transaction-scoped advisory lock, one key per
service, serialises concurrent start-ups (two containers, the supervisors of several workers); SQLite's
write lock does that by itself. Batch mode (``render_as_batch``) lets migrations alter tables on SQLite.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from alembic import context
from sqlalchemy import Connection, MetaData, create_engine, text

from shared.servicekit.migrations import Migrations
from shared.servicekit.settings import ServiceSettings

__all__ = ["run_env"]


def _run(connection: Connection | None, migrations: Migrations, **options: Any) -> None:
    if connection is not None and connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": migrations.pg_lock_key})
    context.configure(
        connection=connection, version_table=migrations.version_table, render_as_batch=True, **options
    )
    with context.begin_transaction():
        context.run_migrations()


def run_env(
    target_metadata: MetaData, migrations: Migrations, settings: Callable[[], ServiceSettings]
) -> None:
    """Run the migrations alembic asked for (called when alembic loads a service's ``env.py``).

    ``settings()`` builds the service's settings; called only for a command-line run, for its database URL.
    """
    if context.is_offline_mode():
        service = migrations.service
        url = os.environ.get(
            f"POBO_{service.upper()}_DATABASE_URL", f"sqlite:///pobo-data/{service}/{service}.db"
        )
        _run(None, migrations, url=url, target_metadata=target_metadata, literal_binds=True)
        return
    given: Connection | None = context.config.attributes.get("connection")
    if given is not None:
        _run(given, migrations, target_metadata=target_metadata, compare_type=True)
        return
    engine = create_engine(settings().resolved_database_url())
    try:
        with engine.begin() as conn:
            _run(conn, migrations, target_metadata=target_metadata, compare_type=True)
    finally:
        engine.dispose()
