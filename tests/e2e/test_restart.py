"""SIGKILL the modeler in the middle of a run, start it again: nothing lost, nothing charged twice, and
the study resumes to completion (real processes)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import DEPLOYMENTS, SQLITE_ONLY, Services
from tests.e2e.test_two_party import setup_release, study_body, wait_status

pytestmark = pytest.mark.slow


@pytest.fixture(params=[1, 2], ids=["1-process", "2-workers"])
def workers(request: pytest.FixtureRequest) -> int:
    """Each test against single processes and against uvicorn with 2 workers per service (the SIGKILL test:
    the pairs of its ``DEPLOYMENTS`` mark)."""
    return int(request.param)


ITERATIONS = 30
#: Enough iterations that a graceful stop (which, with workers, the supervisor relays within ~0.5 s) lands
#: mid-run.
SIGTERM_ITERATIONS = 80


def start_run(http: httpx.Client, services: Services, release: Any, partner: Any, iterations: int) -> str:
    """A study with MLE hyper-parameters over ``release``, its run started (202); returns its id."""
    study = http.post("/v1/studies", json=study_body(services, release, partner, iterations)).json()
    assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
    return str(study["id"])


def wait_iterations(http: httpx.Client, study_ids: list[str], at_least: int) -> None:
    deadline = time.monotonic() + 60
    while min(http.get(f"/v1/studies/{i}").json()["iterations_done"] for i in study_ids) < at_least:
        assert time.monotonic() < deadline
        time.sleep(0.005)


@DEPLOYMENTS
def test_sigkill_mid_run_then_resume(services: Services) -> None:
    _, release, partner = setup_release(services, max_queries=ITERATIONS)  # the quota leaves no slack
    with services.modeler_http() as http:
        study = {"id": start_run(http, services, release, partner, ITERATIONS)}
        wait_iterations(http, [study["id"]], 8)
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


@SQLITE_ONLY  # the PostgreSQL path of a resume: test_sigkill_mid_run_then_resume
def test_sigterm_mid_run_stops_cleanly_and_resumes(services: Services) -> None:
    _, release, partner = setup_release(services, max_queries=SIGTERM_ITERATIONS)
    with services.modeler_http() as http:
        study = {"id": start_run(http, services, release, partner, SIGTERM_ITERATIONS)}
        wait_iterations(http, [study["id"]], 3)
    assert services.modeler.stop()  # SIGTERM: the runner is stopped, the study left resumable
    services.new_modeler()
    with services.modeler_http() as http:
        stopped = http.get(f"/v1/studies/{study['id']}").json()
        assert stopped["status"] == "ready" and stopped["iterations_done"] < SIGTERM_ITERATIONS
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        done = wait_status(http, study["id"], {"done", "failed"})
        assert done["status"] == "done" and done["iterations_done"] == SIGTERM_ITERATIONS
    with services.admin() as admin:
        assert len(admin.list_queries(release.id).queries) == SIGTERM_ITERATIONS


@SQLITE_ONLY
def test_resume_on_start_runs_each_study_once(services: Services) -> None:
    """Killed mid-run with two studies running; restarted with RESUME_ON_START: each study is resumed by
    exactly one runner (of two workers, one claims it) and finishes with one charge per iteration."""
    _, release, partner = setup_release(services, max_queries=2 * ITERATIONS)
    with services.modeler_http() as http:
        ids = [start_run(http, services, release, partner, ITERATIONS) for _ in range(2)]
        wait_iterations(http, ids, 3)
    services.modeler.kill()
    services.new_modeler(POBO_MODELER_RESUME_ON_START="true")
    with services.modeler_http() as http:
        for study_id in ids:
            done = wait_status(http, study_id, {"done", "failed"})
            assert done["status"] == "done", done["error"]
            assert done["iterations_done"] == ITERATIONS
            assert http.get(f"/v1/studies/{study_id}/audit/verify").json()["ok"]
        # no runner left behind: a new run of a done study is refused, not started twice
        assert http.post(f"/v1/studies/{ids[0]}/run").status_code == 409
    with services.admin() as admin:
        queries = admin.list_queries(release.id).queries
    assert len(queries) == 2 * ITERATIONS  # one charge per iteration: no second runner raced the first
    assert services.modeler.log_tail(400).count("resumable") == 1  # recovery ran once, not once per worker
