"""Federations (DP-FTS-DE coordinator, issue 16): creation and its 422s, registration and start, the
submission rules, rounds closed at their deadline only and aggregated once (also after a restart), a
straggler counted as 0, and the budget refusal. Issue 32: ``first_round_at`` (round 1's deadline) and its
422s, receipts of accepted submissions (a replay after the close, a key reused with another omega or for
another round, no receipt, never the omega, migration 0007's backfill), and ``shared.tools.agent.Agent``
against the service: an answer lost while its round closed, an outage longer than a round, a restarted
agent. SQLite, and PostgreSQL when ``POBO_TEST_DATABASE_URL`` is set. Accounting at q = 1, z = 5
(dp-accounting is quick there)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from modeler_service import federations
from modeler_service.config import Settings
from modeler_service.db import alembic_config, upgrade
from modeler_service.models import FederationReceipt, FederationRound, FederationSubmission, utcnow
from shared.federated import aggregate_round, clean_aggregate, federated_epsilon, poisson_sample, round_robin
from shared.servicekit.migrations import run_migrations
from shared.tools.agent import Agent
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
    receipt = first.json()
    assert receipt == {
        "federation_id": fid,
        "round": 1,
        "status": "accepted",
        "accepted": True,
        "accepted_at": receipt["accepted_at"],
        "round_status": "open",
        "warning": None,  # (two processes on one agent token: tests/modeler_service/test_agent_instances.py)
    }
    assert "Idempotent-Replayed" not in first.headers
    replay = submit(client, fid, 1, agents[0], omega, key=f"{fid}:a0:1")
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == receipt
    other_omega = submit(client, fid, 1, agents[0], [0.2] * 8, key=f"{fid}:a0:1")
    assert other_omega.status_code == 409 and "with another omega" in other_omega.json()["detail"]
    second = submit(client, fid, 1, agents[0], omega, key="another")
    assert second.status_code == 409 and "already submitted for round 1" in second.json()["detail"]
    assert submit(client, fid, 1, agents[0], omega).status_code == 409
    future = submit(client, fid, 2, agents[1], omega)
    assert future.status_code == 409 and "the current round is 1" in future.json()["detail"]
    assert submit(client, fid, 1, agents[1], omega).status_code == 202

    wait_past_deadline(client, fid, 1)
    late = submit(client, fid, 1, agents[2], omega)
    assert late.status_code == 409 and "deadline passed" in late.json()["detail"]
    # the published round says nothing about who submitted; an agent sees its own standing only
    published = client.get(f"/v1/federations/{fid}/rounds/1").json()
    assert set(published) == {
        "round",
        "status",
        "deadline",
        "participants",
        "aggregates",
        "epsilon_pld",
        "epsilon_rdp",
        "you",
        "warning",  # an agent's own: two processes on its token (test_agent_instances.py)
    }
    assert published["you"] is None and published["warning"] is None  # the modeler
    standing = [
        client.get(f"/v1/federations/{fid}/rounds/1", headers=bearer(a["token"])).json()["you"]
        for a in agents
    ]
    assert [s["accepted"] for s in standing] == [True, True, False]
    assert standing[0]["accepted_at"] == receipt["accepted_at"] and standing[2]["accepted_at"] is None


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


# ----------------------------------------------------------------------- first_round_at (issue 32)


def test_first_round_at_sets_round_one_deadline_and_round_one_opens_at_once(client: Any, app: Any) -> None:
    fid, agents = setup_federation(client, agents=2)
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=10)
    as_offset = first.astimezone(timezone(timedelta(hours=2))).isoformat()  # any timezone will do
    r = client.post(f"/v1/federations/{fid}/start", json={"first_round_at": as_offset})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "running" and body["round"] == 1
    deadline = datetime.fromisoformat(body["round_deadline"])
    assert deadline == first + timedelta(seconds=ROUND_SECONDS)
    # round 1 takes submissions before first_round_at
    assert submit(client, fid, 1, agents[0], [0.1] * 8).status_code == 202
    db = app.state.components.ctx.db
    assert app.state.federation_closer.run_once() == 0
    # not closed before first_round_at + round_seconds, at any clock
    assert federations.close_round(db, fid, 1, now=first) is False
    assert federations.close_round(db, fid, 1, now=deadline - timedelta(milliseconds=1)) is False
    assert federations.close_round(db, fid, 1, now=deadline) is True
    # round 2 gets round_seconds from its opening, as before
    r2 = client.get(f"/v1/federations/{fid}/rounds/2").json()
    assert datetime.fromisoformat(r2["deadline"]) == deadline + timedelta(seconds=ROUND_SECONDS)


@pytest.mark.parametrize(
    ("first_round_at", "message"),
    [
        (lambda now: (now - timedelta(minutes=1)).isoformat(), "is in the past (the modeler's clock reads"),
        (lambda now: (now + timedelta(hours=24, minutes=1)).isoformat(), "more than 24 hours ahead"),
        (lambda now: (now + timedelta(minutes=5)).replace(tzinfo=None).isoformat(), "has no timezone"),
        (lambda now: "tomorrow at noon", "first_round_at"),
        (lambda now: 1_900_000_000, "first_round_at"),
    ],
)
def test_first_round_at_refusals(
    client: Any, first_round_at: Callable[[datetime], Any], message: str
) -> None:
    fid, _ = setup_federation(client, agents=1)
    r = client.post(f"/v1/federations/{fid}/start", json={"first_round_at": first_round_at(utcnow())})
    assert r.status_code == 422, r.text
    assert message in r.json()["detail"]
    assert client.get(f"/v1/federations/{fid}").json()["status"] == "registering"  # nothing happened
    unknown = client.post(f"/v1/federations/{fid}/start", json={"first_round": utcnow().isoformat()})
    assert unknown.status_code == 422 and "first_round" in unknown.json()["detail"]


def test_start_without_first_round_at_gives_round_one_round_seconds_from_now(client: Any) -> None:
    for body in (None, {}, {"first_round_at": None}):
        fid, _ = setup_federation(client, agents=1)
        before = utcnow()
        r = client.post(f"/v1/federations/{fid}/start", json=body)
        after = utcnow()
        assert r.status_code == 200, r.text
        deadline = datetime.fromisoformat(r.json()["round_deadline"])
        span = timedelta(seconds=ROUND_SECONDS)
        assert before + span <= deadline <= after + span


# ---------------------------------------------------------------------------------- receipts (issue 32)


def close_now(app: Any, fid: str, t: int) -> bool:
    """Close round ``t`` as a closer whose clock has passed its deadline (days ahead: no sleeping; round t
    is closed at now + t days, so each next round, opened then, is due at the next one)."""
    db = app.state.components.ctx.db
    return federations.close_round(db, fid, t, now=utcnow() + timedelta(days=t))


def standing(client: Any, fid: str, agent: dict[str, Any], rounds: int) -> list[bool]:
    """``you.accepted`` of rounds 1..rounds, as the agent reads them."""
    out = []
    for t in range(1, rounds + 1):
        you = client.get(f"/v1/federations/{fid}/rounds/{t}", headers=bearer(agent["token"])).json()["you"]
        out.append(bool(you["accepted"]))
    return out


def test_a_replay_after_the_close_is_answered_from_the_receipt(client: Any, app: Any) -> None:
    fid, agents = started(client, agents=3)
    omega = [0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 0.2, 0.1]
    key = f"{fid}:{agents[0]['id']}:1"
    first = submit(client, fid, 1, agents[0], omega, key=key)
    assert first.status_code == 202, first.text
    assert close_now(app, fid, 1)
    assert count(app, FederationSubmission) == 0 and count(app, FederationReceipt) == 1  # omega purged

    replay = submit(client, fid, 1, agents[0], omega, key=key)
    assert replay.status_code == 202, replay.text
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == {**first.json(), "round_status": "closed"}  # "accepted in round 1"
    assert replay.json()["round"] == 1 and replay.json()["accepted"] is True

    other = submit(client, fid, 1, agents[0], [0.9] * 8, key=key)  # the same key, another omega
    assert other.status_code == 409 and "with another omega" in other.json()["detail"]
    reused = submit(client, fid, 2, agents[0], omega, key=key)  # the same key for another round
    assert reused.status_code == 409
    assert "used for this agent's submission to round 1" in reused.json()["detail"]
    again = submit(client, fid, 1, agents[0], omega)  # no key: one submission per round
    assert again.status_code == 409 and "already submitted for round 1" in again.json()["detail"]
    # no receipt: a closed round refuses, also under another agent's key (keys are per agent)
    for k in (f"{fid}:{agents[1]['id']}:1", key):
        late = submit(client, fid, 1, agents[1], omega, key=k)
        assert late.status_code == 409
        assert "round 1 is closed and holds no submission of this agent" in late.json()["detail"]
    assert count(app, FederationReceipt) == 1 and count(app, FederationSubmission) == 0  # nothing stored

    assert [standing(client, fid, a, 1) for a in agents] == [[True], [False], [False]]
    assert submit(client, fid, 2, agents[0], omega, key=f"{fid}:{agents[0]['id']}:2").status_code == 202
    assert standing(client, fid, agents[0], 2) == [True, True]


def test_receipts_never_hold_the_omega(client: Any, app: Any) -> None:
    fid, agents = started(client, agents=2)
    omega = [0.123456789, -0.987654321, 0.5, 0.25, -0.125, 0.0625, 0.03125, 0.3333333333333333]
    for agent in agents:
        assert submit(client, fid, 1, agent, omega, key=f"{fid}:{agent['id']}:1").status_code == 202
    assert close_now(app, fid, 1)
    with app.state.components.ctx.db.read() as session:
        receipts = list(session.scalars(select(FederationReceipt)))
        rows = [{c.key: getattr(r, c.key) for c in FederationReceipt.__table__.columns} for r in receipts]
    assert len(rows) == 2
    for row in rows:
        assert set(row) == {
            "id",
            "round_id",
            "agent_id",
            "idempotency_key",
            "request_salt",
            "request_digest",
            "accepted_at",
        }
        text = json.dumps(row, default=str)
        assert not any(repr(v) in text for v in omega if v != 0.5)  # (0.5 is too short to look for)
        plain = hashlib.sha256(json.dumps(omega, separators=(",", ":")).encode()).hexdigest()
        assert row["request_digest"] != plain
    # the same omega under two receipts: two different digests (a random salt each)
    assert rows[0]["request_digest"] != rows[1]["request_digest"]
    assert rows[0]["request_salt"] != rows[1]["request_salt"]
    # and no answer carries it
    replay = submit(client, fid, 1, agents[0], omega, key=f"{fid}:{agents[0]['id']}:1")
    assert replay.status_code == 202 and "omega" not in replay.text


def test_migration_0007_gives_open_rounds_receipts(client: Any, app: Any) -> None:
    fid, agents = started(client, agents=2)
    key1, key2 = f"{fid}:{agents[0]['id']}:1", f"{fid}:{agents[0]['id']}:2"
    assert submit(client, fid, 1, agents[0], [0.1] * 8, key=key1).status_code == 202
    assert close_now(app, fid, 1)
    accepted = submit(client, fid, 2, agents[0], [0.2] * 8, key=key2).json()
    db = app.state.components.ctx.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0006", downgrade=True)  # receipts gone
    upgrade(db.engine)  # 0007 again: the open round's submission gets its receipt back
    assert count(app, FederationReceipt) == 1
    as_agent = bearer(agents[0]["token"])
    assert client.get(f"/v1/federations/{fid}/rounds/1", headers=as_agent).json()["you"] is None  # unknown
    you = client.get(f"/v1/federations/{fid}/rounds/2", headers=as_agent).json()["you"]
    assert you == {"accepted": True, "accepted_at": accepted["accepted_at"]}
    replay = submit(client, fid, 2, agents[0], [0.2] * 8, key=key2)
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    assert submit(client, fid, 2, agents[0], [0.3] * 8, key=key2).status_code == 409
    assert client.get(f"/v1/federations/{fid}/rounds/2", headers=bearer(agents[1]["token"])).json()[
        "you"
    ] == {"accepted": False, "accepted_at": None}


# ----------------------------------------------------------------- the agent against the service (issue 32)


class Relay(httpx.BaseTransport):
    """The modeler app (through its TestClient) as an agent's transport. A long-poll of round t closes the
    round at once (``close_now``: no waiting for deadlines); ``before`` may answer a call itself (a fault)
    and ``after`` may lose the app's answer (raise) once the app has handled the call."""

    def __init__(self, client: Any, app: Any, fid: str) -> None:
        self.client, self.app, self.fid = client, app, fid
        self.calls: list[str] = []
        self.before: Callable[[httpx.Request], httpx.Response | None] = lambda request: None
        self.after: Callable[[httpx.Request, httpx.Response], None] = lambda request, response: None

    def posts(self, t: int) -> int:
        return self.calls.count(f"POST /v1/federations/{self.fid}/rounds/{t}/submissions")

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        canned = self.before(request)
        if canned is not None:
            return canned
        if "wait" in request.url.params:
            close_now(self.app, self.fid, int(request.url.path.rsplit("/", 1)[1]))
        keep = {"authorization", "idempotency-key", "content-type"}
        resp = self.client.request(
            request.method,
            request.url.path,
            params=request.url.params,
            content=request.read(),
            headers={k: v for k, v in request.headers.items() if k.lower() in keep},
        )
        answer = httpx.Response(resp.status_code, headers=resp.headers, content=resp.content, request=request)
        self.after(request, answer)
        return answer


