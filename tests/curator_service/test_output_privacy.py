"""Output privacy on the curator: CTL answers, cached repeats, fresh repeats under a per-person cap, the
population-wide output ledger, raw grants as unbounded, manual datasets, and no raw y in any partner body."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest
from scipy import stats
from sqlalchemy import select

from curator_service.models import AccessLog, Query
from shared.privacy.ctl import CTL
from tests.curator_service.conftest import ADMIN, World, bearer, make_csv, synthetic, upload

pytestmark = pytest.mark.anyio

OP = {"epsilon": 1.0, "B": 2.0, "R": 0.5}


async def _partner(
    client: httpx.AsyncClient, release_ids: list[int], max_queries: int = 50, **op: Any
) -> dict:
    body: dict[str, Any] = {"name": "ldp-modeler", "release_ids": release_ids, "max_queries": max_queries}
    if op:
        body["output_privacy"] = op
    response = await client.post("/v1/partners", headers=ADMIN, json=body)
    assert response.status_code == 201, response.text
    return response.json()


async def _ask(client: httpx.AsyncClient, release_id: int, token: str, index: int) -> httpx.Response:
    return await client.post(
        f"/v1/releases/{release_id}/queries", headers=bearer(token), json={"index": index}
    )


async def _ledger(client: httpx.AsyncClient, population_id: int) -> dict:
    response = await client.get(f"/v1/populations/{population_id}/ledger", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()["output"]


def _session(world: World) -> Any:
    return world.client._transport.app.state.components.db.session(write=False)  # type: ignore[attr-defined]


async def test_grant_shows_its_parameters_and_the_charged_epsilon(world: World) -> None:
    partner = await _partner(world.client, [world.release["id"]], **OP)
    op = partner["output_privacy"]
    assert (op["epsilon"], op["B"], op["R"], op["fresh_repeats"], op["store_raw"]) == (
        1.0,
        2.0,
        0.5,
        False,
        False,
    )
    assert op["clip"] == 2.5 and op["laplace_scale"] == pytest.approx(5.0)
    assert op["charged_epsilon"] == pytest.approx(CTL(1.0, 2.0, 0.5).charged_epsilon)
    assert 1.0 <= op["charged_epsilon"] <= 1.0 + 1e-6
    me = await world.client.get("/v1/partners/me", headers=bearer(partner["token"]))
    assert me.json()["output_privacy"] == op  # the partner reads its own grant (its strategy needs B, R)


@pytest.mark.parametrize(
    ("op", "needle"),
    [
        ({"epsilon": 0, "B": 1, "R": 1}, "epsilon"),
        ({"epsilon": -1, "B": 1, "R": 1}, "epsilon"),
        ({"epsilon": 1, "B": 0, "R": 0}, "B + R must be > 0"),
        ({"epsilon": 1, "B": -1, "R": 1}, "B"),
        ({"epsilon": 1, "B": 1}, "R"),
        ({"epsilon": 1, "B": 1, "R": 1, "fresh_repeats": True}, "fresh_repeats needs max_epsilon_per_row"),
        ({"epsilon": 1, "B": 1, "R": 1, "max_epsilon_per_row": 0.5}, "below what one answer costs"),
        ({"epsilon": 1, "B": 1, "R": 1, "seed": 3}, "seed"),
        ({"epsilon": "1", "B": 1, "R": 1}, "epsilon"),
    ],
)
async def test_bad_output_privacy_is_422_and_nothing_is_written(world: World, op: dict, needle: str) -> None:
    response = await world.client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "x", "release_ids": [world.release["id"]], "max_queries": 3, "output_privacy": op},
    )
    assert response.status_code == 422, response.text
    assert needle in response.text
    listed = (await world.client.get("/v1/partners", headers=ADMIN)).json()
    assert listed["count"] == 1  # only the world's partner


async def test_answers_are_privatised_and_raw_y_appears_nowhere_a_partner_can_read(world: World) -> None:
    partner = await _partner(world.client, [world.release["id"]], **OP)
    token, rid = partner["token"], world.release["id"]
    answers = {}
    for i in range(6):
        response = await _ask(world.client, rid, token, i)
        assert response.status_code == 201, response.text
        q = response.json()
        assert q["status"] == "complete" and q["cached"] is None  # never told to a partner
        assert q["charged_epsilon"] == pytest.approx(partner["output_privacy"]["charged_epsilon"])
        answers[q["id"]] = q
    raw = {repr(float(world.y[i])) for i in range(6)}
    assert all(q["y"] != float(world.y[q["index"]]) for q in answers.values())
    bodies = [
        json.dumps(answers),
        (await world.client.get(f"/v1/releases/{rid}/queries", headers=bearer(token))).text,
        (await world.client.get(f"/v1/releases/{rid}/queries", headers=ADMIN)).text,
        *[(await world.client.get(f"/v1/queries/{qid}", headers=bearer(token))).text for qid in answers],
        (await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=bearer(token))).text,
    ]
    for body in bodies:
        assert not any(r in body for r in raw)
    with _session(world) as session:
        rows = session.scalars(select(Query).where(Query.id.in_(list(answers)))).all()
        assert all(r.y_raw is None for r in rows)  # not stored unless the curator opts in
        assert {r.id: r.y for r in rows} == {qid: q["y"] for qid, q in answers.items()}  # the chain's y
        log = " ".join(f"{e.path} {e.status_code}" for e in session.scalars(select(AccessLog)).all())
    assert not any(r in log for r in raw)


async def test_store_raw_keeps_the_measurement_for_the_curator_only(world: World) -> None:
    partner = await _partner(world.client, [world.release["id"]], **OP, store_raw=True)
    q = (await _ask(world.client, world.release["id"], partner["token"], 4)).json()
    with _session(world) as session:
        assert session.get(Query, q["id"]).y_raw == float(world.y[4])
    served = (await world.client.get(f"/v1/queries/{q['id']}", headers=ADMIN)).text
    assert repr(float(world.y[4])) not in served


async def test_repeats_return_the_partners_own_cached_answer_free(world: World) -> None:
    a = await _partner(world.client, [world.release["id"]], **OP)
    b = await _partner(world.client, [world.release["id"]], **OP)  # another partner, the same CTL parameters
    first = (await _ask(world.client, world.release["id"], a["token"], 9)).json()
    again = (await _ask(world.client, world.release["id"], a["token"], 9)).json()
    other = (await _ask(world.client, world.release["id"], b["token"], 9)).json()
    assert again["y"] == first["y"]  # averaging a partner's fresh answers would recover y
    assert again["charged_epsilon"] == 0.0 and first["charged_epsilon"] > 0
    # caches are per grant: b's answer tells b nothing about whether a asked (issue 31): its own, charged
    assert other["y"] != first["y"] and other["charged_epsilon"] == first["charged_epsilon"]
    assert first["cached"] is again["cached"] is other["cached"] is None  # partners never see the flag
    admin_view = (await world.client.get(f"/v1/queries/{again['id']}", headers=ADMIN)).json()
    assert admin_view["cached"] is True
    led = await _ledger(world.client, world.dataset["population_id"])
    assert led["answers_privatised"] == 2 and led["answers_cached"] == 1 and led["answers_raw"] == 0
    assert led["rows"] == [
        {"dataset_id": world.dataset["id"], "index": 9, "answers": 2, "epsilon": 2 * first["charged_epsilon"]}
    ]
    assert led["largest_person_total"] == pytest.approx(2 * first["charged_epsilon"])
    assert led["unbounded"] is False


async def test_fresh_repeats_are_charged_and_refused_exactly_at_the_cap(world: World) -> None:
    charge = CTL(**OP).charged_epsilon
    partner = await _partner(
        world.client, [world.release["id"]], **OP, fresh_repeats=True, max_epsilon_per_row=3 * charge
    )
    got = [await _ask(world.client, world.release["id"], partner["token"], 2) for _ in range(4)]
    assert [r.status_code for r in got] == [201, 201, 201, 409]
    assert len({r.json()["y"] for r in got[:3]}) == 3  # fresh noise per play
    assert (
        "max_epsilon_per_row" in got[3].json()["detail"] and "Nothing was charged" in got[3].json()["detail"]
    )
    me = (await world.client.get("/v1/partners/me", headers=bearer(partner["token"]))).json()
    assert me["queries_used"] == 3  # the refused query took nothing from the quota
    led = await _ledger(world.client, world.dataset["population_id"])
    assert led["rows"][0]["answers"] == 3 and led["rows"][0]["epsilon"] == pytest.approx(3 * charge)
    assert (
        await _ask(world.client, world.release["id"], partner["token"], 3)
    ).status_code == 201  # other row


async def test_concurrent_fresh_repeats_stop_exactly_at_the_cap(world: World) -> None:
    charge = CTL(**OP).charged_epsilon
    partner = await _partner(
        world.client, [world.release["id"]], **OP, fresh_repeats=True, max_epsilon_per_row=4 * charge
    )
    got = await asyncio.gather(
        *(_ask(world.client, world.release["id"], partner["token"], 5) for _ in range(10))
    )
    assert sorted(r.status_code for r in got) == [201] * 4 + [409] * 6
    led = await _ledger(world.client, world.dataset["population_id"])
    assert led["rows"][0]["answers"] == 4 and led["largest_person_total"] == pytest.approx(4 * charge)
    me = (await world.client.get("/v1/partners/me", headers=bearer(partner["token"]))).json()
    assert me["queries_used"] == 4


async def test_raw_and_private_partners_query_one_release_at_once(world: World) -> None:
    """Raw answers (no population lock) and privatised ones (population, then release) never deadlock."""
    private = await _partner(world.client, [world.release["id"]], max_queries=40, **OP)
    raw = await world.client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "raw", "release_ids": [world.release["id"]], "max_queries": 40},
    )
    tokens = [private["token"], raw.json()["token"]]
    got = await asyncio.gather(
        *(_ask(world.client, world.release["id"], tokens[i % 2], i // 2 % 12) for i in range(40))
    )
    assert [r.status_code for r in got] == [201] * 40
    led = await _ledger(world.client, world.dataset["population_id"])
    assert led["answers_raw"] == 20 and led["answers_privatised"] + led["answers_cached"] == 20
    verify = (
        await world.client.get(f"/v1/releases/{world.release['id']}/queries/verify", headers=ADMIN)
    ).json()
    assert verify["ok"] and verify["entries"] == 40


async def test_the_cap_counts_every_dataset_of_the_population_for_its_own_grant(
    client: httpx.AsyncClient,
) -> None:
    X, y = synthetic(n=40, d=3)
    charge = CTL(**OP).charged_epsilon
    ids = []
    for name in ("visit-1", "visit-2"):
        ds = (
            await upload(client, make_csv(X + (name == "visit-2"), y), name=name, population="ward-7")
        ).json()
        rel = await client.post(
            f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 0.5, "delta": 1e-5}
        )
        ids.append((ds, rel.json()))
    assert ids[0][0]["population_id"] == ids[1][0]["population_id"]
    both = [ids[0][1]["id"], ids[1][1]["id"]]
    a = await _partner(client, both, **OP, fresh_repeats=True, max_epsilon_per_row=3.5 * charge)
    for _ in range(2):
        assert (await _ask(client, ids[0][1]["id"], a["token"], 0)).status_code == 201
    # Rows are not matched across datasets: anyone in visit-2 may be row 0 of visit-1 (2 of a's answers)
    assert (await _ask(client, ids[1][1]["id"], a["token"], 17)).status_code == 201
    refused = await _ask(client, ids[1][1]["id"], a["token"], 17)  # 2 + 2 > 3.5
    assert refused.status_code == 409 and "this grant's output allotment" in refused.json()["detail"]
    # another grant's allotment is its own: what a spent never refuses b (b learns nothing about a)
    b = await _partner(client, both, **OP, fresh_repeats=True, max_epsilon_per_row=3.5 * charge)
    got = [(await _ask(client, ids[1][1]["id"], b["token"], 17)).status_code for _ in range(4)]
    assert got == [201, 201, 201, 409]
    led = await _ledger(client, ids[0][0]["population_id"])
    assert led["largest_row_total"] == pytest.approx(4 * charge)  # row 17 of visit-2: 1 (a) + 3 (b)
    assert led["largest_person_total"] == pytest.approx(6 * charge)  # 2 (visit-1) + 4 (visit-2)


async def test_raw_answers_make_the_output_epsilon_unbounded(world: World) -> None:
    assert (
        await world.client.post(
            f"/v1/releases/{world.release['id']}/queries", headers=world.partner_headers, json={"index": 1}
        )
    ).status_code == 201
    led = await _ledger(world.client, world.dataset["population_id"])
    assert led["answers_raw"] == 1 and led["unbounded"] is True and led["largest_person_total"] is None
    assert led["rows"] == [{"dataset_id": world.dataset["id"], "index": 1, "answers": 1, "epsilon": None}]
    assert "unbounded" in led["statement"]
    report = await world.client.get(
        f"/v1/datasets/{world.dataset['id']}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
    )
    assert report.status_code == 200 and report.json()["output"]["unbounded"] is True
    # a capped grant's allotment counts its own answers: another partner's raw answer about row 1 refuses
    # it nothing (a refusal would tell it which rows others asked about); the ledger stays unbounded
    capped = await _partner(
        world.client, [world.release["id"]], **OP, fresh_repeats=True, max_epsilon_per_row=5
    )
    assert (await _ask(world.client, world.release["id"], capped["token"], 1)).status_code == 201
    assert (await _ask(world.client, world.release["id"], capped["token"], 2)).status_code == 201
    assert (await _ledger(world.client, world.dataset["population_id"]))["unbounded"] is True


async def test_manual_dataset_privatises_the_posted_value(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=30, d=3)
    ds = (await upload(client, make_csv(X))).json()
    rel = (
        await client.post(
            f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5}
        )
    ).json()
    partner = await _partner(client, [rel["id"]], **OP)
    first = (await _ask(client, rel["id"], partner["token"], 3)).json()
    repeat = (await _ask(client, rel["id"], partner["token"], 3)).json()
    assert first["status"] == repeat["status"] == "pending" and repeat["cached"] is None
    assert (await client.get(f"/v1/queries/{repeat['id']}", headers=ADMIN)).json()["cached"] is True
    refused = await client.post(f"/v1/queries/{repeat['id']}/result", headers=ADMIN, json={"y": 1.25})
    assert refused.status_code == 409 and f"query {first['id']}" in refused.json()["detail"]
    posted = await client.post(f"/v1/queries/{first['id']}/result", headers=ADMIN, json={"y": 1.25})
    assert posted.status_code == 200 and posted.json()["y"] != 1.25
    got = (await client.get(f"/v1/queries/{repeat['id']}", headers=bearer(partner["token"]))).json()
    assert got["status"] == "complete" and got["y"] == posted.json()["y"]
    verify = (await client.get(f"/v1/releases/{rel['id']}/queries/verify", headers=ADMIN)).json()
    assert verify["ok"] and verify["entries"] == 2


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the noise does not depend on the DB
async def test_service_answers_follow_the_declared_laplace(client: httpx.AsyncClient) -> None:
    """KS test of (answer - clip(y)) against Laplace(2(B+R)/eps) over 600 rows, with a half-scale control.

    The service's noise is OS entropy (no seed exists): the test fails by chance with probability 1e-6."""
    X, y = synthetic(n=600, d=2, seed=11)
    ds = (await upload(client, make_csv(X, y), objective="outcome")).json()
    rel = (
        await client.post(
            f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5}
        )
    ).json()
    op = {"epsilon": 2.0, "B": 0.6, "R": 0.4}  # y spans about +-1.5: clipping bites
    partner = await _partner(client, [rel["id"]], max_queries=600, **op)
    answers = np.array([(await _ask(client, rel["id"], partner["token"], i)).json()["y"] for i in range(600)])
    residual = answers - np.clip(y, -1.0, 1.0)
    scale = 2 * (0.6 + 0.4) / 2.0
    assert stats.kstest(residual, "laplace", args=(0, scale)).pvalue > 1e-6
    assert stats.kstest(residual, "laplace", args=(0, scale / 2)).pvalue < 1e-6  # the test has teeth
