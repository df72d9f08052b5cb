"""A grant's row exclusions (``GET /v1/releases/{id}/exclusions``): the rows whose person's output allotment
under the caller's grant leaves no room for one more answer, exactly the rows ``POST .../queries`` refuses
(409 with ``Pobo-Error-Code: row-unaffordable``, nothing charged); it depends on the grant's own answers
only."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from shared.errors import ERROR_CODE_HEADER, ROW_UNAFFORDABLE
from shared.privacy.ctl import CTL
from tests.curator_service.conftest import ADMIN, World, bearer, make_csv, synthetic, upload

pytestmark = pytest.mark.anyio

OP = {"epsilon": 1.0, "B": 2.0, "R": 0.5}
CHARGE = CTL(**OP).charged_epsilon


async def _partner(client: httpx.AsyncClient, release_ids: list[int], **op: Any) -> str:
    body: dict[str, Any] = {"name": "ldp", "release_ids": release_ids, "max_queries": 50}
    if op:
        body["output_privacy"] = op
    response = await client.post("/v1/partners", headers=ADMIN, json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["token"])


async def _ask(client: httpx.AsyncClient, release_id: int, token: str, index: int) -> httpx.Response:
    return await client.post(
        f"/v1/releases/{release_id}/queries", headers=bearer(token), json={"index": index}
    )


async def _exclusions(client: httpx.AsyncClient, release_id: int, token: str) -> dict[str, Any]:
    response = await client.get(f"/v1/releases/{release_id}/exclusions", headers=bearer(token))
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_fresh_repeats_exclude_exactly_the_rows_the_cap_refuses(world: World) -> None:
    rid = world.release["id"]
    token = await _partner(world.client, [rid], **OP, fresh_repeats=True, max_epsilon_per_row=2 * CHARGE)
    first = await _exclusions(world.client, rid, token)
    assert first["excluded"] == [] and first["only_allowed"] is None and first["n"] == world.release["n"]
    assert first["max_epsilon_per_row"] == pytest.approx(2 * CHARGE)
    for index in (4, 4, 7):
        assert (await _ask(world.client, rid, token, index)).status_code == 201
    listed = await _exclusions(world.client, rid, token)
    assert listed["excluded"] == [4]  # row 7 has room for one more answer, row 4 has none
    refused = await _ask(world.client, rid, token, 4)
    assert refused.status_code == 409 and refused.headers[ERROR_CODE_HEADER] == ROW_UNAFFORDABLE
    assert "/exclusions" in refused.json()["detail"]
    assert (await _ask(world.client, rid, token, 7)).status_code == 201
    assert (await _exclusions(world.client, rid, token))["excluded"] == [4, 7]
    other = await _ask(world.client, rid, token, 8)  # a row the list does not name is answered
    assert other.status_code == 201 and ERROR_CODE_HEADER not in other.headers


async def test_another_partners_raw_answers_exclude_nothing(world: World) -> None:
    rid = world.release["id"]
    for index in range(5):  # the world's partner is raw: these people's output epsilon is unbounded
        response = await world.client.post(
            f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": index}
        )
        assert response.status_code == 201
    token = await _partner(world.client, [rid], **OP, fresh_repeats=True, max_epsilon_per_row=3)
    assert (await _exclusions(world.client, rid, token))["excluded"] == []
    assert all([(await _ask(world.client, rid, token, i)).status_code == 201 for i in range(5)])
    # a raw grant and an uncapped one never refuse: nothing is excluded
    raw = await _exclusions(world.client, rid, world.partner_headers["Authorization"].removeprefix("Bearer "))
    assert raw["excluded"] == [] and raw["max_epsilon_per_row"] is None and "raw" in raw["statement"]
    uncapped = await _partner(world.client, [rid], **OP)
    assert (await _exclusions(world.client, rid, uncapped))["excluded"] == []


async def test_the_population_s_other_datasets_leave_only_the_cached_rows(client: httpx.AsyncClient) -> None:
    X, y = synthetic(n=30, d=3)
    releases = []
    for name in ("visit-1", "visit-2"):
        ds = (await upload(client, make_csv(X + (name == "visit-2"), y), name=name, population="ward")).json()
        rel = await client.post(
            f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 0.5, "delta": 1e-5}
        )
        releases.append(rel.json()["id"])
    # cached repeats, a cap of 1.5 answers: after one answer in visit-2, every person of visit-1 may be
    # that one (rows are not matched across datasets): 1 + one more answer > 1.5, so visit-1 is closed
    token = await _partner(client, releases, **OP, max_epsilon_per_row=1.5 * CHARGE)
    assert (await _ask(client, releases[1], token, 3)).status_code == 201
    closed = await _exclusions(client, releases[0], token)
    assert closed["excluded"] == [] and closed["only_allowed"] == []
    refused = await _ask(client, releases[0], token, 0)
    assert refused.status_code == 409 and refused.headers[ERROR_CODE_HEADER] == ROW_UNAFFORDABLE
    # in visit-2 itself a person has one row: new rows still fit, and row 3 repeats from its cache, free
    open_ = await _exclusions(client, releases[1], token)
    assert open_["excluded"] == [] and open_["only_allowed"] is None
    assert (await _ask(client, releases[1], token, 5)).status_code == 201
    assert (await _ask(client, releases[1], token, 3)).status_code == 201
    assert (await _exclusions(client, releases[0], token))["only_allowed"] == []


async def test_exclusions_are_a_partner_s_own(world: World) -> None:
    response = await world.client.get(f"/v1/releases/{world.release['id']}/exclusions", headers=ADMIN)
    assert response.status_code == 403 and "partner's token" in response.json()["detail"]
    token = await _partner(world.client, [], **OP)  # granted nothing: the release is not its to read
    response = await world.client.get(f"/v1/releases/{world.release['id']}/exclusions", headers=bearer(token))
    assert response.status_code == 404


def _refused_by_admit(app: Any, partner_id: int, release_id: int, n: int) -> set[int]:
    """The rows ``outputs.admit`` refuses the partner now, found by trying each one (rolled back)."""
    from curator_service import repository as repo
    from curator_service.exceptions import RowUnaffordable
    from curator_service.models import Query
    from curator_service.services import outputs

    refused: set[int] = set()
    db = app.state.components.db
    for i in range(n):
        with db.session(write=True) as session:
            partner = repo.get_partner(session, partner_id)
            release = repo.get_release(session, release_id)
            assert partner is not None and release is not None
            dataset = repo.get_dataset(session, release.dataset_id)
            assert dataset is not None
            query = Query(release_id=release_id, partner_id=partner_id, row_index=i, status="pending", y=None)
            session.add(query)
            session.flush()
            try:
                outputs.admit(session, partner, dataset, query)
            except RowUnaffordable:
                refused.add(i)
            finally:
                session.rollback()
    return refused


async def test_exclusions_are_exactly_what_admit_refuses_by_brute_force(
    client: httpx.AsyncClient, app: Any
) -> None:
    """Several grants (cached and fresh repeats, different caps, a raw and an uncapped one asking too), two
    datasets of one population (one with 2 rows per person), a grant tightened half-way: after every query,
    each capped grant's list for each release is exactly the set of rows ``admit`` refuses, and a 409 is
    only ever given for a listed row. Every other grant's queries leave a grant's list as it was."""
    import random

    n = 10
    X, y = synthetic(n=40, d=3)
    releases: list[int] = []
    for name, k in (("visit-1", 1), ("visit-2", 2)):
        csv = make_csv(X + (name == "visit-2"), y)
        ds = (await upload(client, csv, name=name, population="ward", rows_per_person=k)).json()
        assert ds["rows_per_person"] == k
        rel = await client.post(
            f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 0.5, "delta": 1e-5}
        )
        assert rel.status_code == 201, rel.text
        releases.append(rel.json()["id"])
    grants: dict[str, dict[str, Any]] = {
        "fresh": dict(OP, fresh_repeats=True, max_epsilon_per_row=4.5 * CHARGE),
        "cached": dict(OP, max_epsilon_per_row=3.5 * CHARGE),
        "tight": dict(OP, fresh_repeats=True, max_epsilon_per_row=2 * CHARGE),
        "uncapped": dict(OP),
        "raw": {},
    }
    tokens: dict[str, str] = {}
    ids: dict[str, int] = {}
    for name, op in grants.items():
        body: dict[str, Any] = {"name": name, "release_ids": releases, "max_queries": 500}
        if op:
            body["output_privacy"] = op
        r = await client.post("/v1/partners", headers=ADMIN, json=body)
        assert r.status_code == 201, r.text
        tokens[name], ids[name] = r.json()["token"], r.json()["id"]
    capped = ("fresh", "cached", "tight")

    async def check() -> dict[tuple[str, int], tuple[list[int], list[int] | None]]:
        lists = {}
        for name in capped:
            for rid in releases:
                got = await _exclusions(client, rid, tokens[name])
                refused = _refused_by_admit(app, ids[name], rid, n)
                listed = (
                    set(got["excluded"])
                    if got["only_allowed"] is None
                    else set(range(n)) - set(got["only_allowed"])
                )
                assert got["only_allowed"] is None or got["excluded"] == []
                assert listed == refused, (name, rid, got, sorted(refused))
                lists[(name, rid)] = (got["excluded"], got["only_allowed"])
        return lists

    rng = random.Random(5)
    before = await check()
    for step in range(40):
        if (
            step == 20
        ):  # a tighter charge per answer: the cached grant's earlier answers are no longer its cache
            r = await client.patch(
                f"/v1/partners/{ids['cached']}",
                headers=ADMIN,
                json={"output_privacy": dict(grants["cached"], epsilon=0.8)},
            )
            assert r.status_code == 200, r.text
            before = await check()
        who = rng.choice(list(grants))
        rid = rng.choice(releases)
        index = rng.randrange(n)
        listed = before.get((who, rid))
        r = await _ask(client, rid, tokens[who], index)
        assert r.status_code in (201, 409), r.text
        after = await check()
        if r.status_code == 409:
            assert r.headers[ERROR_CODE_HEADER] == ROW_UNAFFORDABLE
            assert listed is not None
            excluded, only = listed
            assert index in excluded if only is None else index not in only
        for key, value in after.items():  # another grant's query changes no other grant's list
            if key[0] != who:
                assert value == before[key], (who, key)
        before = after