def run_agent(relay: Relay, agent: dict[str, Any]) -> Any:
    with Agent(
        "http://modeler.test",
        relay.fid,
        agent["token"],
        objective=lambda x: -float(np.sum(np.square(x))),
        rng=np.random.default_rng(7),
        retry_seconds=10,
        wait_seconds=1,
        n_candidates=64,
        n_starts=1,
        transport=relay,
    ) as runner:
        return runner.run()


def test_agent_counts_a_submission_whose_answer_was_lost_while_its_round_closed(
    client: Any, app: Any
) -> None:
    fid, agents = started(client, agents=2)
    relay = Relay(client, app, fid)
    cut: list[int] = []

    def lose_the_first_answer(request: httpx.Request, response: httpx.Response) -> None:
        if request.method == "POST" and "/rounds/1/" in request.url.path and not cut:
            cut.append(response.status_code)
            assert close_now(app, fid, 1)  # the round closes while the agent waits to retry
            raise httpx.ReadError("connection lost", request=request)

    relay.after = lose_the_first_answer
    report = run_agent(relay, agents[0])
    assert cut == [202]
    assert relay.posts(1) == 2  # the submission and its replay, answered from the receipt
    assert report.submitted == [1, 2, 3] and report.refused == []
    assert report.stop_reason == "rounds"
    assert standing(client, fid, agents[0], 3) == [True, True, True]  # the coordinator agrees


