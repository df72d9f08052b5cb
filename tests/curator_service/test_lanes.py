"""The curator's fast lane (``api/lanes.py``): it answers a partner's common query in Core before FastAPI
routes it, and every request it does not take gets, from the route, the answer it would get without the
lane."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from curator_service.api.routes import queries as query_routes
from shared.servicekit.lanes import bypassed
from tests.curator_service.conftest import ADMIN, World

pytestmark = pytest.mark.anyio


class Calls:
    """Counts the route's own attempts (Core, then the ORM path's authentication)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.core = self.orm = 0
        core, orm = query_routes.answer_core, query_routes.partner_in_session

        def counted_core(*args: Any, **kwargs: Any) -> Any:
            self.core += 1
            return core(*args, **kwargs)

        def counted_orm(*args: Any, **kwargs: Any) -> Any:
            self.orm += 1
            return orm(*args, **kwargs)

        monkeypatch.setattr(query_routes, "answer_core", counted_core)
        monkeypatch.setattr(query_routes, "partner_in_session", counted_orm)


async def _post(world: World, path: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {world.partner['token']}"} | kwargs.pop("headers", {})
    url = path or f"/v1/releases/{world.release['id']}/queries"
    return await world.client.post(url, headers=headers, **kwargs)


async def test_the_lane_answers_the_common_query_without_the_route(
    world: World, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = Calls(monkeypatch)
    fast = await _post(world, json={"index": 1}, headers={"Idempotency-Key": "one"})
    assert fast.status_code == 201 and (calls.core, calls.orm) == (0, 0)
    with bypassed(app):
        routed = await _post(world, json={"index": 2}, headers={"Idempotency-Key": "two"})
    assert routed.status_code == 201 and (calls.core, calls.orm) == (1, 0)  # the route, in Core
    a, b = fast.json(), routed.json()
    assert set(a) == set(b) and a["y"] == float(world.y[1]) and b["y"] == float(world.y[2])
    own = ("id", "index", "y", "idempotency_key", "created_at", "completed_at")
    assert {k: v for k, v in a.items() if k not in own} == {k: v for k, v in b.items() if k not in own}
    assert (a["idempotency_key"], b["idempotency_key"]) == ("one", "two")
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert "idempotent-replayed" not in fast.headers
    replay = await _post(world, json={"index": 1}, headers={"Idempotency-Key": "one"})
    assert replay.json() == a and replay.headers["idempotent-replayed"] == "true"  # left to the route
    assert (calls.core, calls.orm) == (1, 1)  # the lane tried Core: the route went straight to the ORM path
    log = (await world.client.get("/v1/access-log", headers=ADMIN)).json()["entries"]
    queries = [e for e in log if e["path"].endswith("/queries")]
    assert [e["status_code"] for e in queries] == [201, 201, 201]
    assert {e["actor"] for e in queries} == {f"partner:{world.partner['id']}"}


LEFT_TO_THE_ROUTE: list[tuple[str, dict[str, Any]]] = [
    ("no token", {"json": {"index": 1}, "headers": {"Authorization": ""}}),
    ("another scheme", {"json": {"index": 1}, "headers": {"Authorization": "Basic eDp5"}}),
    ("a bad token", {"json": {"index": 1}, "headers": {"Authorization": "Bearer nope"}}),
    ("the admin token", {"json": {"index": 1}, "headers": ADMIN}),
    ("not JSON", {"content": b'{"index": 1}', "headers": {"Content-Type": "text/plain"}}),
    ("malformed JSON", {"content": b'{"index": ', "headers": {"Content-Type": "application/json"}}),
    ("an extra field", {"json": {"index": 1, "row": 2}}),
    ("a negative index", {"json": {"index": -1}}),
    ("an index out of range", {"json": {"index": 10_000}}),
    ("a string index", {"json": {"index": "1"}}),
    ("a key too long", {"json": {"index": 1}, "headers": {"Idempotency-Key": "k" * 201}}),
    ("a release not granted", {"json": {"index": 1}, "path": "/v1/releases/999/queries"}),
    ("a release id beyond int32", {"json": {"index": 1}, "path": "/v1/releases/4294967296/queries"}),
    ("a release id with zeros", {"json": {"index": 1}, "path": "/v1/releases/0{id}/queries"}),
]


@pytest.mark.parametrize(("case", "request_args"), LEFT_TO_THE_ROUTE, ids=[c for c, _ in LEFT_TO_THE_ROUTE])
async def test_what_the_lane_does_not_take_is_answered_as_without_it(
    world: World, app: Any, case: str, request_args: dict[str, Any]
) -> None:
    args = dict(request_args)
    path = args.pop("path", None)
    if path is not None:
        path = path.format(id=world.release["id"])
    with_lane = await _post(world, path, **args)
    with bypassed(app):
        without = await _post(world, path, **args)
    if case == "a release id with zeros":  # the route reads it as the release's id: two answers
        assert with_lane.status_code == without.status_code == 201
        assert with_lane.json()["release_id"] == without.json()["release_id"] == world.release["id"]
        return
    assert (with_lane.status_code, with_lane.json()) == (without.status_code, without.json()), case
    assert with_lane.status_code >= 400


async def test_a_key_sent_twice_is_left_to_the_route(world: World, app: Any) -> None:
    transport = httpx.ASGITransport(app=app)
    headers = [
        ("Authorization", f"Bearer {world.partner['token']}"),
        ("Idempotency-Key", "a"),
        ("Idempotency-Key", "b"),
    ]
    url = f"/v1/releases/{world.release['id']}/queries"
    async with httpx.AsyncClient(transport=transport, base_url="http://curator.test") as client:
        with_lane = await client.post(url, headers=headers, json={"index": 1})
        with bypassed(app):
            without = await client.post(url, headers=headers, json={"index": 1})
    assert with_lane.status_code == without.status_code == 201
    # the route read the same key both times: the second is a replay of the first
    assert with_lane.json() == without.json() and without.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in with_lane.headers
