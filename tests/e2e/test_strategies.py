"""The strategies of the registry through real services: batch GP-UCB killed mid-run and resumed, random,
and a manual round of several samples measured in any order (the killed run with 2 workers per service)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from shared.tools.reconcile import reconcile
from tests.e2e.conftest import SQLITE_ONLY, Services, write_csv
from tests.e2e.test_restart import wait_iterations
from tests.e2e.test_two_party import FIXED_HP, setup_release, wait_status

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # see SQLITE_ONLY in conftest


def body(
    services: Services, release: Any, partner: Any, strategy: str, iterations: int, **params: Any
) -> Any:
    return {
        "curator_url": services.curator.url,
        "release_id": release.id,
        "curator_token": partner.token,
        "strategy": strategy,
        "iterations": iterations,
        "strategy_params": params,
    }


def reconciled(services: Services, study_id: str) -> bool:
    report = reconcile(
        curator_url=services.curator.url,
        curator_token=services.admin_token,
        modeler_url=services.modeler.url,
        modeler_token=services.modeler_token,
        study_id=study_id,
    )
    return report.ok


@pytest.mark.parametrize("workers", [2], ids=["2-workers"])  # the harder case (one process: the unit tests)
def test_gp_bucb_killed_mid_run_resumes_and_random_runs(services: Services) -> None:
    iterations = 24
    _, release, partner = setup_release(services, max_queries=iterations + 12)  # no slack for double charges
    with services.modeler_http() as http:
        batch = http.post(
            "/v1/studies",
            json=body(services, release, partner, "gp-bucb", iterations, batch_size=4, hyperparameters="mle"),
        ).json()
        assert http.post(f"/v1/studies/{batch['id']}/run").status_code == 202
        wait_iterations(http, [batch["id"]], 8)
    services.modeler.kill()  # SIGKILL, possibly with a round's intent written and some of it sent
    services.new_modeler()
    with services.modeler_http() as http:
        assert http.get(f"/v1/studies/{batch['id']}").json()["status"] == "ready"
        assert http.post(f"/v1/studies/{batch['id']}/run").status_code == 202
        done = wait_status(http, batch["id"], {"done", "failed"})
        assert (done["status"], done["iterations_done"], done["rounds_done"]) == ("done", iterations, 6), done
        audit = http.get(f"/v1/studies/{batch['id']}/audit").json()["entries"]
        assert [(e["round"], e["request"]) for e in audit] == [(k, j) for k in range(1, 7) for j in range(4)]
        assert len({e["index"] for e in audit}) == iterations
        assert http.get(f"/v1/studies/{batch['id']}/audit/verify").json()["ok"]

        rand = http.post("/v1/studies", json=body(services, release, partner, "random", 12)).json()
        assert http.post(f"/v1/studies/{rand['id']}/run").status_code == 202
        assert wait_status(http, rand["id"], {"done", "failed"})["status"] == "done"
        rows = [e["index"] for e in http.get(f"/v1/studies/{rand['id']}/audit").json()["entries"]]
        assert len(set(rows)) == 12
    with services.admin() as admin:
        assert len(admin.list_queries(release.id).queries) == iterations + 12  # nothing charged twice
    assert reconciled(services, batch["id"]) and reconciled(services, rand["id"])


def test_a_manual_batch_round_is_recorded_once_every_sample_is_measured(services: Services) -> None:
    csv = services.tmp / "lab.csv"
    write_csv(csv, n=120, d=3)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="lab", features=["x0", "x1", "x2"], objective_mode="manual")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        partner = admin.create_partner("lab", release_ids=[release.id], max_queries=6)
    with services.modeler_http() as http, services.admin() as admin:
        study = http.post(
            "/v1/studies",
            json=body(services, release, partner, "gp-bucb", 6, batch_size=3, hyperparameters=FIXED_HP),
        ).json()
        step = http.post(f"/v1/studies/{study['id']}/step").json()
        assert step["status"] == "pending" and len(step["queries"]) == 3
        for q in reversed(step["queries"]):  # the lab measures in its own order
            admin.post_result(q["curator_query_id"], [0.1, 0.2, 0.3][q["request"]])
        first = wait_status(http, study["id"], {"ready", "failed"})
        assert (first["status"], first["iterations_done"], first["rounds_done"]) == ("ready", 3, 1), first
        resumed = http.post(f"/v1/studies/{study['id']}/run")
        assert resumed.status_code == 202, resumed.text
        deadline = time.monotonic() + 60
        while (s := http.get(f"/v1/studies/{study['id']}").json())["status"] not in ("done", "failed"):
            for q in admin.list_queries(release.id).queries:
                if q.status == "pending":
                    admin.post_result(q.id, 0.5)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert s["status"] == "done" and s["rounds_done"] == 2, s
        audit = http.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
        assert [e["y"] for e in audit[:3]] == [0.1, 0.2, 0.3]
        assert http.get(f"/v1/studies/{study['id']}/audit/verify").json()["ok"]
    assert reconciled(services, study["id"])
