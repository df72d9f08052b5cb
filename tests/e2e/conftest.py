"""Both services as real processes (``pobo curator serve`` / ``pobo modeler serve``, i.e. uvicorn) on free
loopback ports, over SQLite or, when ``POBO_TEST_DATABASE_URL`` is set, PostgreSQL (both services in one
schema created for the test and dropped after it: their tables are prefixed, their version tables apart)."""

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

from shared.client import CuratorClient
from shared.demo import ServiceProcess, curator_env, free_port, modeler_env

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

    def admin(self) -> CuratorClient:
        return CuratorClient(self.curator.url, self.admin_token)

    def modeler_http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.modeler.url, headers={"Authorization": f"Bearer {self.modeler_token}"}, timeout=60
        )

    def new_modeler(self, **extra_env: str) -> ServiceProcess:
        """A new modeler process on the same data dir and database (a restart)."""
        env = modeler_env(self.tmp / "modeler", self.modeler_token, self.modeler_db, **extra_env)
        self.modeler = ServiceProcess("modeler", port=free_port(), env=env, log_path=self.tmp / "modeler.log")
        self.modeler.start().wait_healthy()
        return self.modeler


@pytest.fixture(params=["sqlite", "postgresql"])
def services(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Services]:
    schema = None
    if request.param == "postgresql":
        if not PG_URL:
            pytest.skip("POBO_TEST_DATABASE_URL is not set")
        schema = f"pobo_e2e_{uuid.uuid4().hex[:10]}"
        engine = create_engine(PG_URL)
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        sep = "&" if "?" in PG_URL else "?"
        url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
        curator_db = modeler_db = url
    else:
        curator_db = modeler_db = None  # each service's default SQLite file in its data dir
    admin_token, modeler_token = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    curator = ServiceProcess(
        "curator",
        port=free_port(),
        env=curator_env(tmp_path / "curator", admin_token, curator_db),
        log_path=tmp_path / "curator.log",
    )
    modeler = ServiceProcess(
        "modeler",
        port=free_port(),
        env=modeler_env(tmp_path / "modeler", modeler_token, modeler_db),
        log_path=tmp_path / "modeler.log",
    )
    s = Services(curator, modeler, admin_token, modeler_token, tmp_path, curator_db, modeler_db)
    try:
        curator.start()
        modeler.start()
        curator.wait_healthy()
        modeler.wait_healthy()
        yield s
    finally:
        s.modeler.stop()
        curator.stop()
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
