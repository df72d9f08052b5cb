"""Strategies by name and rounds of several requests, through the modeler API (fake curator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from modeler_service.config import Settings
from shared.protocol.keys import request_key
from tests.modeler_service.conftest import AUTH, make_app, study_body
from tests.modeler_service.fake_curator import FakeCurator
from tests.modeler_service.test_studies import wait_for

FIXED = {"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 1e-4}


def body(strategy: str, iterations: int, **params: Any) -> dict[str, Any]:
    b = study_body(strategy=strategy, iterations=iterations, strategy_params=params)
    for key in ("hyperparameters", "initial_points"):  # study_body's GP-UCB shorthands
        b.pop(key)
    return b


def test_strategies_lists_the_registry_with_parameter_schemas(client: TestClient) -> None:
    resp = client.get("/v1/strategies")
    assert resp.status_code == 200
    strategies = {s["name"]: s for s in resp.json()["strategies"]}
    assert {"gp-ucb", "gp-bucb", "random"} <= set(strategies)
    assert "batch_size" in strategies["gp-bucb"]["params_schema"]["properties"]
    assert strategies["gp-ucb"]["params_schema"]["additionalProperties"] is False
    assert strategies["random"]["params_schema"].get("properties", {}) == {}
    rows = {name: s for name, s in strategies.items() if s["runs_on"] == "release"}
    assert all(s["description"] and s["kinds"] == ["row"] for s in rows.values())
    gibo = strategies["dp-gibo"]
    assert gibo["kinds"] == ["gradient"] and gibo["runs_on"] == "gradient-oracle"
    assert client.get("/v1/strategies", headers={"Authorization": ""}).status_code == 401
    assert "/v1/strategies" in client.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (body("gp-ucb", 5, learning_rate=0.1), ["learning_rate", "accepts", "delta_prime"]),
        (body("gp-bucb", 5, batch_size=0), ["batch_size", "greater than or equal to 1"]),
        (body("gp-bucb", 5, batch_size="5"), ["batch_size", "integer"]),
        ({**body("random", 5), "delta_prime": 0.1}, ["random", "delta_prime", "no parameters"]),
        ({**body("gp-ucb", 5, delta_prime=0.1), "delta_prime": 0.2}, ["delta_prime", "once"]),
        (body("gp-ucb", 5, initial_points=10_000), ["initial_points", "n = 200"]),
        (body("simulated-annealing", 5), ["strategy"]),
    ],
)
def test_bad_strategy_params_are_a_422_that_says_what_is_accepted(
    client: TestClient, settings: Settings, payload: dict[str, Any], words: list[str]
) -> None:
    resp = client.post("/v1/studies", json=payload)
    assert resp.status_code == 422, resp.text
    text = str(resp.json()["detail"])
    assert all(w in text for w in words), text
    assert client.get("/v1/studies").json()["count"] == 0
    assert not list((settings.data_dir / "releases").glob("*.npy"))  # nothing half-written


def test_gp_bucb_rounds_of_k_requests(client: TestClient, curator: FakeCurator) -> None:
    created = client.post("/v1/studies", json=body("gp-bucb", 8, batch_size=3, hyperparameters=FIXED))
    assert created.status_code == 201, created.text
    study = created.json()
    assert study["strategy"] == "gp-bucb" and study["strategy_params"]["batch_size"] == 3
    steps = [client.post(f"/v1/studies/{study['id']}/step").json() for _ in range(3)]
    assert [s["round"] for s in steps] == [1, 2, 3]
    assert [len(s["queries"]) for s in steps] == [3, 3, 2]  # the last round is cut to the budget
    assert [s["iteration"] for s in steps] == [3, 6, 8]
    assert all(s["status"] == "complete" and s["index"] is None for s in steps)
    rows = [q["index"] for s in steps for q in s["queries"]]
    assert len(set(rows)) == 8
    done = client.get(f"/v1/studies/{study['id']}").json()
    assert (done["status"], done["iterations_done"], done["rounds_done"]) == ("done", 8, 3)
    assert client.post(f"/v1/studies/{study['id']}/step").status_code == 409
    audit = client.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
    assert [(e["round"], e["request"]) for e in audit] == [
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
        (2, 2),
        (3, 0),
        (3, 1),
    ]
    assert [e["details"]["position"] for e in audit] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert client.get(f"/v1/studies/{study['id']}/audit/verify").json()["ok"]
    # one curator query per request, each under the key of its (round, request)
    assert [q["idempotency_key"] for q in curator.queries] == [
        request_key(study["id"], e["round"], e["request"]) for e in audit
    ]
    assert [(q["id"], q["index"]) for q in curator.queries] == [
        (e["curator_query_id"], e["index"]) for e in audit
    ]


def test_a_manual_round_waits_for_every_measurement_in_any_order_across_a_restart(
    settings: Settings,
) -> None:
    curator = FakeCurator(manual=True)
    with TestClient(make_app(settings, curator), headers=AUTH) as c:
        study = c.post("/v1/studies", json=body("gp-bucb", 6, batch_size=3, hyperparameters=FIXED)).json()
        step = c.post(f"/v1/studies/{study['id']}/step").json()
        assert step["status"] == "pending" and [q["status"] for q in step["queries"]] == ["pending"] * 3
        s = c.get(f"/v1/studies/{study['id']}").json()
        assert s["status"] == "awaiting_measurement" and s["pending_round"]["round"] == 1
        ids = [q["curator_query_id"] for q in step["queries"]]
        curator.post_result(ids[2], 0.3)  # the lab measures the third sample first
    # the modeler restarts while two samples are still being measured
    with TestClient(make_app(settings, curator), headers=AUTH) as c:
        s = c.get(f"/v1/studies/{study['id']}").json()
        assert (
            s["status"] == "ready" and [q["curator_query_id"] for q in s["pending_round"]["queries"]] == ids
        )
        assert c.post(f"/v1/studies/{study['id']}/run", json={"iterations": 3}).status_code == 202
        curator.post_result(ids[0], 0.1)
        assert wait_for(c, study["id"], {"awaiting_measurement"})["iterations_done"] == 0
        curator.post_result(ids[1], 0.2)
        s = wait_for(c, study["id"], {"ready"})
        assert (s["iterations_done"], s["rounds_done"]) == (3, 1)
        audit = c.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
    assert [(e["curator_query_id"], e["y"]) for e in audit] == list(zip(ids, [0.1, 0.2, 0.3], strict=True))
    assert curator.charged() == 3  # nothing re-sent as a new query after the restart


def test_random_uniform_over_unqueried_rows_reproducible_with_a_seed(
    tmp_path: Path, settings: Settings
) -> None:
    curator = FakeCurator(n=12)
    with TestClient(make_app(settings, curator), headers=AUTH) as c:
        ids = [c.post("/v1/studies", json=body("random", 12, **{})).json()["id"] for _ in range(2)]
        for study_id in ids:
            assert c.post(f"/v1/studies/{study_id}/run").status_code == 202
            assert wait_for(c, study_id, {"done", "failed"})["status"] == "done"
        rows = [[e["index"] for e in c.get(f"/v1/studies/{i}/audit").json()["entries"]] for i in ids]
        details = c.get(f"/v1/studies/{ids[0]}/audit").json()["entries"][0]["details"]
    assert sorted(rows[0]) == list(range(12))  # every row once: never a repeat
    assert rows[0] == rows[1]  # the same test seed (study_body's): the same draws
    assert details["source"] == "random" and details["candidates"] == 12


@pytest.mark.parametrize(
    ("strategy", "params"), [("gp-ucb", {"initial_points": 3}), ("gp-bucb", {"batch_size": 4})]
)
def test_a_row_the_grant_cannot_afford_is_excluded_and_the_study_goes_on(
    settings: Settings, strategy: str, params: dict[str, Any]
) -> None:
    """A refusal for good (409 ``row-unaffordable``, nothing charged) excludes the row with every row the
    curator lists, and the study runs to done; a refusal inside a batch keeps the answers before it."""
    curator = FakeCurator(seed=4)
    curator.unaffordable = set(range(0, 200, 2))  # every even row: refused
    with TestClient(make_app(settings, curator), headers=AUTH) as client:
        study = client.post("/v1/studies", json=body(strategy, 12, **params)).json()
        step = client.post(f"/v1/studies/{study['id']}/step")  # the first choice may be refused: re-planned
        assert step.status_code == 200, step.text
        assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
        done = wait_for(client, study["id"], {"done", "failed"})
        assert (done["status"], done["iterations_done"]) == ("done", 12), done
        rows = [e["index"] for e in client.get(f"/v1/studies/{study['id']}/audit").json()["entries"]]
        verify = client.get(f"/v1/studies/{study['id']}/audit/verify").json()
    assert all(i % 2 == 1 for i in rows) and len(set(rows)) == 12 and verify["ok"]
    assert curator.charged() == 12  # refusals charged nothing
    assert [int(q["index"]) for q in curator.queries] == rows
    refused = [r for r in curator.requests if r.method == "POST" and r.url.path.endswith("/queries")]
    assert len(refused) - 12 >= 1  # at least one refusal happened ...
    assert sum(r.url.path.endswith("/exclusions") for r in curator.requests) <= len(refused) - 12  # ... once
