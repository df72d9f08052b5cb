"""Issue 12, item 3: request bodies of both services take strict JSON types. A client's mistake is refused
with 422 and never silently coerced (and, for a query, never charged): booleans and strings are not
numbers, and ids, indices and counts are integers only."""

from __future__ import annotations

from typing import Any

import pytest

from tests.curator_service.conftest import ADMIN, World

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("index", [True, "3", 3.0, [3]])
async def test_a_query_index_must_be_an_integer_and_nothing_is_charged(world: World, index: Any) -> None:
    r = await world.client.post(
        f"/v1/releases/{world.release['id']}/queries", headers=world.partner_headers, json={"index": index}
    )
    assert r.status_code == 422, r.text
    assert "body field 'index'" in r.json()["detail"]
    me = (await world.client.get("/v1/partners/me", headers=world.partner_headers)).json()
    assert me["queries_used"] == 0
    listed = (await world.client.get(f"/v1/releases/{world.release['id']}/queries", headers=ADMIN)).json()
    assert listed["count"] == 0


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/datasets/{ds}/releases", {"epsilon": "1", "delta": 1e-5}, "epsilon"),
        ("/v1/datasets/{ds}/releases", {"epsilon": True, "delta": 1e-5}, "epsilon"),
        ("/v1/datasets/{ds}/releases", {"epsilon": 1, "delta": 1e-5, "r": 2.0}, "r"),
        ("/v1/datasets/{ds}/releases", {"epsilon": 1, "delta": 1e-5, "r": "2"}, "r"),
        ("/v1/partners", {"name": "p", "release_ids": ["1"], "max_queries": 3}, "release_ids.0"),
        ("/v1/partners", {"name": "p", "release_ids": [1], "max_queries": True}, "max_queries"),
        ("/v1/partners", {"name": 7, "release_ids": [1], "max_queries": 3}, "name"),
        ("/v1/partners/{partner}/grants", {"release_ids": [True]}, "release_ids.0"),
        ("/v1/queries/{query}/result", {"y": "0.5"}, "y"),
    ],
)
async def test_curator_bodies_are_strict(world: World, path: str, body: dict[str, Any], field: str) -> None:
    url = path.format(ds=world.dataset["id"], partner=world.partner["id"], query=1)
    r = await world.client.post(url, headers=ADMIN, json=body)
    assert r.status_code == 422, r.text
    assert f"body field '{field}'" in r.json()["detail"]


async def test_an_integer_is_still_a_number(world: World) -> None:
    r = await world.client.post(
        f"/v1/datasets/{world.dataset['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5}
    )
    assert r.status_code == 201 and r.json()["epsilon"] == 1.0
