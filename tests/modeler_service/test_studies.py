"""Modeler API (ASGI, in-process) against a fake curator: studies, step, run, manual outcomes, restarts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from modeler_service import rounds
from modeler_service.config import Settings
from shared.protocol.keys import request_key
from tests.modeler_service.conftest import AUTH, make_app, study_body
from tests.modeler_service.fake_curator import PARTNER_TOKEN, FakeCurator


def create(client: TestClient, **overrides: Any) -> dict[str, Any]:
    resp = client.post("/v1/studies", json=study_body(**overrides))
    assert resp.status_code == 201, resp.text
    return resp.json()


def wait_for(client: TestClient, study_id: str, statuses: set[str], timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        study = client.get(f"/v1/studies/{study_id}").json()
        if study["status"] in statuses:
            return study
        time.sleep(0.02)
    raise AssertionError(f"study stayed {study['status']}, wanted {statuses}")


def test_healthz_is_open(client: TestClient) -> None:
    resp = client.get("/healthz", headers={"Authorization": ""})
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "database": "ok", "service": "modeler"}


def test_token_required(client: TestClient) -> None:
    resp = client.get("/v1/studies", headers={"Authorization": ""})
    assert resp.status_code == 401
    assert "missing bearer token" in resp.json()["detail"]
    resp = client.get("/v1/studies", headers={"Authorization": "Bearer wrong"})
    assert resp.status_code == 401
    assert resp.json()["detail"] == "invalid token"


def test_create_study_stores_verified_z_and_hides_the_token(
    client: TestClient, curator: FakeCurator, settings: Settings
) -> None:
    resp = client.post("/v1/studies", json=study_body())
    assert resp.status_code == 201
    study = resp.json()
    assert PARTNER_TOKEN not in resp.text and "seed" not in study
    assert study["status"] == "ready"
    assert (study["n"], study["r"], study["release_id"]) == (curator.n, curator.r, 1)
    assert study["iterations_total"] == 8 and study["iterations_done"] == 0 and study["best"] is None
    assert study["release"]["sha256"] == curator.sha256
    stored = list((settings.data_dir / "releases").glob("*.npy"))
    assert len(stored) == 1
    np.testing.assert_array_equal(np.load(stored[0]), curator.Z)
    assert not list((settings.data_dir / "releases").glob(".*part"))  # no temp file left behind
    # the token is encrypted at rest
    engine = create_engine(settings.resolved_database_url())
    with engine.connect() as conn:
        enc = conn.execute(text("SELECT curator_token_enc FROM modeler_studies")).scalar_one()
    engine.dispose()
    assert PARTNER_TOKEN not in enc
    listed = client.get("/v1/studies").json()
    assert listed["count"] == 1 and listed["data"][0]["id"] == study["id"]
    assert PARTNER_TOKEN not in client.get(f"/v1/studies/{study['id']}").text


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"iterations": 0}, "iterations"),
        ({"delta_prime": 1.0}, "delta_prime"),
        ({"delta_prime": 0}, "delta_prime"),
        ({"initial_points": 0}, "initial_points"),
        ({"strategy": "random"}, "strategy"),
        ({"hyperparameters": {"lengthscale": -1, "signal_variance": 1, "noise_variance": 1}}, "lengthscale"),
        ({"curator_url": "ftp://x.y/z"}, "curator_url"),
        ({"release_id": 0}, "release_id"),
    ],
)
def test_create_study_validation(client: TestClient, overrides: dict[str, Any], field: str) -> None:
    resp = client.post("/v1/studies", json=study_body(**overrides))
    assert resp.status_code == 422
    assert field in resp.text
    assert PARTNER_TOKEN not in resp.text  # validation errors never echo the payload


def test_create_study_curator_errors(client: TestClient, curator: FakeCurator) -> None:
    resp = client.post("/v1/studies", json=study_body(curator_token="not-a-token"))
    assert resp.status_code == 422
    assert "refused the study's partner token" in resp.json()["detail"]
    resp = client.post("/v1/studies", json=study_body(release_id=9))
    assert resp.status_code == 404
    assert "release 9 not found" in resp.json()["detail"]
    curator.corrupt_rows = True
    resp = client.post("/v1/studies", json=study_body())
    assert resp.status_code == 502
    assert "sha256" in resp.json()["detail"]
    resp = client.post("/v1/studies", json=study_body(initial_points=10_000))
    assert resp.status_code in (422, 502)


def test_step_records_an_observation(client: TestClient, curator: FakeCurator) -> None:
    study = create(client)
    resp = client.post(f"/v1/studies/{study['id']}/step")
    assert resp.status_code == 200, resp.text
    step = resp.json()
    assert step["iteration"] == 1 and step["status"] == "complete" and step["source"] == "initial"
    assert step["y"] == pytest.approx(curator.f[step["index"]])
    for key in ("acquisition", "beta", "mean", "std"):
        assert np.isfinite(step[key])
    assert curator.queries[0]["idempotency_key"] == f"{study['id']}:1"
    after = client.get(f"/v1/studies/{study['id']}").json()
    assert after["status"] == "ready" and after["iterations_done"] == 1
    assert after["best"] == {"index": step["index"], "y": step["y"], "noisy": False}  # a raw grant


def test_run_to_completion_beats_random_and_never_repeats(client: TestClient, curator: FakeCurator) -> None:
    study = create(client, iterations=25, hyperparameters="mle", initial_points=2)
    resp = client.post(f"/v1/studies/{study['id']}/run")
    assert resp.status_code == 202, resp.text
    assert resp.json()["run_target"] == 25
    done = wait_for(client, study["id"], {"done", "failed"})
    assert done["status"] == "done", done["error"]
    assert done["iterations_done"] == 25 and done["run_target"] is None
    indices = [q["index"] for q in curator.queries]
    assert len(indices) == 25 == len(set(indices))  # exclude_queried by default
    assert done["best"]["y"] == pytest.approx(max(curator.f[indices]))
    assert done["best"]["y"] > np.quantile(curator.f, 0.97)
    # a done study has no budget left
    resp = client.post(f"/v1/studies/{study['id']}/run")
    assert resp.status_code == 409 and "done" in resp.json()["detail"]
    resp = client.post(f"/v1/studies/{study['id']}/step")
    assert resp.status_code == 409


def test_run_partial_then_the_rest(client: TestClient, curator: FakeCurator) -> None:
    study = create(client, iterations=6)
    resp = client.post(f"/v1/studies/{study['id']}/run", json={"iterations": 7})
    assert resp.status_code == 422 and "6 iterations left" in resp.json()["detail"]
    resp = client.post(f"/v1/studies/{study['id']}/run", json={"iterations": 2})
    assert resp.status_code == 202
    s = wait_for(client, study["id"], {"ready", "failed"})
    assert s["iterations_done"] == 2 and s["status"] == "ready"
    assert client.post(f"/v1/studies/{study['id']}/run", json={}).status_code == 202
    assert wait_for(client, study["id"], {"done", "failed"})["iterations_done"] == 6


def test_second_run_is_409_and_manual_outcomes_resume(client: TestClient, curator: FakeCurator) -> None:
    curator.manual = True
    study = create(client, iterations=3, initial_points=1)
    sid = study["id"]
    assert client.post(f"/v1/studies/{sid}/run").status_code == 202
    s = wait_for(client, sid, {"awaiting_measurement"})
    assert s["pending"]["iteration"] == 1 and s["pending"]["curator_query_id"] == 1
    resp = client.post(f"/v1/studies/{sid}/run")
    assert resp.status_code == 409 and "already" in resp.json()["detail"]
    assert client.post(f"/v1/studies/{sid}/step").status_code == 409
    for expected in range(1, 4):  # the curator's operator measures each pending row
        deadline = time.monotonic() + 10
        while not curator.pending():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        q = curator.pending()[0]
        assert q["id"] == expected
        curator.post_result(q["id"], 0.1 * expected)
    s = wait_for(client, sid, {"done", "failed"})
    assert s["status"] == "done" and s["iterations_done"] == 3
    assert [e["y"] for e in client.get(f"/v1/studies/{sid}/audit").json()["entries"]] == [
        0.1,
        0.2,
        0.30000000000000004,
    ]


def test_manual_step_returns_pending_and_completes_by_itself(
    client: TestClient, curator: FakeCurator
) -> None:
    curator.manual = True
    study = create(client, iterations=2)
    step = client.post(f"/v1/studies/{study['id']}/step").json()
    assert step["status"] == "pending" and step["y"] is None
    assert client.get(f"/v1/studies/{study['id']}").json()["status"] == "awaiting_measurement"
    curator.post_result(step["curator_query_id"], 1.5)
    s = wait_for(client, study["id"], {"ready"})
    assert s["iterations_done"] == 1 and s["best"] == {"index": step["index"], "y": 1.5, "noisy": False}


def test_crash_between_answer_and_commit_does_not_charge_twice(
    app: Any, curator: FakeCurator, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = TestClient(app, headers=AUTH, raise_server_exceptions=False)
    study = create(client)
    original = rounds.record_round
    calls = {"n": 0}

    def crash_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated crash after the curator answered")
        return original(*args, **kwargs)

    monkeypatch.setattr(rounds, "record_round", crash_once)
    resp = client.post(f"/v1/studies/{study['id']}/step")
    assert resp.status_code == 500 and resp.json() == {"detail": "internal server error; see the modeler log"}
    s = client.get(f"/v1/studies/{study['id']}").json()
    assert s["status"] == "ready" and s["iterations_done"] == 0 and s["pending"]["iteration"] == 1
    step = client.post(f"/v1/studies/{study['id']}/step").json()
    assert step["iteration"] == 1 and step["curator_query_id"] == 1
    assert curator.charged() == 1  # the retry re-sent the same Idempotency-Key


def test_curator_5xx_is_retried_and_quota_is_429(client: TestClient, curator: FakeCurator) -> None:
    study = create(client)
    curator.fail_next = [503, 502]
    step = client.post(f"/v1/studies/{study['id']}/step")
    assert step.status_code == 200
    keys = {r.headers.get("idempotency-key") for r in curator.requests if r.url.path.endswith("/queries")}
    assert keys == {f"{study['id']}:1"}
    assert curator.charged() == 1
    curator.max_queries = 1
    resp = client.post(f"/v1/studies/{study['id']}/step")
    assert resp.status_code == 429 and "quota" in resp.json()["detail"]
    assert client.get(f"/v1/studies/{study['id']}").json()["status"] == "ready"


def test_run_failure_is_reported_and_retryable(client: TestClient, curator: FakeCurator) -> None:
    study = create(client, iterations=4)
    curator.max_queries = 2
    client.post(f"/v1/studies/{study['id']}/run")
    s = wait_for(client, study["id"], {"failed"})
    assert "quota" in s["error"] and s["iterations_done"] == 2
    curator.max_queries = 10
    assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
    s = wait_for(client, study["id"], {"done"})
    assert s["iterations_done"] == 4 and s["error"] is None
    assert curator.charged() == 4


def test_seed_reproduces_the_initial_rows(client: TestClient, curator: FakeCurator) -> None:
    a, b = (
        create(client, seed=11, iterations=3, initial_points=3),
        create(client, seed=11, iterations=3, initial_points=3),
    )
    for s in (a, b):
        client.post(f"/v1/studies/{s['id']}/run")
        wait_for(client, s["id"], {"done"})
    ia = [e["index"] for e in client.get(f"/v1/studies/{a['id']}/audit").json()["entries"]]
    ib = [e["index"] for e in client.get(f"/v1/studies/{b['id']}/audit").json()["entries"]]
    assert ia == ib
    assert {str(11)} & {q["idempotency_key"] for q in curator.queries} == set()


def test_restart_rebuilds_from_the_database(tmp_path: Path, settings: Settings, curator: FakeCurator) -> None:
    """A process that dies mid-iteration (intent written, status running) is resumed by a new process."""
    app = make_app(settings, curator)
    with TestClient(app, headers=AUTH) as c:
        study = create(c, iterations=6, hyperparameters="mle")
        for _ in range(3):
            assert c.post(f"/v1/studies/{study['id']}/step").status_code == 200
        expected_next = c.post(f"/v1/studies/{study['id']}/step").json()
    # simulate a kill: the 4th iteration was answered by the curator but not recorded, status left running
    engine = create_engine(settings.resolved_database_url())
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM modeler_audit_entries WHERE seq = 4"))
        conn.execute(
            text(
                "UPDATE modeler_studies SET status='running', iterations_done=3, rounds_done=3, "
                "pending_round=:p, audit_head=(SELECT hash FROM modeler_audit_entries "
                "WHERE seq=3 AND study_id=:id) WHERE id=:id"
            ),
            {
                "p": json.dumps(
                    {
                        "round": 4,
                        "requests": [
                            {
                                "request": 0,
                                "kind": "row",
                                "index": expected_next["index"],
                                "details": {"source": "gp-ucb", "acquisition": 1.0},
                                "key": request_key(study["id"], 4, 0),
                                "query_id": None,
                            }
                        ],
                    }
                ),
                "id": study["id"],
            },
        )
    engine.dispose()
    app2 = make_app(settings, curator)  # a fresh process: empty caches
    with TestClient(app2, headers=AUTH) as c:
        s = c.get(f"/v1/studies/{study['id']}").json()
        assert s["status"] == "ready" and s["pending"]["iteration"] == 4
        assert c.post(f"/v1/studies/{study['id']}/run").status_code == 202
        s = wait_for(c, study["id"], {"done", "failed"})
        assert s["status"] == "done" and s["iterations_done"] == 6
        entries = c.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
        assert entries[3]["curator_query_id"] == expected_next["curator_query_id"]
        assert c.get(f"/v1/studies/{study['id']}/audit/verify").json() == {
            "ok": True,
            "entries": 6,
            "first_bad_seq": None,
            "supersessions": 0,
            "first_bad_supersession_seq": None,
        }
    assert curator.charged() == 6
    assert [q["id"] for q in curator.queries] == [e["curator_query_id"] for e in entries]


def test_resume_on_start(settings: Settings, curator: FakeCurator) -> None:
    app = make_app(settings, curator)
    with TestClient(app, headers=AUTH) as c:
        study = create(c, iterations=5)
    engine = create_engine(settings.resolved_database_url())
    with engine.begin() as conn:
        conn.execute(text("UPDATE modeler_studies SET status='running', run_target=5"))
    engine.dispose()
    app2 = make_app(settings.model_copy(update={"resume_on_start": True}), curator)
    with TestClient(app2, headers=AUTH) as c:
        s = wait_for(c, study["id"], {"done", "failed"})
        assert s["status"] == "done" and s["iterations_done"] == 5


def test_plot_png(client: TestClient) -> None:
    study = create(client, iterations=3)
    client.post(f"/v1/studies/{study['id']}/run")
    wait_for(client, study["id"], {"done"})
    resp = client.get(f"/v1/studies/{study['id']}/plot.png")
    assert resp.status_code == 200 and resp.headers["content-type"] == "image/png"
    assert resp.content.startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_is_rendered_once_per_state_of_the_study(client: TestClient, monkeypatch) -> None:
    """A repeat request is served the rendered bytes; a recorded round (a new audit head) renders anew."""
    from modeler_service import results

    renders: list[str] = []
    render = results._render
    monkeypatch.setattr(
        results, "_render", lambda session, study: renders.append(study.id) or render(session, study)
    )
    study = create(client, iterations=3)
    url = f"/v1/studies/{study['id']}/plot.png"
    empty = client.get(url).content
    assert client.get(url).content == empty and len(renders) == 1
    assert client.post(f"/v1/studies/{study['id']}/step").status_code == 200
    one = client.get(url).content
    assert one != empty and len(renders) == 2
    assert client.get(url).content == one and len(renders) == 2


def test_unknown_study_is_404(client: TestClient) -> None:
    for method, path in [
        ("GET", "/v1/studies/nope"),
        ("POST", "/v1/studies/nope/step"),
        ("POST", "/v1/studies/nope/run"),
        ("GET", "/v1/studies/nope/audit"),
        ("GET", "/v1/studies/nope/audit/verify"),
        ("GET", "/v1/studies/nope/plot.png"),
    ]:
        resp = client.request(method, path)
        assert resp.status_code == 404, (method, path)
        assert resp.json() == {"detail": "study nope not found"}


def test_openapi_has_tags_and_examples(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert {t["name"] for t in spec["tags"]} >= {"studies", "operations"}
    assert spec["components"]["schemas"]["StudyCreate"]["examples"]
