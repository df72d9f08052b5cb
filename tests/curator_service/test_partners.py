"""POST/GET/DELETE /v1/partners: tokens (hashed, constant-time, shown once), grants, admin-only routes."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from sqlalchemy import text

from tests.curator_service.conftest import ADMIN, World, bearer

pytestmark = pytest.mark.anyio


async def test_partner_token_is_random_shown_once_and_stored_hashed(world: World, app) -> None:
    token = world.partner["token"]
    assert world.partner["name"] == "modeler" and world.partner["release_ids"] == [world.release["id"]]
    assert token.startswith("pobo_p_") and len(token) >= len("pobo_p_") + 43  # >= 32 random bytes
    listed = await world.client.get("/v1/partners", headers=ADMIN)
    assert listed.status_code == 200 and token not in listed.text
    one = await world.client.get(f"/v1/partners/{world.partner['id']}", headers=ADMIN)
    assert one.json() == listed.json()["data"][0]
    assert one.json()["release_ids"] == [world.release["id"]] and one.json()["max_queries"] == 5
    with app.state.components.db.engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash FROM curator_partner_tokens")).scalar_one()
        dump = " ".join(
            str(row)
            for table in ("curator_partners", "curator_partner_tokens")
            for row in conn.execute(text(f"SELECT * FROM {table}"))  # noqa: S608 - fixed names
        )
    assert stored == hashlib.sha256(token.encode()).hexdigest()
    assert token not in dump
    second = await world.client.post(
        "/v1/partners", headers=ADMIN, json={"name": "x", "release_ids": [], "max_queries": 0}
    )
    assert second.json()["token"] != token


async def test_wrong_or_missing_token_is_401(world: World) -> None:
    rid = world.release["id"]
    for headers, detail in (
        ({}, "missing bearer token: send the header 'Authorization: Bearer <token>'"),
        (
            {"Authorization": "Basic abc"},
            "missing bearer token: send the header 'Authorization: Bearer <token>'",
        ),
        (bearer(world.partner["token"] + "x"), "invalid or revoked token"),
        (bearer("pobo_p_" + "A" * 43), "invalid or revoked token"),
    ):
        response = await world.client.get(f"/v1/releases/{rid}", headers=headers)
        assert response.status_code == 401
        assert response.json() == {"detail": detail}
        assert response.headers["www-authenticate"] == "Bearer"


ADMIN_ONLY = [
    ("POST", "/v1/datasets"),
    ("GET", "/v1/datasets"),
    ("GET", "/v1/datasets/{ds}"),
    ("GET", "/v1/datasets/{ds}/privacy?epsilon=1&delta=0.001"),
    ("GET", "/v1/datasets/{ds}/ledger"),
    ("POST", "/v1/datasets/{ds}/releases"),
    ("GET", "/v1/datasets/{ds}/releases"),
    ("POST", "/v1/partners"),
    ("GET", "/v1/partners"),
    ("GET", "/v1/partners/{p}"),
    ("POST", "/v1/partners/{p}/grants"),
    ("DELETE", "/v1/partners/{p}"),
    ("PATCH", "/v1/partners/{p}"),
    ("POST", "/v1/queries/1/result"),
    ("GET", "/v1/access-log"),
]


@pytest.mark.parametrize(("method", "path"), ADMIN_ONLY)
async def test_partner_token_gets_403_on_admin_endpoints(world: World, method: str, path: str) -> None:
    url = path.format(ds=world.dataset["id"], p=world.partner["id"])
    kwargs = {}
    if method in ("POST", "PATCH") and "datasets" not in path or path.endswith("/releases"):
        kwargs["json"] = {
            "epsilon": 1,
            "delta": 1e-5,
            "r": 2,
            "name": "z",
            "release_ids": [],
            "max_queries": 1,
            "y": 1,
        }
    response = await world.client.request(method, url, headers=world.partner_headers, **kwargs)
    assert response.status_code == 403, response.text
    assert response.json() == {
        "detail": "this endpoint needs the curator's admin token; a partner token is not allowed"
    }
    ledger = (await world.client.get(f"/v1/datasets/{world.dataset['id']}/ledger", headers=ADMIN)).json()
    assert ledger["epsilon_spent"] == 1.0  # nothing was spent by the refused call


async def test_grants_and_unknown_releases(world: World) -> None:
    created = await world.client.post(
        "/v1/partners", headers=ADMIN, json={"name": "late", "release_ids": [999], "max_queries": 1}
    )
    assert created.status_code == 422 and created.json() == {"detail": "unknown release id(s): 999"}
    ds = world.dataset["id"]
    new = (
        await world.client.post(
            f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 2}
        )
    ).json()
    headers = world.partner_headers
    assert (await world.client.get(f"/v1/releases/{new['id']}", headers=headers)).status_code == 404
    granted = await world.client.post(
        f"/v1/partners/{world.partner['id']}/grants",
        headers=ADMIN,
        json={"release_ids": [new["id"], new["id"]]},
    )
    assert granted.status_code == 200
    assert granted.json()["release_ids"] == [world.release["id"], new["id"]]
    assert (await world.client.get(f"/v1/releases/{new['id']}", headers=headers)).status_code == 200
    again = await world.client.post(
        f"/v1/partners/{world.partner['id']}/grants", headers=ADMIN, json={"release_ids": [new["id"]]}
    )
    assert again.status_code == 200 and again.json()["release_ids"] == [world.release["id"], new["id"]]
    missing = await world.client.post(
        "/v1/partners/99/grants", headers=ADMIN, json={"release_ids": [new["id"]]}
    )
    assert missing.status_code == 404 and missing.json() == {"detail": "partner 99 does not exist"}


async def test_me_and_revocation(world: World) -> None:
    me = await world.client.get("/v1/partners/me", headers=world.partner_headers)
    assert me.status_code == 200
    assert me.json()["id"] == world.partner["id"] and me.json()["queries_used"] == 0
    assert (await world.client.get("/v1/partners/me", headers=ADMIN)).status_code == 403
    revoked = await world.client.delete(f"/v1/partners/{world.partner['id']}", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    after = await world.client.get(f"/v1/releases/{world.release['id']}", headers=world.partner_headers)
    assert after.status_code == 401 and after.json() == {"detail": "invalid or revoked token"}


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            {"name": "", "release_ids": [], "max_queries": 1},
            "body field 'name': String should have at least 1 character",
        ),
        (
            {"name": "a", "release_ids": [], "max_queries": -1},
            "body field 'max_queries': Input should be greater than or equal to 0",
        ),
        ({"name": "a", "release_ids": []}, "body field 'max_queries': Field required"),
        (
            {"name": "a", "max_queries": 1, "token": "mine"},
            "body field 'token': Extra inputs are not permitted",
        ),
    ],
)
async def test_partner_validation(world: World, body: dict, detail: str) -> None:
    response = await world.client.post("/v1/partners", headers=ADMIN, json=body)
    assert response.status_code == 422 and detail in response.json()["detail"]


async def test_a_quota_raise_lets_a_partner_that_used_its_quota_query_again(world: World) -> None:
    url = f"/v1/partners/{world.partner['id']}"
    ask = f"/v1/releases/{world.release['id']}/queries"
    for i in range(5):
        assert (
            await world.client.post(ask, headers=world.partner_headers, json={"index": i})
        ).status_code == 201
    assert (await world.client.post(ask, headers=world.partner_headers, json={"index": 5})).status_code == 429
    lowered = await world.client.patch(url, headers=ADMIN, json={"max_queries": 4})
    assert lowered.status_code == 422
    assert lowered.json()["detail"] == (
        f"max_queries must be at least the 5 queries partner {world.partner['id']} has used, got 4"
    )
    empty = await world.client.patch(url, headers=ADMIN, json={})
    assert empty.status_code == 422 and "name what to change: max_queries" in empty.text
    raised = await world.client.patch(url, headers=ADMIN, json={"max_queries": 8})
    assert raised.status_code == 200, raised.text
    assert (raised.json()["max_queries"], raised.json()["queries_used"]) == (8, 5)
    for i in range(5, 8):
        assert (
            await world.client.post(ask, headers=world.partner_headers, json={"index": i})
        ).status_code == 201
    assert (await world.client.post(ask, headers=world.partner_headers, json={"index": 9})).status_code == 429
    assert (
        await world.client.patch("/v1/partners/999", headers=ADMIN, json={"max_queries": 1})
    ).status_code == 404
    assert (await world.client.delete(url, headers=ADMIN)).status_code == 200
    revoked = await world.client.patch(url, headers=ADMIN, json={"max_queries": 100})
    assert revoked.status_code == 409
    assert (
        revoked.json()["detail"] == f"partner {world.partner['id']} is revoked; create a new partner instead"
    )


async def test_a_rotated_token_works_beside_the_old_one_until_the_old_one_is_revoked(world: World) -> None:
    pid, old = world.partner["id"], world.partner["token"]
    ask = f"/v1/releases/{world.release['id']}/queries"
    created = await world.client.post(f"/v1/partners/{pid}/tokens", headers=ADMIN)
    assert created.status_code == 201, created.text
    new = created.json()["token"]
    assert new.startswith("pobo_p_") and new != old and created.json()["partner_id"] == pid
    listed = (await world.client.get(f"/v1/partners/{pid}/tokens", headers=ADMIN)).json()
    assert [t["revoked"] for t in listed["data"]] == [False, False] and new not in str(listed)
    first_id, new_id = (t["id"] for t in listed["data"])
    assert new_id == created.json()["id"]
    for token, index in ((old, 0), (new, 1)):  # both answer (the fast path and the general one alike)
        resp = await world.client.post(ask, headers=bearer(token), json={"index": index})
        assert resp.status_code == 201 and resp.json()["partner_id"] == pid
        me = await world.client.get("/v1/partners/me", headers=bearer(token))
        assert me.json()["id"] == pid and me.json()["queries_used"] == index + 1
    revoked = await world.client.delete(f"/v1/partners/{pid}/tokens/{first_id}", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    assert (await world.client.post(ask, headers=bearer(old), json={"index": 2})).status_code == 401
    assert (await world.client.get("/v1/releases", headers=bearer(old))).status_code == 401
    assert (await world.client.post(ask, headers=bearer(new), json={"index": 2})).status_code == 201
    missing = await world.client.delete(f"/v1/partners/{pid}/tokens/999", headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["detail"] == f"partner {pid} has no token 999"
    assert (await world.client.post(f"/v1/partners/{pid}/tokens", headers=bearer(new))).status_code == 403
    assert (await world.client.delete(f"/v1/partners/{pid}", headers=ADMIN)).status_code == 200
    assert (await world.client.get("/v1/releases", headers=bearer(new))).status_code == 401  # all tokens
    again = await world.client.post(f"/v1/partners/{pid}/tokens", headers=ADMIN)
    assert again.status_code == 409


async def _ledger(world: World) -> dict[str, Any]:
    resp = await world.client.get(f"/v1/datasets/{world.dataset['id']}/ledger", headers=ADMIN)
    assert resp.status_code == 200, resp.text
    ledger: dict[str, Any] = resp.json()
    return ledger


async def test_output_privacy_tightens_freely_and_loosens_only_within_a_cap_and_the_budget(
    world: World,
) -> None:
    """Issue 34 item 2: tightening is always allowed; loosening only while the grant keeps a per-person cap
    (within it, a larger epsilon per answer or fresh repeats promise nobody more, so nothing is charged);
    a larger cap is charged to the population's budget, refused with 409 when the budget has no room."""
    pid = world.partner["id"]
    url = f"/v1/partners/{pid}"
    ctl = {"epsilon": 1.0, "B": 1.0, "R": 0.5, "max_epsilon_per_row": 10.0}
    to_private = await world.client.patch(url, headers=ADMIN, json={"output_privacy": ctl})
    assert to_private.status_code == 200, to_private.text
    before = await _ledger(world)
    unbounded = {
        "no cap": ({k: v for k, v in ctl.items() if k != "max_epsilon_per_row"}, "would rise above 10"),
        "raw": (None, "raw answers would replace its CTL answers"),
    }
    for body, expected in unbounded.values():
        resp = await world.client.patch(url, headers=ADMIN, json={"output_privacy": body})
        assert resp.status_code == 422, body
        detail = resp.json()["detail"]
        assert detail.startswith(f"output_privacy of partner {pid} can only be tightened here: ")
        assert expected in detail and "give it one first" in detail
    tighter = await world.client.patch(
        url, headers=ADMIN, json={"output_privacy": {**ctl, "epsilon": 0.5, "max_epsilon_per_row": 2.0}}
    )
    assert tighter.status_code == 200 and tighter.json()["output_privacy"]["max_epsilon_per_row"] == 2.0
    within = {**ctl, "epsilon": 1.5, "max_epsilon_per_row": 2.0, "fresh_repeats": True}
    resp = await world.client.patch(url, headers=ADMIN, json={"output_privacy": within})
    assert resp.status_code == 200, resp.text
    assert resp.json()["output_privacy"]["epsilon"] == 1.5 and resp.json()["output_privacy"]["fresh_repeats"]
    assert (await _ledger(world))["entries"] == before["entries"]  # within the cap: nothing charged

    raised = await world.client.patch(
        url, headers=ADMIN, json={"output_privacy": {**within, "max_epsilon_per_row": 3.5}}
    )
    assert raised.status_code == 200, raised.text
    after = await _ledger(world)
    (entry,) = [e for e in after["entries"] if e not in before["entries"]]
    assert entry["mechanism"] == "output-allotment" and entry["delta"] == 0.0 and entry["status"] == "spent"
    assert entry["epsilon"] == pytest.approx(1.5) and entry["release_id"] is None
    assert entry["native"] == {"kind": "output-allotment", "partner_id": pid, "from": 2.0, "to": 3.5}
    assert after["epsilon_spent"] == pytest.approx(before["epsilon_spent"] + 1.5)

    left = after["epsilon_budget"] - after["epsilon_spent"]
    too_much = await world.client.patch(
        url, headers=ADMIN, json={"output_privacy": {**within, "max_epsilon_per_row": 3.5 + left + 0.1}}
    )
    assert too_much.status_code == 409
    assert too_much.json()["detail"].startswith(
        f"privacy budget exceeded: raising partner {pid}'s max_epsilon"
    )
    assert "nothing was changed" in too_much.json()["detail"]
    assert (await _ledger(world))["entries"] == after["entries"]
    me = (await world.client.get("/v1/partners/me", headers=world.partner_headers)).json()
    assert me["output_privacy"]["max_epsilon_per_row"] == 3.5


