"""Issue 12, item 4, on real processes: the curator is killed in the middle of a background run and started
again on the same port. The study waits (``waiting_for_curator``, with the error and the next attempt's
time) and finishes by itself; both logs reconcile and no iteration is charged twice."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from shared.processes import ServiceProcess
from shared.tools.reconcile import reconcile
from tests.e2e.conftest import SQLITE_ONLY, Services
from tests.e2e.test_two_party import FIXED_HP, setup_release, study_body

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # see SQLITE_ONLY in conftest


def _until(http: httpx.Client, study_id: str, predicate: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        study = http.get(f"/v1/studies/{study_id}").json()
        if predicate(study):
            return study
        assert time.monotonic() < deadline, f"timed out; last state {study}"
        time.sleep(0.05)


def test_a_run_survives_a_curator_restart(services: Services) -> None:
    services.new_modeler(  # quick retries, so that the test does not wait long
        POBO_MODELER_CURATOR_RETRIES="0",
        POBO_MODELER_CURATOR_RETRY_BASE_SECONDS="0.2",
        POBO_MODELER_CURATOR_RETRY_MAX_SECONDS="1",
    )
    _, release, partner = setup_release(services, max_queries=40)
    total = 30
    with services.modeler_http() as http:
        study = http.post("/v1/studies", json=study_body(services, release, partner, total, FIXED_HP)).json()
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        _until(http, study["id"], lambda s: s["iterations_done"] >= 5)
        old = services.curator
        old.kill()  # the curator dies mid-run (SIGKILL: no shutdown code runs)
        waiting = _until(http, study["id"], lambda s: s["status"] == "waiting_for_curator")
        assert "could not be reached" in waiting["error"] and waiting["retry_at"] is not None
        assert waiting["iterations_done"] < total
        services.curator = ServiceProcess(
            "curator", port=old.port, env=old.env, log_path=old.log_path, workers=services.workers
        )
        services.curator.start().wait_healthy()  # the same data dir and database: nothing was lost
        done = _until(http, study["id"], lambda s: s["status"] in ("done", "failed"))
    assert done["status"] == "done", done["error"]
    assert done["iterations_done"] == total and done["error"] is None
    with services.admin() as admin:
        assert admin.get_partner(partner.id).queries_used == total  # not one charged twice
    report = reconcile(
        curator_url=services.curator.url,
        curator_token=services.admin_token,
        modeler_url=services.modeler.url,
        modeler_token=services.modeler_token,
        study_id=study["id"],
    )
    assert report.ok and report.curator_entries == report.modeler_entries == total
