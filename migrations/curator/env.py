"""alembic environment of the curator service (version table ``alembic_version_curator``).

Run by ``curator_service.db.upgrade`` at start-up (on the caller's connection), or from the command line
with ``POBO_CURATOR_DATABASE_URL`` set; the work is done by ``shared.servicekit.alembic_env.run_env``.
"""

from __future__ import annotations

from curator_service.db import VERSION_TABLE
from curator_service.models import Base
from shared.servicekit.alembic_env import run_env


def _database_url() -> str:
    from curator_service.config import Settings

    return Settings().resolved_database_url()


run_env(
    Base.metadata,
    VERSION_TABLE,
    pg_lock_key=0x706F626F_63757261,  # "pobocura"
    offline_url_variable="POBO_CURATOR_DATABASE_URL",
    offline_default_url="sqlite:///pobo-data/curator/curator.db",
    database_url=_database_url,
)
