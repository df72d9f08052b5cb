"""DP-GIBO studies through the modeler API against the fake curator's gradient oracle (exact gradient of
|theta - theta_star|^2 / 2): creation checks, a run to done, the audit entries, a crash and a restart."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from modeler_service import rounds
from modeler_service.config import Settings
from shared.protocol.keys import request_key
from tests.modeler_service.conftest import AUTH, make_app
from tests.modeler_service.fake_curator import PARTNER_TOKEN, FakeCurator
from tests.modeler_service.test_studies import wait_for


def gibo_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "curator_url": "http://curator.test",
        "gradient_oracle_id": 1,
        "curator_token": PARTNER_TOKEN,
        "strategy": "dp-gibo",
        "iterations": 8,
        "strategy_params": {"batch_size": 2},
        "seed": 3,
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def create(client: TestClient, **overrides: Any) -> dict[str, Any]:
    resp = client.post("/v1/studies", json=gibo_body(**overrides))
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_create_stores_the_oracle_and_starts_at_the_centre(client: TestClient, curator: FakeCurator) -> None:
    study = create(client)
    assert study["release_id"] is None and study["release"] is None
    assert study["gradient_oracle_id"] == 1 and study["strategy"] == "dp-gibo"
    oracle = study["gradient_oracle"]
    assert oracle["bounds"] == curator.oracle_bounds and oracle["steps"] == 30 and oracle["dimension"] == 2
    assert (study["n"], study["r"]) == (curator.n, 2)
    assert study["best"] == {"index": None, "y": None, "theta": [0.0, 0.0]}
    assert curator.gradient_steps == [] and PARTNER_TOKEN not in json.dumps(study)


@pytest.mark.parametrize(
    ("overrides", "status", "words"),
    [
        ({"release_id": 1}, 422, ["dp-gibo", "gradient_oracle_id instead of release_id"]),
        ({"gradient_oracle_id": None}, 422, ["give gradient_oracle_id"]),
        ({"strategy": "gp-ucb", "strategy_params": {}}, 422, ["release_id instead of gradient_oracle_id"]),
        (
            {"strategy": "gp-ucb", "strategy_params": {}, "gradient_oracle_id": None},
            422,
            ["give release_id"],
        ),
        ({"iterations": 31}, 422, ["30 steps gradient oracle 1 has left", "at most 30"]),
        ({"gradient_oracle_id": 9}, 404, ["gradient oracle 9 not found"]),
        ({"strategy_params": {"theta0": [0.0, 9.0]}}, 422, ["theta0[1]", "outside the oracle's bounds"]),
        ({"strategy_params": {"theta0": [0.0]}}, 422, ["theta0 has 1 entries", "dimension is 2"]),
        ({"strategy_params": {"batch_size": 2, "tolerance": 0.1}}, 422, ["not both"]),
        ({"strategy_params": {"learning_rate": 0.1}}, 422, ["learning_rate", "accepts"]),
        ({"delta_prime": 0.1}, 422, ["delta_prime"]),
    ],
)
def test_create_is_refused_with_an_actionable_message(
    client: TestClient, overrides: dict[str, Any], status: int, words: list[str]
) -> None:
    resp = client.post("/v1/studies", json=gibo_body(**overrides))
    assert resp.status_code == status, resp.text
    detail = str(resp.json()["detail"])
    assert all(w in detail for w in words), detail
    assert client.get("/v1/studies").json()["count"] == 0


def test_both_ids_is_a_422(client: TestClient) -> None:
    both = {**gibo_body(), "release_id": 1}
    resp = client.post("/v1/studies", json=both)
    assert resp.status_code == 422 and "instead of release_id" in str(resp.json()["detail"])
    neither = {k: v for k, v in gibo_body().items() if k != "gradient_oracle_id"}
    assert client.post("/v1/studies", json=neither).status_code == 422


def test_an_oracle_not_granted_is_a_404(client: TestClient, curator: FakeCurator) -> None:
    curator.oracle_granted = False
    resp = client.post("/v1/studies", json=gibo_body())
    assert resp.status_code == 404 and "gradient oracle 1" in resp.json()["detail"]


def test_steps_left_are_checked_against_the_oracle(client: TestClient, curator: FakeCurator) -> None:
    create(client, iterations=20)
    s = client.get("/v1/studies").json()["data"][0]
    client.post(f"/v1/studies/{s['id']}/run", json={"iterations": 3})
    wait_for(client, s["id"], {"ready", "failed"})
    resp = client.post("/v1/studies", json=gibo_body(iterations=28))  # 27 steps left now
    assert resp.status_code == 422 and "27 steps" in resp.json()["detail"]


def test_run_to_done_moves_theta_to_the_minimiser(client: TestClient, curator: FakeCurator) -> None:
    study = create(client, iterations=12, strategy_params={})  # default: b = d + 1 = 3, AdaGrad
    assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
    done = wait_for(client, study["id"], {"done", "failed"})
    assert done["status"] == "done", done["error"]
    assert (done["iterations_done"], done["rounds_done"]) == (12, 12)
    assert len(curator.gradient_steps) == 12  # one curator step per round
    theta = np.array(done["best"]["theta"])
    star = np.array(curator.theta_star)
    assert np.linalg.norm(theta - star) < 0.2 * np.linalg.norm(star)  # from the centre (0, 0) toward star
    assert done["best"]["index"] is None and done["best"]["y"] is None

    entries = client.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
    assert [e["kind"] for e in entries] == ["gradient"] * 12
    assert [e["curator_query_id"] for e in entries] == list(range(1, 13))
    assert all(e["index"] is None and e["y"] is None for e in entries)
    first, last = entries[0]["details"], entries[-1]["details"]
    assert first["theta"] == [0.0, 0.0] and len(first["points"]) == 3 == first["b"]
    assert first["kernel"]["kind"] == "se" and first["kernel"]["lengthscale"] == pytest.approx(0.2 * 200**0.5)
    assert first["gradient"] == [-1.5, 2.0] and first["step"] == 1
    for a, b in zip(entries, entries[1:], strict=False):
        assert b["details"]["theta"] == a["details"]["theta_next"]
    assert last["theta_next"] == done["best"]["theta"]
    # the curator received exactly the bodies the audit log records, with the round's key
    for e, made in zip(entries, curator.gradient_steps, strict=True):
        assert made["key"] == request_key(study["id"], e["round"], 0)
        assert made["body"] == {
            k: e["details"][k] for k in ("theta", "points", "kernel", "noise_var", "jitter")
        }
    assert client.get(f"/v1/studies/{study['id']}/audit/verify").json()["ok"] is True
    csv = client.get(f"/v1/studies/{study['id']}/audit", params={"format": "csv"}).text
    assert csv.count("\n") == 13 and ",gradient,," in csv
    png = client.get(f"/v1/studies/{study['id']}/plot.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")


def test_step_returns_the_gradient(client: TestClient, curator: FakeCurator) -> None:
    study = create(client, iterations=2)
    step = client.post(f"/v1/studies/{study['id']}/step").json()
    assert step["round"] == 1 and step["iteration"] == 1 and step["status"] == "complete"
    assert step["index"] is None and step["y"] is None and step["curator_query_id"] == 1
    (q,) = step["queries"]
    assert q["kind"] == "gradient" and q["details"]["gradient"] == [-1.5, 2.0]
    assert q["details"]["b"] == 2 and q["details"]["alpha"] >= 0
    after = client.get(f"/v1/studies/{study['id']}").json()
    assert after["best"]["theta"] != [0.0, 0.0] and after["status"] == "ready"


def test_crash_after_the_step_then_restart_resumes_without_a_second_step(
    settings: Settings, curator: FakeCurator, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(settings, curator)
    with TestClient(app, headers=AUTH, raise_server_exceptions=False) as c:
        study = create(c, iterations=5)
        sid = study["id"]
        for _ in range(2):
            assert c.post(f"/v1/studies/{sid}/step").status_code == 200
        original = rounds.record_round

        def crash(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("simulated crash after the curator answered")

        monkeypatch.setattr(rounds, "record_round", crash)
        assert c.post(f"/v1/studies/{sid}/step").status_code == 500
        monkeypatch.setattr(rounds, "record_round", original)
        s = c.get(f"/v1/studies/{sid}").json()
        assert s["iterations_done"] == 2 and s["pending_round"]["round"] == 3
        assert s["pending_round"]["queries"][0]["kind"] == "gradient"
    assert len(curator.gradient_steps) == 3  # the curator answered round 3; the modeler did not record it
    # the process dies with the study left running: a new process (empty caches) resumes it
    engine = create_engine(settings.resolved_database_url())
    with engine.begin() as conn:
        conn.execute(text("UPDATE modeler_studies SET status='running' WHERE id=:id"), {"id": sid})
    engine.dispose()
    app2 = make_app(settings, curator)
    with TestClient(app2, headers=AUTH) as c:
        assert c.get(f"/v1/studies/{sid}").json()["status"] == "ready"
        assert c.post(f"/v1/studies/{sid}/run").status_code == 202
        s = wait_for(c, sid, {"done", "failed"})
        assert s["status"] == "done" and s["iterations_done"] == 5, s["error"]
        entries = c.get(f"/v1/studies/{sid}/audit").json()["entries"]
        assert c.get(f"/v1/studies/{sid}/audit/verify").json()["ok"] is True
    assert len(curator.gradient_steps) == 5  # one step per round: round 3 was re-sent, not re-made
    keys = [r.headers["idempotency-key"] for r in curator.step_posts()]
    assert keys.count(request_key(sid, 3, 0)) == 2 and len(set(keys)) == 5
    assert [e["curator_query_id"] for e in entries] == [1, 2, 3, 4, 5]
    for a, b in zip(entries, entries[1:], strict=False):  # the path continues through the restart
        assert b["details"]["theta"] == a["details"]["theta_next"]


def test_a_lost_answer_is_fetched_again_with_the_same_key(client: TestClient, curator: FakeCurator) -> None:
    study = create(client, iterations=3)
    curator.lose_answers = 1  # the step is made, the answer never arrives: the client retries the key
    step = client.post(f"/v1/studies/{study['id']}/step")
    assert step.status_code == 200, step.text
    assert len(curator.gradient_steps) == 1 and len(curator.step_posts()) == 2


def test_the_same_seed_plans_the_same_batches(client: TestClient, curator: FakeCurator) -> None:
    a, b = create(client, iterations=3, seed=5), create(client, iterations=3, seed=5)
    for s in (a, b):
        client.post(f"/v1/studies/{s['id']}/run")
        wait_for(client, s["id"], {"done"})
    pa = [e["details"]["points"] for e in client.get(f"/v1/studies/{a['id']}/audit").json()["entries"]]
    pb = [e["details"]["points"] for e in client.get(f"/v1/studies/{b['id']}/audit").json()["entries"]]
    assert pa == pb
