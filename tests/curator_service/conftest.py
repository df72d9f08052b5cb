"""Fixtures of the curator service tests.

Every test gets a fresh data dir and a fresh database: a SQLite file under ``tmp_path``, and — when
``POBO_TEST_DATABASE_URL`` is set — the same test again on PostgreSQL in a schema of its own
(``curator_test_<random>``, selected through ``search_path`` and dropped afterwards, so runs are repeatable
and tables of other services in that database are never touched).

Both come at the head revision from a template migrated once per test process (``tests.dbtemplate``).
The app is driven in-process through ``httpx.AsyncClient(transport=ASGITransport(app))``; ``create_app``
applies the migrations itself, so no lifespan is needed.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy.engine import make_url

from curator_service.config import Settings
from curator_service.db import Database
from curator_service.main import create_app
from tests.dbtemplate import pg_schema_at_head, sqlite_at_head

ADMIN_TOKEN = "test-admin-token-0123456789abcdef0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PG_URL = os.environ.get("POBO_TEST_DATABASE_URL")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _pg_admin_connect() -> Any:
    import psycopg

    url = make_url(PG_URL).set(drivername="postgresql")  # type: ignore[arg-type]
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param(
            "postgresql",
            marks=pytest.mark.skipif(not PG_URL, reason="POBO_TEST_DATABASE_URL is not set"),
        ),
    ]
)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database at the head revision for one test (SQLite file or a PostgreSQL schema; from a
    template migrated once per test process, ``tests.dbtemplate``)."""
    if request.param == "sqlite":
        yield sqlite_at_head("curator", Database, tmp_path / "curator-test.db")
        return
    assert PG_URL is not None
    schema = f"curator_test_{uuid.uuid4().hex[:12]}"
    try:
        yield pg_schema_at_head("curator", Database, PG_URL, schema)
    finally:
        with _pg_admin_connect() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def settings(database_url: str, data_dir: Path) -> Settings:
    return Settings(database_url=database_url, data_dir=data_dir, admin_token=ADMIN_TOKEN)


@pytest.fixture
def app(settings: Settings) -> Iterator[Any]:
    application = create_app(settings)
    yield application
    application.state.components.db.dispose()


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://curator.test", timeout=60) as c:
        yield c


# ----------------------------------------------------------------------------------------------- helpers


def make_csv(
    X: np.ndarray,
    y: np.ndarray | None = None,
    names: list[str] | None = None,
    objective: str = "outcome",
    newline: str = "\n",
) -> bytes:
    """A CSV with a header row; cells formatted with repr (exact float64 round trip)."""
    names = names or [f"x{j}" for j in range(X.shape[1])]
    header = list(names) + ([objective] if y is not None else [])
    out = io.StringIO()
    out.write(",".join(header) + newline)
    for i, row in enumerate(X):
        cells = [repr(float(v)) for v in row]
        if y is not None:
            cells.append(repr(float(y[i])))
        out.write(",".join(cells) + newline)
    return out.getvalue().encode("utf-8")


async def upload(
    client: httpx.AsyncClient,
    content: bytes,
    *,
    headers: dict[str, str] | None = None,
    **form: Any,
) -> httpx.Response:
    data = {"name": "cohort"} | {k: str(v) for k, v in form.items() if v is not None}
    return await client.post(
        "/v1/datasets",
        headers=ADMIN if headers is None else headers,
        files={"file": ("data.csv", content, "text/csv")},
        data=data,
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def synthetic(n: int = 120, d: int = 6, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Features with distinctive values (never small integers) and a smooth outcome."""
    rng = np.random.default_rng(seed)
    X = rng.normal(loc=3.0, scale=2.0, size=(n, d)) + rng.uniform(0.001, 0.002, size=(n, d))
    y = np.sin(X[:, 0]) + 0.1 * X[:, 1]
    return X, y


@dataclass
class World:
    """A dataset uploaded (column outcomes), one release of it, and a partner granted that release."""

    client: httpx.AsyncClient
    X: np.ndarray
    y: np.ndarray
    dataset: dict[str, Any]
    release: dict[str, Any]
    partner: dict[str, Any]

    @property
    def partner_headers(self) -> dict[str, str]:
        return bearer(self.partner["token"])


@pytest.fixture
async def world(client: httpx.AsyncClient) -> World:
    X, y = synthetic()
    response = await upload(client, make_csv(X, y), name="cohort-a", objective="outcome", epsilon_budget=5)
    assert response.status_code == 201, response.text
    dataset = response.json()
    response = await client.post(
        f"/v1/datasets/{dataset['id']}/releases", headers=ADMIN, json={"epsilon": 1.0, "delta": 1e-5, "r": 4}
    )
    assert response.status_code == 201, response.text
    release = response.json()
    response = await client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "modeler", "release_ids": [release["id"]], "max_queries": 5},
    )
    assert response.status_code == 201, response.text
    return World(client=client, X=X, y=y, dataset=dataset, release=release, partner=response.json())
