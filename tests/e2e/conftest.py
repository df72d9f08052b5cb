"""Both services as real processes (``pobo curator serve`` / ``pobo modeler serve``, i.e. uvicorn) on free
loopback ports, over SQLite or, when ``POBO_TEST_DATABASE_URL`` is set, PostgreSQL (both services in one
schema created for the test and dropped after it: their tables are prefixed, their version tables apart).
Each service's database is at the head revision before it starts (SQLite: its file put in its data dir;
PostgreSQL: its tables built in the schema; from a template migrated once per test process,
``tests.dbtemplate``), so the start-up's migration has nothing to do. Services started otherwise
(``pobo demo``, the walk-through's, TLS's, a restore's) start on an empty data dir and run every migration.

Each service runs as one process unless a test module overrides the ``workers`` fixture (e.g. with
params ``[1, 2]``: then every test runs against single processes and against uvicorn with 2 workers)."""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, text

from curator_service.db import Database as CuratorDatabase
from modeler_service.db import Database as ModelerDatabase
from shared.processes import ServiceProcess, free_port, modeler_env, service_pair, stop_all
from shared.protocol.client import CuratorClient
from tests.dbtemplate import pg_schema_at_head, sqlite_at_head
from tests.e2e.browser import browser  # noqa: F401  (the console tests' headless Chromium, a fixture)

PG_URL = os.environ.get("POBO_TEST_DATABASE_URL")


@dataclass
class Services:
    curator: ServiceProcess
    modeler: ServiceProcess
    admin_token: str
    modeler_token: str
    tmp: Path
    curator_db: str | None
    modeler_db: str | None
    workers: int = 1

    def admin(self) -> CuratorClient:
        return CuratorClient(self.curator.url, self.admin_token)

    def modeler_http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.modeler.url, headers={"Authorization": f"Bearer {self.modeler_token}"}, timeout=60
        )

    def new_modeler(self, **extra_env: str) -> ServiceProcess:
        """A new modeler process on the same data dir and database (a restart). The previous one is stopped
        first if it still runs (a test that killed it has nothing left to stop), so that no process
        outlives its test."""
        self.modeler.stop()
        env = modeler_env(self.tmp / "modeler", self.modeler_token, self.modeler_db, **extra_env)
        self.modeler = ServiceProcess(
            "modeler", port=free_port(), env=env, log_path=self.tmp / "modeler.log", workers=self.workers
        )
        self.modeler.start().wait_healthy()
        return self.modeler


@pytest.fixture
def workers() -> int:
    """uvicorn worker processes of each service (overridden by modules that test several workers)."""
    return 1


#: For e2e tests whose subject does not touch the database (TLS, logs, file modes, the throttle's own file,
#: a strategy's arithmetic): run them on SQLite only. The database paths they pass through run on PostgreSQL
#: in the unit tests (tests/curator_service, tests/modeler_service) and in the other e2e tests; this keeps
#: the suite inside CI's time limit.
SQLITE_ONLY = pytest.mark.parametrize("services", ["sqlite"], indirect=True)

#: For e2e tests of crashes, restarts and manual work, whose subject is the processes rather than the database
#: engine or the worker count alone: the embedded default (SQLite, one process per service) and the deployment
#: (PostgreSQL, uvicorn with 2 workers), instead of all four pairs. Both databases and both process models
#: still run; their crossings add minutes of CI and no path the two pairs do not take.
DEPLOYMENTS = pytest.mark.parametrize(
    ("services", "workers"),
    [("sqlite", 1), ("postgresql", 2)],
    indirect=True,
    ids=["sqlite-1-process", "postgresql-2-workers"],
)

#: For e2e tests of concurrent requests: 2 workers per service on each database (the case where requests race
#: across processes; one process's concurrency runs in the unit tests).
TWO_WORKERS = pytest.mark.parametrize(
    ("services", "workers"), [("sqlite", 2), ("postgresql", 2)], indirect=True, ids=["sqlite", "postgresql"]
)


@pytest.fixture(params=["sqlite", "postgresql"])
def services(request: pytest.FixtureRequest, tmp_path: Path, workers: int) -> Iterator[Services]:
    schema = None
    if request.param == "postgresql":
        if not PG_URL:
            pytest.skip("POBO_TEST_DATABASE_URL is not set")
        schema = f"pobo_e2e_{uuid.uuid4().hex[:10]}"
        engine = create_engine(PG_URL)
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        engine.dispose()
        for service, database in (("curator", CuratorDatabase), ("modeler", ModelerDatabase)):
            pg_schema_at_head(service, database, PG_URL, schema, create=False)  # both at head (as on SQLite)
        sep = "&" if "?" in PG_URL else "?"
        url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
        curator_db = modeler_db = url
    else:
        curator_db = modeler_db = None  # each service's default SQLite file in its data dir...
        for service, database in (("curator", CuratorDatabase), ("modeler", ModelerDatabase)):
            data_dir = tmp_path / service  # ...already at head (tests.dbtemplate): the start-up's migrate
            data_dir.mkdir(mode=0o700)  # finds nothing to do
            sqlite_at_head(service, database, data_dir / f"{service}.db")
    admin_token, modeler_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    curator, modeler = service_pair(tmp_path, admin_token, modeler_token, curator_db, workers=workers)
    s = Services(curator, modeler, admin_token, modeler_token, tmp_path, curator_db, modeler_db, workers)
    try:
        curator.start()
        modeler.start()
        curator.wait_healthy()
        modeler.wait_healthy()
        yield s
    finally:
        stop_all(s.modeler, s.curator)  # (a test may have replaced either by a restarted one)
        if schema is not None:
            engine = create_engine(PG_URL)  # type: ignore[arg-type]
            with engine.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            engine.dispose()


def write_csv(path: Path, n: int = 400, d: int = 4, seed: int = 3) -> np.ndarray:
    """A small synthetic dataset with a smooth outcome column ``objective``; returns the outcomes."""
    rng = np.random.default_rng(seed)
    X = rng.normal(0.0, 1.0, (n, d))
    y = np.exp(-0.5 * ((X - 1.0) ** 2).sum(1))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(",".join([*(f"x{j}" for j in range(d)), "objective"]) + "\n")
        for row, v in zip(X, y, strict=True):
            fh.write(",".join(f"{x:.6f}" for x in row) + f",{v:.6f}\n")
    return np.round(y, 6)
