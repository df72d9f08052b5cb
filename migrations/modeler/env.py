"""alembic environment of the modeler service (version table ``alembic_version_modeler``).

Run by ``modeler_service.db.upgrade`` at start-up (on the caller's connection), or from the command line
with ``POBO_MODELER_DATABASE_URL`` set; ``shared.servicekit.alembic_env.run_env`` does the work.
"""

from __future__ import annotations

from modeler_service.config import Settings
from modeler_service.db import MIGRATIONS
from modeler_service.models import Base
from shared.servicekit.alembic_env import run_env

run_env(Base.metadata, MIGRATIONS, Settings)
