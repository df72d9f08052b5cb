"""Issue 36 over HTTP: a modeler with ``backend: dask`` (its own local Dask cluster) runs a GP-UCB study at
its defaults to done while one of the cluster's worker processes is killed in the middle of the run; the
audit chain verifies and ``pobo reconcile`` finds the curator's log and the modeler's in agreement."""

from __future__ import annotations

import signal
import time
from typing import Any

import psutil
import pytest

from shared.tools.reconcile import reconcile
from tests.e2e.conftest import SQLITE_ONLY, Services
from tests.e2e.test_two_party import setup_release, study_body, wait_status

pytest.importorskip("distributed", reason="the dask extra (pobo[dask]) is part of pobo[test]")

pytestmark = pytest.mark.slow

ITERATIONS = 24


def _dask_workers(services: Services) -> list[psutil.Process]:
    """The modeler's Dask worker processes (spawned by its local cluster's nannies)."""
    assert services.modeler.proc is not None
    children = psutil.Process(services.modeler.proc.pid).children(recursive=True)
    return [p for p in children if "spawn_main" in " ".join(p.cmdline())]


@SQLITE_ONLY  # the database is not the subject: the GP loop's backend is
def test_a_study_on_the_dask_backend_survives_a_killed_worker_and_reconciles(services: Services) -> None:
    _, release, partner = setup_release(services)
    services.new_modeler(
        POBO_MODELER_BACKEND="dask", POBO_MODELER_DASK_LOCAL_WORKERS="2", POBO_MODELER_DASK_PARTITIONS="3"
    )
    with services.modeler_http() as http:
        created = http.post("/v1/studies", json=study_body(services, release, partner, ITERATIONS))
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        assert http.post(f"/v1/studies/{sid}/run").status_code == 202
        deadline = time.monotonic() + 120
        while http.get(f"/v1/studies/{sid}").json()["iterations_done"] < 8:
            assert time.monotonic() < deadline, "the study did not reach 8 iterations"
            time.sleep(0.05)
        workers = _dask_workers(services)
        assert len(workers) == 2, [p.cmdline() for p in workers]
        workers[0].send_signal(signal.SIGKILL)  # no clean-up: its partitions are recomputed elsewhere
        done = wait_status(http, sid, {"done", "failed"}, timeout=300)
        assert done["status"] == "done", done["error"]
        assert done["iterations_done"] == ITERATIONS
        assert http.get(f"/v1/studies/{sid}/audit/verify").json()["ok"]
    assert "GP-UCB loops run on the Dask cluster" in services.modeler.log_tail(400)
    assert not workers[0].is_running()
    report: Any = reconcile(
        curator_url=services.curator.url,
        curator_token=services.admin_token,
        modeler_url=services.modeler.url,
        modeler_token=services.modeler_token,
        study_id=sid,
    )
    assert report.ok, report.mismatches
