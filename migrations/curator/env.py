"""alembic environment of the curator service (version table ``alembic_version_curator``).

Run by ``curator_service.db.upgrade`` at start-up (on the caller's connection), or from the command line
with ``POBO_CURATOR_DATABASE_URL`` set; ``shared.servicekit.alembic_env.run_env`` does the work.
"""

from __future__ import annotations

from curator_service.config import Settings
from curator_service.db import MIGRATIONS
from curator_service.models import Base
from shared.servicekit.alembic_env import run_env

run_env(Base.metadata, MIGRATIONS, Settings)
