"""Fixtures of the fuzz tests: the curator service fixtures (fresh SQLite / PostgreSQL database per test),
with the failed-token throttle off (the fuzzer sends wrong tokens on purpose, hundreds of times)."""

from pathlib import Path

import pytest

from curator_service.config import Settings
from tests.curator_service.conftest import ADMIN_TOKEN, anyio_backend, app, data_dir, database_url

__all__ = ["anyio_backend", "app", "data_dir", "database_url", "settings"]


@pytest.fixture
def settings(database_url: str, data_dir: Path) -> Settings:
    return Settings(
        database_url=database_url, data_dir=data_dir, admin_token=ADMIN_TOKEN, auth_max_failures=0
    )
