"""SIGKILL the modeler in the middle of a run, start it again: nothing lost, nothing charged twice, and
the study resumes to completion (real processes)."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import Services
from tests.e2e.test_two_party import setup_release, wait_status

pytestmark = pytest.mark.slow

ITERATIONS = 30


def test_sigkill_mid_run_then_resume(services: Services) -> None:
    _, release, partner = setup_release(services, max_queries=ITERATIONS)  # the quota leaves no slack
    with services.modeler_http() as http:
        study = http.post(
            "/v1/studies",
            json={
                "curator_url": services.curator.url,
                "release_id": release.id,
                "curator_token": partner.token,
                "iterations": ITERATIONS,
                "hyperparameters": "mle",
            },
        ).json()
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        deadline = time.monotonic() + 60
        while http.get(f"/v1/studies/{study['id']}").json()["iterations_done"] < 8:
            assert time.monotonic() < deadline
            time.sleep(0.005)
    services.modeler.kill()  # SIGKILL: no shutdown code runs

    with services.admin() as admin:
        charged_at_kill = len(admin.list_queries(release.id).queries)
    services.new_modeler()
    with services.modeler_http() as http:
        after = http.get(f"/v1/studies/{study['id']}").json()
        assert after["status"] == "ready"  # a stale `running` study becomes resumable
        assert charged_at_kill - 1 <= after["iterations_done"] <= charged_at_kill  # at most one in flight
        assert http.get(f"/v1/studies/{study['id']}/audit/verify").json()["ok"]
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        done = wait_status(http, study["id"], {"done", "failed"})
        assert done["status"] == "done", done["error"]
        assert done["iterations_done"] == ITERATIONS
        audit = http.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
        assert http.get(f"/v1/studies/{study['id']}/audit/verify").json()["ok"]

    with services.admin() as admin:
        queries = admin.list_queries(release.id).queries
    assert len(queries) == ITERATIONS  # nothing charged twice (and the quota had no slack)
    assert [(q.id, q.index, q.y) for q in queries] == [
        (e["curator_query_id"], e["index"], e["y"]) for e in audit
    ]
    keys = [q.idempotency_key for q in queries if q.idempotency_key is not None]
    assert len(keys) == len(set(keys))


def test_sigterm_mid_run_stops_cleanly_and_resumes(services: Services) -> None:
    _, release, partner = setup_release(services, max_queries=20)
    with services.modeler_http() as http:
        study = http.post(
            "/v1/studies",
            json={
                "curator_url": services.curator.url,
                "release_id": release.id,
                "curator_token": partner.token,
                "iterations": 20,
                "hyperparameters": "mle",
            },
        ).json()
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        deadline = time.monotonic() + 60
        while http.get(f"/v1/studies/{study['id']}").json()["iterations_done"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.005)
    assert services.modeler.stop()  # SIGTERM: the runner is stopped, the study left resumable
    services.new_modeler()
    with services.modeler_http() as http:
        assert http.get(f"/v1/studies/{study['id']}").json()["status"] == "ready"
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        done = wait_status(http, study["id"], {"done", "failed"})
        assert done["status"] == "done" and done["iterations_done"] == 20
    with services.admin() as admin:
        assert len(admin.list_queries(release.id).queries) == 20
