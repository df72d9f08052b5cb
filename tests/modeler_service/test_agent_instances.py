"""Two processes on one agent token (issue 34): each agent request names its process
(``Pobo-Agent-Instance``); the coordinator says nothing when a new process replaces the old one (a restart)
and warns, in the answer's ``warning`` and in its log, when two processes alternate; ``Agent`` hands each
warning to ``on_warning`` once. SQLite, and PostgreSQL when ``POBO_TEST_DATABASE_URL`` is set."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import numpy as np
import pytest

from modeler_service.federations.instances import InstanceTracker
from shared.protocol.schemas.federations import AGENT_INSTANCE_HEADER
from shared.tools.agent import Agent
from tests.modeler_service.test_federations import bearer, settings, started  # noqa: F401 - a fixture

A, B, C = "a" * 32, "b" * 32, "c" * 32
OMEGA = [0.25] * 8


def as_instance(agent: dict[str, Any], instance: str) -> dict[str, str]:
    return {**bearer(agent["token"]), AGENT_INSTANCE_HEADER: instance}


def warning_of(client: Any, fid: str, agent: dict[str, Any], instance: str) -> str | None:
    r = client.get(f"/v1/federations/{fid}", headers=as_instance(agent, instance))
    assert r.status_code == 200, r.text
    return r.json()["warning"]


def test_a_restart_is_silent_and_two_processes_are_warned(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fid, agents = started(client, agents=2)
    first, second = agents
    caplog.set_level(logging.INFO, logger="pobo.modeler.federations")
    # one process, then a restart (a new instance replaces it for good), then another restart
    assert [warning_of(client, fid, first, i) for i in (A, A, B, B, C)] == [None] * 5
    assert "a new process (instance bbbbbbbb) replaced instance aaaaaaaa" in caplog.text
    assert "two processes" not in caplog.text
    # a replaced instance speaks again: two processes alternate, and both are told, each time they alternate
    warned = warning_of(client, fid, first, B)
    assert warned is not None and "another process is using this agent's token" in warned
    assert "instances cccccccc and bbbbbbbb" in warned and "Stop every other `pobo agent run`" in warned
    assert warning_of(client, fid, first, C) is not None
    assert warning_of(client, fid, first, C) is None  # the same process twice in a row: nothing new
    assert "two processes use one agent token (instances bbbbbbbb and cccccccc alternate)" in caplog.text
    # the round and the submission answers carry it too; another agent, and the modeler, are not concerned
    r = client.get(f"/v1/federations/{fid}/rounds/1", headers=as_instance(first, B))
    assert r.status_code == 200 and r.json()["warning"] is not None
    r = client.post(
        f"/v1/federations/{fid}/rounds/1/submissions", json={"omega": OMEGA}, headers=as_instance(first, C)
    )
    assert r.status_code == 202 and r.json()["warning"] is not None
    assert warning_of(client, fid, second, A) is None and warning_of(client, fid, second, A) is None
    assert client.get(f"/v1/federations/{fid}", headers={AGENT_INSTANCE_HEADER: A}).json()["warning"] is None
    # without the header (an older agent): never a warning; a malformed one is refused
    assert client.get(f"/v1/federations/{fid}", headers=bearer(first["token"])).json()["warning"] is None
    bad = client.get(f"/v1/federations/{fid}", headers=as_instance(first, "x y"))
    assert bad.status_code == 422 and AGENT_INSTANCE_HEADER in bad.text


def test_the_tracker_remembers_a_bounded_history() -> None:
    tracker = InstanceTracker()
    ids = [f"{k:032x}" for k in range(12)]
    assert [tracker.heard("f", "agent", i) for i in ids] == [None] * 12  # twelve restarts in a row
    assert tracker.heard("f", "agent", ids[-2]) is not None  # a recent one came back
    assert tracker.heard("f", "agent", ids[0]) is None  # the oldest is forgotten: taken for a new process
    assert tracker.heard("f", "other", ids[0]) is None  # per agent


class Forward(httpx.BaseTransport):
    """The modeler app (its TestClient) as an agent's transport, every header passed on."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = self.client.request(
            request.method,
            request.url.path,
            params=request.url.params,
            content=request.read(),
            headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
        )
        return httpx.Response(resp.status_code, headers=resp.headers, content=resp.content, request=request)


def test_the_agent_hands_each_warning_to_on_warning_once(client: Any) -> None:
    fid, agents = started(client, agents=1)
    heard: dict[str, list[str]] = {"one": [], "two": []}

    def agent(name: str) -> Agent:
        return Agent(
            "http://modeler.test",
            fid,
            agents[0]["token"],
            objective=lambda x: -float(np.sum(np.square(x))),
            rng=np.random.default_rng(3),
            transport=Forward(client),
            on_warning=heard[name].append,
        )

    with agent("one") as one, agent("two") as two:
        assert one.instance_id != two.instance_id and len(one.instance_id) == 32
        one.federation()
        two.federation()  # a new process: taken for a restart
        assert heard == {"one": [], "two": []}
        one.federation()  # the first comes back: two processes
        two.round(1)
        one.federation()
        two.federation()
    assert len(heard["one"]) == 1 and len(heard["two"]) == 1  # each once, though answered three times
    assert "another process is using this agent's token" in heard["one"][0]
    assert two.instance_id[:8] in heard["one"][0] and one.instance_id[:8] in heard["two"][0]
