"""The access log: every /v1 request (who, method, path, status, when); never bodies."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from tests.curator_service.conftest import ADMIN, World, bearer

pytestmark = pytest.mark.anyio


async def test_every_request_is_logged_with_actor_and_status(world: World) -> None:
    c = world.client
    pid = world.partner["id"]
    rid = world.release["id"]
    await c.get(f"/v1/releases/{rid}", headers=world.partner_headers)
    await c.post(f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": 999})
    await c.get("/v1/datasets", headers=world.partner_headers)
    await c.get("/v1/datasets", headers=bearer("wrong"))
    await c.get("/healthz")  # not a /v1 call: not logged
    log = (await c.get("/v1/access-log", headers=ADMIN)).json()
    rows = [(e["actor"], e["method"], e["path"], e["status_code"]) for e in log["entries"]]
    assert rows[:3] == [
        ("admin", "POST", "/v1/datasets", 201),
        ("admin", "POST", f"/v1/datasets/{world.dataset['id']}/releases", 201),
        ("admin", "POST", "/v1/partners", 201),
    ]
    assert rows[3:] == [
        (f"partner:{pid}", "GET", f"/v1/releases/{rid}", 200),
        (f"partner:{pid}", "POST", f"/v1/releases/{rid}/queries", 422),
        (f"partner:{pid}", "GET", "/v1/datasets", 403),
        ("anonymous", "GET", "/v1/datasets", 401),
    ]
    assert all(e["at"] and e["duration_ms"] >= 0 for e in log["entries"])
    only = (await c.get("/v1/access-log", headers=ADMIN, params={"partner_id": pid})).json()
    assert [e["status_code"] for e in only["entries"]] == [200, 422, 403]
    page = (
        await c.get("/v1/access-log", headers=ADMIN, params={"after_id": log["entries"][5]["id"], "limit": 1})
    ).json()
    assert page["count"] == 1 and page["entries"][0]["id"] == log["entries"][6]["id"]


async def test_log_has_no_bodies_or_query_strings(world: World) -> None:
    c = world.client
    await c.get(
        f"/v1/datasets/{world.dataset['id']}/privacy",
        headers=ADMIN,
        params={"epsilon": 0.123456, "delta": 1e-5},
    )
    log = await c.get("/v1/access-log", headers=ADMIN)
    assert "0.123456" not in log.text and "epsilon" not in log.text
    assert world.partner["token"] not in log.text and "cohort-a" not in log.text


async def test_an_answered_query_is_logged_once_in_its_own_transaction(
    app: Any, world: World, monkeypatch
) -> None:
    """The entry of an answered query is committed with the answer (one commit for the request, no second
    write by the middleware); when that transaction fails, nothing of it stays and the middleware logs the
    failure."""
    from curator_service.services import queries as query_service

    c = world.client
    pid, rid = world.partner["id"], world.release["id"]
    url = f"/v1/releases/{rid}/queries"
    headers = {**world.partner_headers, "Idempotency-Key": "k-1"}
    commits: list[int] = []
    engine = app.state.components.db.engine
    listener = lambda conn: commits.append(1)  # noqa: E731
    event.listen(engine, "commit", listener)
    try:
        first = await c.post(url, headers=headers, json={"index": 1})
    finally:
        event.remove(engine, "commit", listener)
    assert first.status_code == 201 and len(commits) == 1
    again = await c.post(url, headers=headers, json={"index": 1})  # a replay: logged by the middleware
    assert first.status_code == again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"

    def fail_before_commit(name: str) -> None:
        if name == "query.before_commit":
            raise RuntimeError("disk full")

    monkeypatch.setattr(query_service.faults, "pause_point", fail_before_commit)
    failed = await c.post(url, headers=world.partner_headers, json={"index": 2})
    assert failed.status_code == 500
    log = (await c.get("/v1/access-log", headers=ADMIN, params={"partner_id": pid})).json()
    rows = [(e["actor"], e["method"], e["path"], e["status_code"]) for e in log["entries"]]
    assert rows == [(f"partner:{pid}", "POST", url, 201)] * 2 + [(f"partner:{pid}", "POST", url, 500)]
    assert all(e["duration_ms"] > 0 for e in log["entries"])
    queries = (await c.get(url, headers=ADMIN)).json()
    assert [q["index"] for q in queries["queries"]] == [1]  # the failed one left no query either
