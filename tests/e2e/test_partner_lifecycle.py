"""Partners that change, through real services (issue 34): a quota raise at the curator and a larger budget
at the modeler let a done study resume; a token rotated at the curator keeps a running study going after
``PATCH /v1/studies/{id}``, the old token revoked meanwhile; both studies reconcile with the curator's log."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import SQLITE_ONLY, Services, write_csv
from tests.e2e.test_strategies import reconciled
from tests.e2e.test_two_party import FIXED_HP, setup_release, study_body, wait_status

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # the partner API's flow; PATCH/tokens run on PG in unit tests


def curator_admin(services: Services) -> httpx.Client:
    return httpx.Client(
        base_url=services.curator.url, headers={"Authorization": f"Bearer {services.admin_token}"}, timeout=60
    )


def test_a_quota_raise_lets_a_done_study_resume(services: Services) -> None:
    _, release, partner = setup_release(services, max_queries=4)
    with services.modeler_http() as http, curator_admin(services) as curator:
        too_big = http.post("/v1/studies", json=study_body(services, release, partner, 5, FIXED_HP))
        assert too_big.status_code == 422 and "4 queries left" in too_big.json()["detail"]
        study = http.post("/v1/studies", json=study_body(services, release, partner, 4, FIXED_HP)).json()
        sid = study["id"]
        assert http.post(f"/v1/studies/{sid}/run").status_code == 202
        assert wait_status(http, sid, {"done", "failed"})["status"] == "done"
        refused = http.patch(f"/v1/studies/{sid}", json={"iterations": 7})
        assert refused.status_code == 422 and "0 queries left" in refused.json()["detail"]
        raised = curator.patch(f"/v1/partners/{partner.id}", json={"max_queries": 7})
        assert raised.status_code == 200 and raised.json()["max_queries"] == 7
        resumed = http.patch(f"/v1/studies/{sid}", json={"iterations": 7})
        assert resumed.status_code == 200 and resumed.json()["status"] == "ready"
        assert http.post(f"/v1/studies/{sid}/run").status_code == 202
        done = wait_status(http, sid, {"done", "failed"})
        assert (done["status"], done["iterations_done"]) == ("done", 7), done["error"]
    assert reconciled(services, sid)


def test_a_rotated_token_keeps_a_running_study_going(services: Services) -> None:
    csv = services.tmp / "lab.csv"
    write_csv(csv, n=80, d=3)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="lab", features=["x0", "x1", "x2"], objective_mode="manual")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        partner = admin.create_partner("lab modeler", release_ids=[release.id], max_queries=10)
    with services.modeler_http() as http, curator_admin(services) as curator:
        study = http.post("/v1/studies", json=study_body(services, release, partner, 3, FIXED_HP)).json()
        sid = study["id"]
        assert http.post(f"/v1/studies/{sid}/run").status_code == 202
        wait_status(http, sid, {"awaiting_measurement"})
        (old,) = curator.get(f"/v1/partners/{partner.id}/tokens").json()["data"]
        new = curator.post(f"/v1/partners/{partner.id}/tokens").json()
        patched = http.patch(f"/v1/studies/{sid}", json={"curator_token": new["token"]})
        assert patched.status_code == 200, patched.text
        assert curator.delete(f"/v1/partners/{partner.id}/tokens/{old['id']}").json()["revoked"] is True
        posted = 0
        deadline = time.monotonic() + 120
        while posted < 3:
            assert time.monotonic() < deadline, "the study stopped asking"
            for q in curator.get(f"/v1/releases/{release.id}/queries").json()["queries"]:
                if q["status"] == "pending":
                    assert curator.post(
                        f"/v1/queries/{q['id']}/result", json={"y": 0.1 * q["index"]}
                    ).is_success
                    posted += 1
            time.sleep(0.05)
        done = wait_status(http, sid, {"done", "failed"})
        assert (done["status"], done["iterations_done"], done["error"]) == ("done", 3, None)
    assert reconciled(services, sid)
