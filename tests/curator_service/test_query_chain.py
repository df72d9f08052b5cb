"""The curator's query-log hash chain under concurrent queries (issue 5, item 7)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from tests.curator_service.conftest import ADMIN, World, bearer, make_csv, synthetic, upload

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
    assert partner_view.json() == body  # the granted partner may verify too (here all 5 links are its own)


async def test_verify_needs_a_grant(world: World) -> None:
    other = await world.client.post(
        "/v1/partners", headers=ADMIN, json={"name": "other", "release_ids": [], "max_queries": 1}
    )
    token = other.json()["token"]
    r = await world.client.get(
        f"/v1/releases/{world.release['id']}/queries/verify", headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 404
    assert (await world.client.get("/v1/releases/999/queries/verify", headers=ADMIN)).status_code == 404


async def test_manual_query_joins_the_chain_when_its_result_is_posted(client: httpx.AsyncClient) -> None:
    """A pending query is not a link yet; its posted result is, in completion order."""
    X, _ = synthetic(n=20, d=2)
    ds = (await upload(client, make_csv(X))).json()  # no objective: manual outcomes
    rel = (
        await client.post(
            f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5}
        )
    ).json()
    token = (
        await client.post(
            "/v1/partners", headers=ADMIN, json={"name": "p", "release_ids": [rel["id"]], "max_queries": 3}
        )
    ).json()["token"]
    first, second = [
        (
            await client.post(f"/v1/releases/{rel['id']}/queries", headers=bearer(token), json={"index": i})
        ).json()
        for i in (2, 5)
    ]
    assert first["status"] == second["status"] == "pending"

    async def verify() -> dict[str, Any]:
        r = await client.get(f"/v1/releases/{rel['id']}/queries/verify", headers=ADMIN)
        assert r.status_code == 200
        return dict(r.json())

    assert await verify() == {"ok": True, "entries": 0, "first_bad_seq": None, "head": "0" * 64}
    # results arrive out of creation order: the chain follows completion
    assert (
        await client.post(f"/v1/queries/{second['id']}/result", headers=ADMIN, json={"y": 0.25})
    ).is_success
    one = await verify()
    assert one["ok"] and one["entries"] == 1
    assert (
        await client.post(f"/v1/queries/{first['id']}/result", headers=ADMIN, json={"y": -1.5})
    ).is_success
    two = await verify()
    assert two["ok"] and two["entries"] == 2 and two["head"] != one["head"]


@pytest.mark.parametrize(
    ("statement", "bad_seq"),
    [
        ("UPDATE curator_queries SET y = y + 1 WHERE release_id = :r AND chain_seq = 2", 2),
        ("UPDATE curator_queries SET row_index = row_index + 1 WHERE release_id = :r AND chain_seq = 1", 1),
        ("DELETE FROM curator_queries WHERE release_id = :r AND chain_seq = 2", 2),
        ("DELETE FROM curator_queries WHERE release_id = :r AND chain_seq = 3", 3),  # truncation at the end
        ("UPDATE curator_queries SET status = 'pending' WHERE release_id = :r AND chain_seq = 3", 3),
    ],
)
async def test_verify_reports_the_first_tampered_entry(
    world: World, app: Any, statement: str, bad_seq: int
) -> None:
    rid = world.release["id"]
    for i in range(3):
        r = await world.client.post(
            f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": i}
        )
        assert r.status_code == 201
    before = (await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=ADMIN)).json()
    assert before["ok"] and before["entries"] == 3
    with app.state.components.db.engine.begin() as conn:  # a rogue edit behind the service's back
        assert conn.execute(text(statement), {"r": rid}).rowcount == 1
    after = (await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=ADMIN)).json()
    assert after["ok"] is False and after["first_bad_seq"] == bad_seq
    assert after["head"] == before["head"]  # the stored head is what the log should end with
    seen = (
        await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=world.partner_headers)
    ).json()
    assert seen["ok"] is False and seen["first_bad_seq"] == bad_seq  # the partner is told too


async def test_a_partner_verifies_without_learning_other_partners_activity(world: World) -> None:
    """Issue 12, item 9: the whole chain is checked, but a partner's view counts its own links only."""
    rid = world.release["id"]
    other = await world.client.post(
        "/v1/partners", headers=ADMIN, json={"name": "o", "release_ids": [rid], "max_queries": 9}
    )
    other_headers = {"Authorization": f"Bearer {other.json()['token']}"}
    for i in range(2):
        r = await world.client.post(
            f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": i}
        )
        assert r.status_code == 201
    mine = (
        await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=world.partner_headers)
    ).json()
    for i in range(3):  # another partner's activity ...
        r = await world.client.post(f"/v1/releases/{rid}/queries", headers=other_headers, json={"index": i})
        assert r.status_code == 201
    again = (
        await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=world.partner_headers)
    ).json()
    assert again == mine and mine["ok"] is True and mine["entries"] == 2  # ... is invisible to this one
    admin = (await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=ADMIN)).json()
    assert admin["entries"] == 5 and admin["head"] != mine["head"]
    theirs = (await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=other_headers)).json()
    assert theirs["entries"] == 3 and theirs["head"] == admin["head"]  # its own link is the last one