def test_agent_resynchronises_after_an_outage_longer_than_a_round(client: Any, app: Any) -> None:
    fid, agents = started(client, agents=2)
    relay = Relay(client, app, fid)
    failures: list[int] = []

    def outage(request: httpx.Request) -> httpx.Response | None:
        if "wait" in request.url.params and request.url.path.endswith("/rounds/1") and len(failures) < 3:
            if not failures:  # rounds 1 and 2 close while the agent cannot reach the modeler
                assert close_now(app, fid, 1) and close_now(app, fid, 2)
            failures.append(503)
            return httpx.Response(503, json={"detail": "restarting"}, request=request)
        return None

    relay.before = outage
    report = run_agent(relay, agents[0])
    assert failures == [503, 503, 503]
    assert relay.posts(2) == 0  # round 2 closed before the agent was back: nothing to submit to
    assert report.submitted == [1, 3] and report.refused == [2]  # no round skipped without a word
    assert standing(client, fid, agents[0], 3) == [True, False, True]


def test_a_restarted_agent_rejoins_without_submitting_twice(client: Any, app: Any) -> None:
    fid, agents = started(client, agents=2)
    key = f"{fid}:{agents[0]['id']}:1"
    assert submit(client, fid, 1, agents[0], [0.1] * 8, key=key).status_code == 202  # its previous run
    relay = Relay(client, app, fid)
    report = run_agent(relay, agents[0])
    assert relay.posts(1) == 0 and relay.posts(2) == relay.posts(3) == 1
    assert report.submitted == [1, 2, 3] and report.refused == []
    # an agent started after the federation is done accounts for every round, submits nothing
    late = Relay(client, app, fid)
    report = run_agent(late, agents[1])
    assert report.submitted == [] and report.refused == [1, 2, 3] and report.stop_reason == "rounds"
    assert not any(call.startswith("POST") for call in late.calls)
