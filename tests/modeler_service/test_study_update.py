"""A study's grant changes (issue 34): creation checks the budget against the partner's quota left;
``PATCH /v1/studies/{id}`` raises the budget within the grant (a done study resumes) and takes a rotated
partner token, which a running study uses from its next request on."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from tests.modeler_service.fake_curator import PARTNER_TOKEN, FakeCurator
from tests.modeler_service.test_studies import create, wait_for


def test_creation_checks_the_budget_against_the_quota_left(client: TestClient, curator: FakeCurator) -> None:
    curator.max_queries = 5
    create(client, iterations=2)  # made no query yet: 5 left
    resp = client.post(
        "/v1/studies",
        json={
            "curator_url": "http://curator.test",
            "release_id": 1,
            "curator_token": PARTNER_TOKEN,
            "iterations": 6,
            "seed": 1,
        },
    )
    assert resp.status_code == 422
    assert resp.json()["detail"] == (
        "iterations must be <= the 5 queries left of this partner token's quota (max_queries 5, 0 used), "
        "got 6: ask for at most 5 iterations, or ask the curator to raise max_queries (PATCH /v1/partners/1)"
    )


def test_a_raised_budget_within_the_quota_resumes_a_done_study(
    client: TestClient, curator: FakeCurator
) -> None:
    curator.max_queries = 5
    study = create(client, iterations=4)
    sid = study["id"]
    assert client.post(f"/v1/studies/{sid}/run").status_code == 202
    assert wait_for(client, sid, {"done", "failed"})["status"] == "done"
    assert client.patch(f"/v1/studies/{sid}", json={}).status_code == 422
    lower = client.patch(f"/v1/studies/{sid}", json={"iterations": 3})
    assert lower.status_code == 422
    assert lower.json()["detail"] == "iterations must be at least the 4 queries the study has made, got 3"
    beyond = client.patch(f"/v1/studies/{sid}", json={"iterations": 6})
    assert beyond.status_code == 422
    assert beyond.json()["detail"] == (
        "iterations 6 would need 2 more queries, but the curator's grant has 1 queries left of this partner "
        "token's quota (max_queries 5, 4 used): ask for at most 5 iterations, or ask the curator for more"
    )
    curator.max_queries = 10  # the curator raised the partner's quota (PATCH /v1/partners/{id})
    raised = client.patch(f"/v1/studies/{sid}", json={"iterations": 6})
    assert raised.status_code == 200, raised.text
    assert (raised.json()["status"], raised.json()["iterations_total"]) == ("ready", 6)
    assert client.post(f"/v1/studies/{sid}/run").status_code == 202
    done = wait_for(client, sid, {"done", "failed"})
    assert (done["status"], done["iterations_done"]) == ("done", 6) and curator.charged() == 6
    assert client.get(f"/v1/studies/{sid}/audit/verify").json()["ok"] is True
    assert client.patch("/v1/studies/nope", json={"iterations": 9}).status_code == 404


def test_a_running_study_keeps_going_on_a_rotated_token(client: TestClient, curator: FakeCurator) -> None:
    curator.manual = True
    study = create(client, iterations=3, initial_points=1)
    sid = study["id"]
    assert client.post(f"/v1/studies/{sid}/run").status_code == 202
    wait_for(client, sid, {"awaiting_measurement"})
    busy = client.patch(f"/v1/studies/{sid}", json={"iterations": 5})
    assert busy.status_code == 409 and "changes only while no run owns it" in busy.json()["detail"]
    wrong = client.patch(f"/v1/studies/{sid}", json={"curator_token": "pobo_p_not-a-token"})
    assert wrong.status_code == 422 and "refused the study's partner token" in wrong.json()["detail"]
    new_token = "pobo_p_rotated-0123456789"
    curator.partner_tokens.append(new_token)  # the curator issued a second token to the partner
    rotated = client.patch(f"/v1/studies/{sid}", json={"curator_token": new_token})
    assert rotated.status_code == 200, rotated.text
    assert "curator_token" not in rotated.text and new_token not in rotated.text
    curator.partner_tokens.remove(PARTNER_TOKEN)  # the old token is revoked
    asked_before = len(curator.requests)
    for _ in range(3):  # the lab measures each pending row
        deadline = time.monotonic() + 10
        while not curator.pending():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        curator.post_result(curator.pending()[0]["id"], 0.5)
    done = wait_for(client, sid, {"done", "failed"})
    assert (done["status"], done["iterations_done"], done["error"]) == ("done", 3, None)
    later = curator.requests[asked_before:]
    creating = [r for r in later if r.method == "POST" and r.url.path.endswith("/queries")]
    assert creating and all(r.headers["authorization"] == f"Bearer {new_token}" for r in creating)
