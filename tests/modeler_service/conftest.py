"""Fixtures of the modeler service tests: a fake curator, a database (SQLite, or PostgreSQL when
``POBO_TEST_DATABASE_URL`` is set), the app and an authenticated client."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from modeler_service.config import Settings
from modeler_service.db import Database
from modeler_service.main import create_app
from shared.protocol.client import CuratorClient
from tests.dbtemplate import pg_schema_at_head, sqlite_at_head
from tests.modeler_service.fake_curator import PARTNER_TOKEN, FakeCurator

TOKEN = "modeler-test-token-0123456789abcdef"  # noqa: S105 - test fixture
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PG_URL = os.environ.get("POBO_TEST_DATABASE_URL")


def pg_schema_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture
def pg_schema(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """A dedicated PostgreSQL schema per test, at the head revision (dropped at the end): isolated,
    repeatable runs."""
    if not PG_URL or "postgresql" not in request.node.name:
        yield None
        return
    schema = f"pobo_modeler_test_{uuid.uuid4().hex[:10]}"
    engine = create_engine(PG_URL)
    pg_schema_at_head("modeler", Database, PG_URL, schema)  # its tables at head (tests.dbtemplate)
    yield schema
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str | None) -> str:
    if request.param == "sqlite":
        return sqlite_at_head("modeler", Database, tmp_path / "modeler.db")
    if not PG_URL or pg_schema is None:
        pytest.skip("POBO_TEST_DATABASE_URL is not set")
    return pg_schema_url(PG_URL, pg_schema)


@pytest.fixture
def curator() -> FakeCurator:
    return FakeCurator()


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "modeler",
        database_url=database_url,
        token=TOKEN,
        poll_seconds=0.5,
        curator_retries=2,
    )


def make_app(settings: Settings, curator: FakeCurator) -> Any:
    def factory(url: str, token: str) -> CuratorClient:
        return CuratorClient(url, token, transport=curator.transport(), retries=2, backoff=0.0)

    return create_app(settings, client_factory=factory)


@pytest.fixture
def app(settings: Settings, curator: FakeCurator) -> Any:
    return make_app(settings, curator)


@pytest.fixture
def client(app: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    with TestClient(app, headers=AUTH) as c:
        yield c


def study_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "curator_url": "http://curator.test",
        "release_id": 1,
        "curator_token": PARTNER_TOKEN,
        "strategy": "gp-ucb",
        "iterations": 8,
        "hyperparameters": {"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 1e-4},
        "initial_points": 2,
        "seed": 7,
    }
    body.update(overrides)
    return body
