"""alembic environment of the modeler service (version table ``alembic_version_modeler``).

Run by ``modeler_service.db.upgrade`` at start-up (on the caller's connection), or from the command line
with ``POBO_MODELER_DATABASE_URL`` set; the work is done by ``shared.servicekit.alembic_env.run_env``.
"""

from __future__ import annotations

from modeler_service.db import VERSION_TABLE
from modeler_service.models import Base
from shared.servicekit.alembic_env import run_env


def _database_url() -> str:
    from modeler_service.config import Settings

    return Settings().resolved_database_url()


run_env(
    Base.metadata,
    VERSION_TABLE,
    pg_lock_key=0x706F626F_6D6F6465,  # "pobomode"
    offline_url_variable="POBO_MODELER_DATABASE_URL",
    offline_default_url="sqlite:///pobo-data/modeler/modeler.db",
    database_url=_database_url,
)
