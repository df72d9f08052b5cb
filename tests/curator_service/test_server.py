"""The curator as a real process: ``python -m shared.tools.cli curator serve`` driven over HTTP, then
restarted.

Uses the generated admin token (first start writes ``<data dir>/admin-token``, later starts reuse it), and
checks that a restart loses nothing: datasets, releases (same bytes), partners, queries, ledger.
"""

from __future__ import annotations

import hashlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.curator_service.conftest import make_csv, synthetic

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, database_url: str, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("POBO_CURATOR_")}
        env |= {"POBO_CURATOR_DATA_DIR": str(data_dir), "POBO_CURATOR_DATABASE_URL": database_url}
        self.log = log
        with open(log, "ab") as fh:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [
                    sys.executable,
                    "-m",
                    "shared.tools.cli",
                    "curator",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                cwd=REPO,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited early:\n{log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"server did not become healthy:\n{log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_real_process_end_to_end_and_restart(tmp_path: Path, database_url: str) -> None:
    data_dir = tmp_path / "curator-data"
    log = tmp_path / "server.log"
    server = Server(data_dir, database_url, log)
    try:
        token = (data_dir / "admin-token").read_text().strip()
        assert token in log.read_text()  # printed once, on first start
        admin = {"Authorization": f"Bearer {token}"}
        X, y = synthetic(n=80, d=5)
        with httpx.Client(base_url=server.url, timeout=60) as c:
            up = c.post(
                "/v1/datasets",
                headers=admin,
                files={"file": ("d.csv", make_csv(X, y), "text/csv")},
                data={"name": "real", "objective": "outcome"},
            )
            assert up.status_code == 201, up.text
            ds = up.json()["id"]
            rel = c.post(
                f"/v1/datasets/{ds}/releases", headers=admin, json={"epsilon": 1, "delta": 1e-5, "r": 3}
            )
            assert rel.status_code == 201, rel.text
            rid = rel.json()["id"]
            partner = c.post(
                "/v1/partners", headers=admin, json={"name": "m", "release_ids": [rid], "max_queries": 4}
            )
            ph = {"Authorization": f"Bearer {partner.json()['token']}"}
            npy = c.get(f"/v1/releases/{rid}/rows", headers={**ph, "Accept": "application/x-npy"})
            assert npy.status_code == 200 and hashlib.sha256(npy.content).hexdigest() == rel.json()["sha256"]
            q = c.post(
                f"/v1/releases/{rid}/queries", headers={**ph, "Idempotency-Key": "s1-1"}, json={"index": 3}
            )
            assert q.status_code == 201 and q.json()["y"] == float(y[3])
            assert c.get("/v1/datasets", headers=ph).status_code == 403
            assert c.get("/v1/datasets").status_code == 401
            before = {
                "datasets": c.get("/v1/datasets", headers=admin).json(),
                "release": c.get(f"/v1/releases/{rid}", headers=admin).json(),
                "queries": c.get(f"/v1/releases/{rid}/queries", headers=admin).json(),
                "ledger": c.get(f"/v1/datasets/{ds}/ledger", headers=admin).json(),
            }
    finally:
        server.stop()
    assert server.proc.returncode == 0, log.read_text()  # SIGTERM: graceful shutdown, clean exit
    assert "Application shutdown complete" in log.read_text()

    log.write_text("")
    server = Server(data_dir, database_url, log)
    try:
        assert token not in log.read_text()  # the token file is reused, not printed again
        assert (data_dir / "admin-token").read_text().strip() == token
        with httpx.Client(base_url=server.url, timeout=60) as c:
            after = {
                "datasets": c.get("/v1/datasets", headers=admin).json(),
                "release": c.get(f"/v1/releases/{rid}", headers=admin).json(),
                "queries": c.get(f"/v1/releases/{rid}/queries", headers=admin).json(),
                "ledger": c.get(f"/v1/datasets/{ds}/ledger", headers=admin).json(),
            }
            assert after == before
            again = c.get(f"/v1/releases/{rid}/rows", headers={**ph, "Accept": "application/x-npy"})
            assert again.content == npy.content
            replay = c.post(
                f"/v1/releases/{rid}/queries", headers={**ph, "Idempotency-Key": "s1-1"}, json={"index": 3}
            )
            assert replay.status_code == 201 and replay.json() == q.json()
            Z = np.load(io.BytesIO(again.content))
            assert Z.shape == (80, 3)
            log_entries = c.get("/v1/access-log", headers=admin).json()["entries"]
            assert any(e["actor"].startswith("partner:") for e in log_entries)
    finally:
        server.stop()
