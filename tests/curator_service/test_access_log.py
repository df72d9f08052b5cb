"""The access log: every /v1 request (who, method, path, status, when); never bodies."""

from __future__ import annotations

import pytest

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