async def test_an_uncapped_private_grant_is_given_a_cap_before_it_loosens(world: World) -> None:
    """A private grant without a cap has no bound to raise within: it is given one first (a tightening),
    and may then loosen within it. A partner with no release granted is charged nowhere."""
    ctl = {"epsilon": 1.0, "B": 1.0, "R": 0.5}
    created = await world.client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "lab", "release_ids": [world.release["id"]], "max_queries": 5, "output_privacy": ctl},
    )
    url = f"/v1/partners/{created.json()['id']}"
    looser = await world.client.patch(url, headers=ADMIN, json={"output_privacy": {**ctl, "epsilon": 2.0}})
    assert looser.status_code == 422 and "an answer would cost" in looser.json()["detail"]
    assert "give it one first" in looser.json()["detail"]
    capped = {**ctl, "max_epsilon_per_row": 4.0}
    assert (await world.client.patch(url, headers=ADMIN, json={"output_privacy": capped})).status_code == 200
    resp = await world.client.patch(url, headers=ADMIN, json={"output_privacy": {**capped, "epsilon": 2.0}})
    assert resp.status_code == 200 and resp.json()["output_privacy"]["epsilon"] == 2.0
    before = await _ledger(world)
    bare = await world.client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "bare", "release_ids": [], "max_queries": 5, "output_privacy": capped},
    )
    resp = await world.client.patch(
        f"/v1/partners/{bare.json()['id']}",
        headers=ADMIN,
        json={"output_privacy": {**capped, "max_epsilon_per_row": 8.0}},
    )
    assert resp.status_code == 200 and (await _ledger(world))["entries"] == before["entries"]
