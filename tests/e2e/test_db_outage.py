"""Issue 5, item 2 (database part): PostgreSQL goes away under both running services.

The services reach PostgreSQL through a small TCP proxy owned by the test, so the test can take the
database "down" (every connection cut, new ones refused) and bring it back, without touching the server
other tests use. Also the plain connection drop: ``pg_terminate_backend`` on the services' backends.
While down: requests that need the database answer 503 (JSON, Retry-After) and /healthz says unreachable;
afterwards both services serve again by themselves (pool pre-ping), with no restart.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from shared.processes import ServiceProcess, curator_env, free_port, modeler_env
from tests.e2e.conftest import write_csv

pytestmark = pytest.mark.slow
PG_URL = os.environ.get("POBO_TEST_DATABASE_URL")


class TcpProxy:
    """Forwards 127.0.0.1:<port> to PostgreSQL; ``down()`` cuts every connection and refuses new ones."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def up(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        if self._listener is not None:
            try:  # wakes the thread blocked in accept() (close() alone would leave the port listening)
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture(params=["postgresql"])
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if not PG_URL:
        pytest.skip("POBO_TEST_DATABASE_URL is not set (the outage test needs PostgreSQL)")
    url = make_url(PG_URL)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    proxy.up()
    schema = f"pobo_outage_{uuid.uuid4().hex[:10]}"
    app_name = f"pobo_outage_{uuid.uuid4().hex[:8]}"
    admin_engine = create_engine(PG_URL)
    with admin_engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    service_url = url.set(host="127.0.0.1", port=proxy.port).update_query_dict(
        {"options": f"-csearch_path={schema}", "application_name": app_name}
    )
    db = service_url.render_as_string(hide_password=False)
    admin_token, modeler_token = "outage-admin-" + uuid.uuid4().hex, "outage-modeler-" + uuid.uuid4().hex
    curator = ServiceProcess(
        "curator",
        port=free_port(),
        env=curator_env(tmp_path / "c", admin_token, db),
        log_path=tmp_path / "c.log",
    )
    modeler = ServiceProcess(
        "modeler",
        port=free_port(),
        env=modeler_env(tmp_path / "m", modeler_token, db),
        log_path=tmp_path / "m.log",
    )
    try:
        curator.start()
        modeler.start()
        curator.wait_healthy()
        modeler.wait_healthy()
        yield {
            "proxy": proxy,
            "curator": curator,
            "modeler": modeler,
            "admin": admin_token,
            "modeler_token": modeler_token,
            "app_name": app_name,
            "admin_engine": admin_engine,
            "tmp": tmp_path,
        }
    finally:
        modeler.stop()
        curator.stop()
        proxy.down()
        with admin_engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin_engine.dispose()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_database_outage_gives_503_and_services_recover(outage: dict[str, Any]) -> None:
    cur = httpx.Client(base_url=outage["curator"].url, headers=_auth(outage["admin"]), timeout=30)
    mod = httpx.Client(base_url=outage["modeler"].url, headers=_auth(outage["modeler_token"]), timeout=30)
    csv = outage["tmp"] / "d.csv"
    write_csv(csv, n=200)
    with open(csv, "rb") as fh:
        ds = cur.post(
            "/v1/datasets",
            files={"file": ("d.csv", fh, "text/csv")},
            data={"name": "o", "objective": "objective"},
        )
    assert ds.status_code == 201, ds.text
    rel = cur.post(f"/v1/datasets/{ds.json()['id']}/releases", json={"epsilon": 1, "delta": 1e-5, "r": 3})
    assert rel.status_code == 201, rel.text
    partner = cur.post(
        "/v1/partners", json={"name": "m", "release_ids": [rel.json()["id"]], "max_queries": 20}
    ).json()
    study = mod.post(
        "/v1/studies",
        json={
            "curator_url": outage["curator"].url,
            "release_id": rel.json()["id"],
            "curator_token": partner["token"],
            "iterations": 6,
            "hyperparameters": {"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 1e-4},
        },
    )
    assert study.status_code == 201, study.text
    sid = study.json()["id"]
    assert mod.post(f"/v1/studies/{sid}/step").status_code == 200

    # 1. connection drop: the services' backends are terminated; the next requests reconnect (pre-ping)
    with outage["admin_engine"].begin() as conn:
        killed = conn.execute(
            text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = :a"),
            {"a": outage["app_name"]},
        ).scalar_one()
    assert killed >= 2  # at least one pooled connection of each service
    assert cur.get("/v1/datasets").status_code == 200
    assert mod.get(f"/v1/studies/{sid}").status_code == 200

    # 2. outage: everything needing the database answers 503, fast, with a message and Retry-After
    outage["proxy"].down()
    started = time.monotonic()
    down = [
        cur.get("/v1/datasets"),
        cur.get("/healthz"),
        mod.get(f"/v1/studies/{sid}"),
        mod.get("/healthz"),
        mod.post(f"/v1/studies/{sid}/step"),
    ]
    assert [r.status_code for r in down] == [503] * 5, [(r.status_code, r.text) for r in down]
    assert time.monotonic() - started < 30
    for r in (down[0], down[2]):
        assert "database is unavailable" in r.json()["detail"] and r.headers["retry-after"]
    assert down[1].json()["database"] == "unreachable" and down[3].json()["database"] == "unreachable"

    # 3. back: both serve again without a restart, and the study goes on where it was
    outage["proxy"].up()
    recovered = time.monotonic()
    while cur.get("/healthz").status_code != 200 or mod.get("/healthz").status_code != 200:
        assert time.monotonic() - recovered < 30, "services did not recover"
        time.sleep(0.2)
    step = mod.post(f"/v1/studies/{sid}/step")
    assert step.status_code == 200, step.text
    assert step.json()["iteration"] == 2
    verify = mod.get(f"/v1/studies/{sid}/audit/verify").json()
    assert verify["ok"] and verify["entries"] == 2
    queries = cur.get(f"/v1/releases/{rel.json()['id']}/queries").json()
    assert [q["id"] for q in queries["queries"]] == [
        e["curator_query_id"] for e in mod.get(f"/v1/studies/{sid}/audit").json()["entries"]
    ]
