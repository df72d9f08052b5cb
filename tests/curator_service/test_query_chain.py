"""The curator's query-log hash chain under concurrent queries (issue 5, item 7)."""

from __future__ import annotations

import asyncio

import pytest

from tests.curator_service.conftest import ADMIN, World

pytestmark = pytest.mark.anyio


async def test_concurrent_queries_make_one_unbroken_chain(world: World) -> None:
    rid = world.release["id"]
    responses = await asyncio.gather(
        *(
            world.client.post(f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": i})
            for i in range(5)
        )
    )
    assert [r.status_code for r in responses] == [201] * 5
    verify = await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=ADMIN)
    assert verify.status_code == 200
    body = verify.json()
    assert body["ok"] is True and body["entries"] == 5 and body["first_bad_seq"] is None
    partner_view = await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=world.partner_headers)
    assert partner_view.json() == body  # the granted partner may verify too


async def test_verify_needs_a_grant(world: World) -> None:
    other = await world.client.post(
        "/v1/partners", headers=ADMIN, json={"name": "other", "release_ids": [], "max_queries": 1}
    )
    token = other.json()["token"]
    r = await world.client.get(
        f"/v1/releases/{world.release['id']}/queries/verify", headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 403
    assert (await world.client.get("/v1/releases/999/queries/verify", headers=ADMIN)).status_code == 404
