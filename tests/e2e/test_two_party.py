"""End to end: the curator and the modeler as real uvicorn processes talking HTTP on loopback.

A 20-iteration study; then the modeler's audit log and the curator's query log must reconcile entry by
entry (same query ids, same indices, same y). Runs on SQLite, and on PostgreSQL with POBO_TEST_DATABASE_URL.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Services, write_csv

pytestmark = pytest.mark.slow


def setup_release(services: Services, max_queries: int = 100) -> tuple[Any, Any, Any]:
    csv = services.tmp / "data.csv"
    outcomes = write_csv(csv)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="e2e", objective="objective")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        partner = admin.create_partner("e2e modeler", release_ids=[release.id], max_queries=max_queries)
    return outcomes, release, partner


#: Fixed GP hyper-parameters (no MLE refits): quick studies.
FIXED_HP = {"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 1e-4}


def study_body(
    services: Services,
    release: Any,
    partner: Any,
    iterations: int,
    hyperparameters: Any = "mle",
    **extra: Any,
) -> dict[str, Any]:
    """The JSON of ``POST /v1/studies`` for a study over ``release`` with ``partner``'s token."""
    return {
        "curator_url": services.curator.url,
        "release_id": release.id,
        "curator_token": partner.token,
        "iterations": iterations,
        "hyperparameters": hyperparameters,
        **extra,
    }


def wait_status(
    http: httpx.Client, study_id: str, statuses: set[str], timeout: float = 60.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        study = http.get(f"/v1/studies/{study_id}").json()
        if study["status"] in statuses:
            return study
        assert time.monotonic() < deadline, f"study stuck in {study['status']}"
        time.sleep(0.05)


def test_twenty_iterations_reconcile(services: Services) -> None:
    outcomes, release, partner = setup_release(services)
    with services.modeler_http() as http:
        resp = http.post("/v1/studies", json=study_body(services, release, partner, 20, initial_points=2))
        assert resp.status_code == 201, resp.text
        assert partner.token not in resp.text
        study = resp.json()
        assert (study["n"], study["r"]) == (400, 4)
        step = http.post(f"/v1/studies/{study['id']}/step").json()  # one synchronous step ...
        assert step["iteration"] == 1 and step["status"] == "complete"
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202  # ... then the rest
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 409
        done = wait_status(http, study["id"], {"done", "failed"})
        assert done["status"] == "done", done["error"]
        assert done["iterations_done"] == 20
        audit = http.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
        verify = http.get(f"/v1/studies/{study['id']}/audit/verify").json()
        plot = http.get(f"/v1/studies/{study['id']}/plot.png")
    assert verify == {
        "ok": True,
        "entries": 20,
        "first_bad_seq": None,
        "supersessions": 0,
        "first_bad_supersession_seq": None,
    }
    assert plot.status_code == 200 and plot.content[:4] == b"\x89PNG"

    with services.admin() as admin:
        curator_log = admin.list_queries(release.id).queries
    assert len(curator_log) == len(audit) == 20
    for q, e in zip(curator_log, audit, strict=True):
        assert (q.id, q.index, q.y, q.status) == (e["curator_query_id"], e["index"], e["y"], "complete")
        assert q.idempotency_key in (None, f"{study['id']}:{e['iteration']}")
    assert len({e["index"] for e in audit}) == 20  # no row queried twice
    assert [e["y"] for e in audit] == [pytest.approx(outcomes[e["index"]]) for e in audit]
    assert done["best"]["y"] == max(e["y"] for e in audit)
