"""Manual outcomes (the real pilot case) through real processes, as one process per service on SQLite and with
2 workers per service on PostgreSQL: the modeler's runner long-polls the curator for each pending query while
an operator posts the measured values; whichever workers take these requests, the study proceeds and both logs
reconcile."""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import DEPLOYMENTS, Services, write_csv
from tests.e2e.test_two_party import FIXED_HP, study_body, wait_status

pytestmark = pytest.mark.slow
ITERATIONS = 5


@pytest.fixture(params=[1, 2], ids=["1-process", "2-workers"])
def workers(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@DEPLOYMENTS
def test_manual_measurements_drive_a_run(services: Services) -> None:
    csv = services.tmp / "data.csv"
    outcomes = write_csv(csv)  # the "lab" knows these; the curator's dataset does not
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="ward", features="x0,x1,x2,x3", objective_mode="manual")
        assert dataset.objective_mode == "manual"
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        partner = admin.create_partner("lab", release_ids=[release.id], max_queries=ITERATIONS)
    with services.modeler_http() as http:
        body = study_body(services, release, partner, ITERATIONS, FIXED_HP)
        study_id = http.post("/v1/studies", json=body).json()["id"]
        assert http.post(f"/v1/studies/{study_id}/run").status_code == 202
        posted: dict[int, float] = {}
        deadline = time.monotonic() + 90
        with services.admin() as admin:
            while len(posted) < ITERATIONS:  # the operator: measure every pending query, one at a time
                assert time.monotonic() < deadline, f"only {len(posted)} measurements were asked for"
                pending = [q for q in admin.list_queries(release.id).queries if q.status == "pending"]
                assert len(pending) <= 1  # the runner waits for each measurement before the next row
                for q in pending:
                    posted[q.id] = float(outcomes[q.index])
                    admin.post_result(q.id, posted[q.id])
                time.sleep(0.05)
        done = wait_status(http, study_id, {"done", "failed"})
        assert done["status"] == "done", done["error"]
        audit = http.get(f"/v1/studies/{study_id}/audit").json()["entries"]
        assert http.get(f"/v1/studies/{study_id}/audit/verify").json()["ok"]
    assert {e["curator_query_id"]: e["y"] for e in audit} == posted
    with services.admin() as admin:
        assert admin.verify_queries(release.id).ok
        assert admin.get_partner(partner.id).queries_used == ITERATIONS
