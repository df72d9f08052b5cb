"""Federations (DP-FTS-DE coordinator, issue 16): creation and its 422s, registration and start, the
submission rules, rounds closed at their deadline only and aggregated once (also after a restart), a
straggler counted as 0, and the budget refusal. SQLite, and PostgreSQL when ``POBO_TEST_DATABASE_URL`` is
set. Accounting at q = 1, z = 5 (dp-accounting is quick there); rounds of 0.5 s."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from modeler_service import federations
from modeler_service.config import Settings
from modeler_service.models import FederationRound, FederationSubmission
from shared.federated import aggregate_round, clean_aggregate, federated_epsilon, poisson_sample, round_robin
from tests.modeler_service.conftest import AUTH, TOKEN

ROUND_SECONDS = 4.0  # long enough that setting up and submitting fits in a round on a loaded machine
LONG_POLL = int(2 * ROUND_SECONDS + 1)  # seconds a long-poll may wait for a round to close


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    """The closer thread runs its start-up pass only; each test closes rounds when it says so."""
    return Settings(
        data_dir=tmp_path / "modeler",
        database_url=database_url,
        token=TOKEN,
        federation_tick_seconds=60,
        max_wait_seconds=5,
    )


ENTRIES = 2 * 8  # P M: the aggregate's noisy entries per round (fed_body)


def fed_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "dimension": 2,
        "bounds": [[0, 1], [-2, 2]],
        "P": 2,
        "M": 8,
        "q": 1.0,
        "z": 5.0,
        "S": 1.0,
        "rounds": 3,
        "epsilon_budget": 10.0,
        "round_seconds": ROUND_SECONDS,
        "lengthscale": 0.3,
    }
    body.update(overrides)
    return body


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def setup_federation(client: Any, agents: int = 2, **overrides: Any) -> tuple[str, list[dict[str, Any]]]:
    created = client.post("/v1/federations", json=fed_body(**overrides))
    assert created.status_code == 201, created.text
    fid = created.json()["id"]
    registered = []
    for k in range(agents):
        r = client.post(f"/v1/federations/{fid}/agents", json={"name": f"hospital-{k}"})
        assert r.status_code == 201, r.text
        registered.append(r.json())
    return fid, registered


def started(client: Any, agents: int = 2, **overrides: Any) -> tuple[str, list[dict[str, Any]]]:
    fid, registered = setup_federation(client, agents, **overrides)
    r = client.post(f"/v1/federations/{fid}/start")
    assert r.status_code == 200, r.text
    return fid, registered


def submit(
    client: Any, fid: str, t: int, agent: dict[str, Any], omega: list[float], key: str | None = None
) -> Any:
    headers = bearer(agent["token"])
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(
        f"/v1/federations/{fid}/rounds/{t}/submissions", json={"omega": omega}, headers=headers
    )


def wait_past_deadline(client: Any, fid: str, t: int) -> None:
    deadline = client.get(f"/v1/federations/{fid}/rounds/{t}").json()["deadline"]
    from datetime import datetime

    remaining = (
        datetime.fromisoformat(deadline) - datetime.now(datetime.fromisoformat(deadline).tzinfo)
    ).total_seconds()
    time.sleep(max(0.0, remaining) + 0.05)


def test_create_publishes_the_features(client: Any) -> None:
    r = client.post("/v1/federations", json=fed_body())
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "registering" and body["round"] == 0 and body["participants"] is None
    assert body["rff"]["kind"] == "rff-se" and body["rff"]["M"] == 8 and body["rff"]["d"] == 2
    assert np.asarray(body["rff"]["frequencies"]).shape == (8, 2)
    assert body["params"]["delta"] == 1e-5  # the default
    assert body["region_counts"] == [1, 2]  # the widest axis is cut
    assert body["epsilon_pld"] == 0.0 and body["agents"] == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"P": 11}, "P must be a product of the primes"),
        ({"q": 0}, "q"),
        ({"q": 1.5}, "q"),
        ({"z": 0}, "z"),
        ({"S": -1}, "S"),
        ({"delta": 1}, "delta"),
        ({"delta": 0}, "delta"),
        ({"dimension": 3}, "one [lower, upper] pair per dimension: 3 != 2"),
        ({"bounds": [[0, 1], [2, 2]]}, "bounds[1] must be [lower, upper] with finite lower < upper"),
        ({"round_seconds": 0}, "round_seconds"),
        ({"rounds": 0}, "rounds"),
        ({"seed": 3}, "seed"),
        # z = 0.1 puts a neighbour's mean 20 noise standard deviations away: the sampler cannot back delta
        ({"z": 0.1, "delta": 1e-9}, "too small for pobo's Gaussian sampler to back over 3 rounds"),
    ],
)
def test_create_refuses_bad_parameters(client: Any, overrides: dict[str, Any], message: str) -> None:
    r = client.post("/v1/federations", json=fed_body(**overrides))
    assert r.status_code == 422, r.text
    assert message in r.json()["detail"]


def test_register_start_then_the_list_is_frozen(client: Any) -> None:
    fid, agents = setup_federation(client, agents=3)
    assert agents[0]["token"].startswith("pobo_a_")
    dup = client.post(f"/v1/federations/{fid}/agents", json={"name": "hospital-0"})
    assert dup.status_code == 409 and "already has an agent named" in dup.json()["detail"]
    # an agent may read its federation, not register others nor start it
    as_agent = bearer(agents[0]["token"])
    assert (
        client.post(f"/v1/federations/{fid}/agents", json={"name": "x"}, headers=as_agent).status_code == 403
    )
    assert client.post(f"/v1/federations/{fid}/start", headers=as_agent).status_code == 403
    before = client.get(f"/v1/federations/{fid}", headers=as_agent).json()
    assert (
        before["you"]["name"] == "hospital-0" and before["you"]["region"] is None and before["agents"] is None
    )

    r = client.post(f"/v1/federations/{fid}/start")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "running" and body["round"] == 1 and body["participants"] == 3
    assert [(a["position"], a["region"]) for a in body["agents"]] == [(0, 0), (1, 1), (2, 0)]  # round robin
    assert body["round_deadline"] is not None

    late = client.post(f"/v1/federations/{fid}/agents", json={"name": "late"})
    assert late.status_code == 409 and "agent list is frozen" in late.json()["detail"]
    again = client.post(f"/v1/federations/{fid}/start")
    assert again.status_code == 409 and "already started" in again.json()["detail"]
    you = client.get(f"/v1/federations/{fid}", headers=bearer(agents[2]["token"])).json()["you"]
    assert you == {"id": agents[2]["id"], "name": "hospital-2", "position": 2, "region": 0}


def test_start_needs_agents(client: Any) -> None:
    fid, _ = setup_federation(client, agents=0)
    r = client.post(f"/v1/federations/{fid}/start")
    assert r.status_code == 409 and "no agents" in r.json()["detail"]


def test_tokens(app: Any) -> None:
    with TestClient(app) as anon:
        assert anon.post("/v1/federations", json=fed_body()).status_code == 401
        assert anon.get("/v1/federations", headers=bearer("pobo_a_nonsense")).status_code == 401
        with TestClient(app, headers=AUTH) as client:
            fid_a, agents_a = started(client)
            fid_b, _ = started(client)
            omega = [0.0] * 8
            # the modeler does not submit; an agent reads only its own federation
            assert (
                client.post(
                    f"/v1/federations/{fid_a}/rounds/1/submissions", json={"omega": omega}
                ).status_code
                == 403
            )
            as_a = bearer(agents_a[0]["token"])
            assert anon.get(f"/v1/federations/{fid_b}", headers=as_a).status_code == 404
            assert anon.get(f"/v1/federations/{fid_b}/rounds/1", headers=as_a).status_code == 404
            assert submit(anon, fid_b, 1, agents_a[0], omega).status_code == 404
            assert anon.post("/v1/federations", json=fed_body(), headers=as_a).status_code == 403
            assert anon.get("/v1/federations", headers=as_a).status_code == 403
            assert anon.get(f"/v1/federations/{fid_a}", headers=as_a).status_code == 200
            assert anon.get("/v1/studies", headers=as_a).status_code == 401  # agent tokens: federations only


def test_submission_rules(client: Any) -> None:
    fid, agents = started(client, agents=3)
    omega = [0.1] * 8
    bad = submit(client, fid, 1, agents[0], [0.1] * 7)
    assert bad.status_code == 422 and "M = 8 values, got 7" in bad.json()["detail"]
    first = submit(client, fid, 1, agents[0], omega, key=f"{fid}:a0:1")
    assert first.status_code == 202, first.text
    assert first.json() == {"federation_id": fid, "round": 1, "status": "accepted"}
    replay = submit(client, fid, 1, agents[0], omega, key=f"{fid}:a0:1")
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    second = submit(client, fid, 1, agents[0], omega, key="another")
    assert second.status_code == 409 and "already submitted for round 1" in second.json()["detail"]
    assert submit(client, fid, 1, agents[0], omega).status_code == 409
    future = submit(client, fid, 2, agents[1], omega)
    assert future.status_code == 409 and "the current round is 1" in future.json()["detail"]
    assert submit(client, fid, 1, agents[1], omega).status_code == 202

    wait_past_deadline(client, fid, 1)
    late = submit(client, fid, 1, agents[2], omega)
    assert late.status_code == 409 and "deadline passed" in late.json()["detail"]
    # the published round says nothing about who submitted
    assert set(client.get(f"/v1/federations/{fid}/rounds/1").json()) == {
        "round",
        "status",
        "deadline",
        "participants",
        "aggregates",
        "epsilon_pld",
        "epsilon_rdp",
    }


def count(app: Any, model: Any) -> int:
    with app.state.components.ctx.db.read() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def test_a_round_closes_at_its_deadline_only_and_once(client: Any, app: Any) -> None:
    fid, agents = started(client, agents=2)
    for k, agent in enumerate(agents):
        assert submit(client, fid, 1, agent, [0.1 * (k + 1)] * 8).status_code == 202
    db = app.state.components.ctx.db
    assert app.state.federation_closer.run_once() == 0  # everyone submitted: still open until the deadline
    r1 = client.get(f"/v1/federations/{fid}/rounds/1").json()
    assert r1["status"] == "open" and r1["aggregates"] is None and r1["epsilon_pld"] is None
    assert r1["participants"] == 2
    assert count(app, FederationSubmission) == 2

    wait_past_deadline(client, fid, 1)
    assert federations.close_round(db, fid, 1) is True
    assert federations.close_round(db, fid, 1) is False  # a closed round is never aggregated again
    assert app.state.federation_closer.run_once() == 0
    closed = client.get(f"/v1/federations/{fid}/rounds/1").json()
    assert closed["status"] == "closed"
    assert np.asarray(closed["aggregates"]).shape == (2, 8)
    # the implemented mechanism's epsilon: the accountant's at delta less the sampler's margin, plus it
    assert closed["epsilon_pld"] == pytest.approx(
        federated_epsilon(1.0, 5.0, 1, 1e-5, "pld", entries=ENTRIES)
    )
    assert closed["epsilon_pld"] > federated_epsilon(1.0, 5.0, 1, 1e-5, "pld")
    assert closed["epsilon_rdp"] == pytest.approx(
        federated_epsilon(1.0, 5.0, 1, 1e-5, "rdp", entries=ENTRIES)
    )
    assert count(app, FederationSubmission) == 0  # raw submissions purged with the close
    fed = client.get(f"/v1/federations/{fid}").json()
    assert fed["round"] == 2 and fed["rounds_closed"] == 1 and fed["epsilon_pld"] == closed["epsilon_pld"]
    assert fed["epsilon_replace_one_pld"] > fed["epsilon_pld"]
    with db.read() as session:
        stored = session.scalars(select(FederationRound).where(FederationRound.number == 1)).one()
        assert stored.sampled == [0, 1]  # q = 1: everyone (stored, never published)

    # the long-poll waits for round 2 to close (closing it itself once the deadline has passed)
    t0 = time.monotonic()
    r2 = client.get(f"/v1/federations/{fid}/rounds/2", params={"wait": LONG_POLL}).json()
    assert r2["status"] == "closed" and time.monotonic() - t0 < ROUND_SECONDS + 2.0
    assert r2["epsilon_pld"] > closed["epsilon_pld"]  # epsilon grows with the rounds
    assert (
        client.get(f"/v1/federations/{fid}/rounds/3", params={"wait": LONG_POLL}).json()["status"] == "closed"
    )
    done = client.get(f"/v1/federations/{fid}").json()
    assert done["status"] == "done" and done["stop_reason"] == "rounds" and done["rounds_closed"] == 3
    assert client.get(f"/v1/federations/{fid}/rounds/4").status_code == 404
    assert count(app, FederationRound) == 3


def test_a_straggler_contributes_zero(client: Any, app: Any) -> None:
    fid, agents = started(client, agents=3)
    omega = [0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 0.2, 0.1]
    assert submit(client, fid, 1, agents[1], omega).status_code == 202  # agents 0 and 2 straggle
    wait_past_deadline(client, fid, 1)

    # the closer's generator draws the sample, then the noise: the same seed reproduces both
    assert federations.close_round(app.state.components.ctx.db, fid, 1, rng=np.random.default_rng(5))
    got = np.asarray(client.get(f"/v1/federations/{fid}/rounds/1").json()["aggregates"])
    rng = np.random.default_rng(5)
    sampled = poisson_sample(3, 1.0, rng=rng)
    expected = aggregate_round(
        3,
        {1: omega},
        sampled,
        M=8,
        P=2,
        S=1.0,
        q=1.0,
        z=5.0,
        temperature=1.0,
        rng=rng,
        assignment=round_robin(3, 2),
    )
    np.testing.assert_array_equal(got, expected)
    clean = clean_aggregate(
        3, {1: omega}, sampled, M=8, P=2, S=1.0, q=1.0, temperature=1.0, assignment=round_robin(3, 2)
    )[0]
    assert np.abs(clean).sum() > 0  # agent 1's clipped omega, with its frozen weights (not renormalised)


def test_restart_mid_round(settings: Settings, curator: Any) -> None:
    from tests.modeler_service.conftest import make_app

    with TestClient(make_app(settings, curator), headers=AUTH) as client:
        fid, agents = started(client, agents=2)
        assert submit(client, fid, 1, agents[0], [0.2] * 8).status_code == 202
        deadline = client.get(f"/v1/federations/{fid}/rounds/1").json()["deadline"]
    from datetime import datetime

    pause = (
        datetime.fromisoformat(deadline) - datetime.now(datetime.fromisoformat(deadline).tzinfo)
    ).total_seconds()
    time.sleep(max(0.0, pause) + 0.05)  # the deadline passes while the modeler is down
    app = make_app(settings, curator)  # a new process over the same database
    with TestClient(app, headers=AUTH) as client:
        end = time.monotonic() + 10
        while client.get(f"/v1/federations/{fid}").json()["rounds_closed"] < 1:  # the start-up pass
            assert time.monotonic() < end
            time.sleep(0.05)
        fed = client.get(f"/v1/federations/{fid}").json()
        assert fed["round"] == 2 and fed["status"] == "running"
        assert client.get(f"/v1/federations/{fid}/rounds/1").json()["status"] == "closed"
        assert app.state.federation_closer.run_once() == 0  # round 2 is not due; round 1 is not closed again
        assert count(app, FederationRound) == 2 and count(app, FederationSubmission) == 0


def test_budget(client: Any) -> None:
    eps1 = federated_epsilon(1.0, 5.0, 1, 1e-5, "pld", entries=ENTRIES)
    eps2 = federated_epsilon(1.0, 5.0, 2, 1e-5, "pld", entries=ENTRIES)
    fid, _ = setup_federation(client, agents=1, epsilon_budget=eps1 / 2)
    refused = client.post(f"/v1/federations/{fid}/start")
    assert refused.status_code == 409 and "> the budget" in refused.json()["detail"]
    assert client.get(f"/v1/federations/{fid}").json()["status"] == "registering"

    fid, _ = started(client, agents=1, epsilon_budget=(eps1 + eps2) / 2)  # room for one round only
    r1 = client.get(f"/v1/federations/{fid}/rounds/1", params={"wait": LONG_POLL}).json()
    assert r1["status"] == "closed" and r1["epsilon_pld"] == pytest.approx(eps1)
    fed = client.get(f"/v1/federations/{fid}").json()
    assert fed["status"] == "done" and fed["stop_reason"] == "budget" and fed["rounds_closed"] == 1
    assert client.get(f"/v1/federations/{fid}/rounds/2").status_code == 404
