"""Issue 34, corrections of measured outcomes: replaced while no partner was sent the value, superseded
(both values kept, in the chain and for the partner) after; privatised and charged again under output
privacy; and what ``pobo reconcile`` makes of both."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from curator_service.services import corrections as correction_service
from curator_service.services import queries as query_service
from shared.protocol.keys import request_key
from shared.protocol.schemas import QueriesPublic, QueryLogVerification
from shared.servicekit.hashchain import GENESIS_HASH, link_hash
from shared.servicekit.principal import Principal
from shared.tools.reconcile import Supersession, compare_release_logs
from tests.curator_service.conftest import ADMIN, World, bearer
from tests.curator_service.test_lab import Lab, make_lab

pytestmark = pytest.mark.anyio

OP = {"epsilon": 1.0, "B": 2.0, "R": 0.5}
STUDY = "study-7"


async def _correct(
    client: httpx.AsyncClient, query_id: int, y: Any, reason: str = "re-measured"
) -> httpx.Response:
    return await client.post(
        f"/v1/queries/{query_id}/corrections", headers=ADMIN, json={"y": y, "reason": reason}
    )


async def _verify(
    client: httpx.AsyncClient, release_id: int, headers: dict[str, str] = ADMIN
) -> dict[str, Any]:
    r = await client.get(f"/v1/releases/{release_id}/queries/verify", headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _measured(lab: Lab, k: int, index: int, y: float, key: str | None = None) -> dict[str, Any]:
    """Partner k asks about row ``index``; the lab posts ``y``. (Not yet delivered.)"""
    q = await lab.ask(k, index, key=key)
    r = await lab.client.post(f"/v1/queries/{q['id']}/result", headers=ADMIN, json={"y": y})
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture
async def lab(client: httpx.AsyncClient) -> Lab:
    return await make_lab(client)


async def test_a_value_not_yet_sent_is_replaced(lab: Lab) -> None:
    q = await _measured(lab, 0, 3, 0.731)
    assert q["delivered_at"] is None
    r = await _correct(lab.client, q["id"], 0.713, "typo: 0.731 entered for 0.713")
    assert r.status_code == 201, r.text
    admin_view = r.json()
    assert admin_view["y"] == 0.713 and admin_view["status"] == "complete"
    [c] = admin_view["corrections"]
    assert (c["kind"], c["previous_y"], c["y"], c["reason"]) == (
        "correction",
        0.731,
        0.713,
        "typo: 0.731 entered for 0.713",
    )
    assert c["charged_epsilon"] is None and c["query_id"] == q["id"]
    # the partner only ever sees the corrected value; the correction itself is the curator's
    got = (await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))).json()
    assert got["y"] == 0.713 and got["corrections"] == [] and "0.731" not in str(got)
    listed = await lab.client.get(f"/v1/releases/{lab.release['id']}/corrections", headers=lab.headers(0))
    assert listed.json() == {"data": [], "count": 0}
    # both values are links of the chain, which verifies; the partner counts no link: its query's covers
    # the value it was never sent (its hash would give that value away)
    assert (await _verify(lab.client, lab.release["id"]))["entries"] == 2
    mine = await _verify(lab.client, lab.release["id"], lab.headers(0))
    assert mine["ok"] and mine["entries"] == 0 and mine["head"] == GENESIS_HASH


async def test_a_value_sent_is_superseded_and_both_are_kept(lab: Lab) -> None:
    q = await _measured(lab, 0, 3, 0.731)
    first = (await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))).json()  # delivered
    assert first["y"] == 0.731
    admin = (await lab.client.get(f"/v1/queries/{q['id']}", headers=ADMIN)).json()
    assert admin["delivered_at"] is not None
    r = await _correct(lab.client, q["id"], 0.713)
    assert r.status_code == 201, r.text
    [c] = r.json()["corrections"]
    assert (c["kind"], c["previous_y"], c["y"]) == ("supersession", 0.731, 0.713)
    got = (await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))).json()
    assert got["y"] == 0.713
    assert got["corrections"] == [c | {"reason": None}]  # the partner sees it, without the lab's reason
    listed = (
        await lab.client.get(f"/v1/releases/{lab.release['id']}/corrections", headers=lab.headers(0))
    ).json()
    assert listed == {"data": [c | {"reason": None}], "count": 1}
    other = await lab.client.get(f"/v1/releases/{lab.release['id']}/corrections", headers=lab.headers(1))
    assert other.json() == {"data": [], "count": 0}  # another partner's queries are not its business
    r = await _correct(lab.client, q["id"], 0.7125, "second re-measurement")
    assert [(x["kind"], x["previous_y"], x["y"]) for x in r.json()["corrections"]] == [
        ("supersession", 0.731, 0.713),
        ("supersession", 0.713, 0.7125),
    ]
    verified = await _verify(lab.client, lab.release["id"])
    assert verified["ok"] and verified["entries"] == 3
    # the partner counts its query's link only: a supersession's covers the lab's reason
    mine = await _verify(lab.client, lab.release["id"], lab.headers(0))
    assert mine["ok"] and mine["entries"] == 1 and mine["head"] != verified["head"]


@pytest.mark.parametrize("how", ["list", "long-poll", "replay"])
async def test_every_way_a_partner_reads_its_answer_counts_as_delivery(lab: Lab, how: str) -> None:
    q = await _measured(lab, 0, 5, 2.5, key="k-5")
    if how == "list":
        r = await lab.client.get(f"/v1/releases/{lab.release['id']}/queries", headers=lab.headers(0))
        assert [x["y"] for x in r.json()["queries"]] == [2.5]
    elif how == "long-poll":
        r = await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0), params={"wait": 5})
        assert r.json()["y"] == 2.5
    else:
        r = await lab.client.post(
            f"/v1/releases/{lab.release['id']}/queries",
            headers=lab.headers(0) | {"Idempotency-Key": "k-5"},
            json={"index": 5},
        )
        assert r.status_code == 201 and r.headers["Idempotent-Replayed"] == "true" and r.json()["y"] == 2.5
    # the admin reading the query is no delivery; the partner's read was
    assert (await lab.client.get(f"/v1/queries/{q['id']}", headers=ADMIN)).json()["delivered_at"] is not None
    r = await _correct(lab.client, q["id"], 2.0)
    assert r.json()["corrections"][0]["kind"] == "supersession"
    if how == "replay":  # a later replay shows the supersession too
        again = await lab.client.post(
            f"/v1/releases/{lab.release['id']}/queries",
            headers=lab.headers(0) | {"Idempotency-Key": "k-5"},
            json={"index": 5},
        )
        assert again.json()["y"] == 2.0 and [x["previous_y"] for x in again.json()["corrections"]] == [2.5]


async def test_a_partners_read_waits_for_a_correction_in_progress(lab: Lab, app: Any) -> None:
    """Not yet sent holds until the correction commits: a partner's read that comes meanwhile waits for it
    (PostgreSQL: the query row's lock; SQLite: the write lock) and is sent the corrected value."""
    q = await _measured(lab, 0, 3, 0.731)
    db = app.state.components.db
    partner = Principal("partner", partner_id=lab.partners[0]["id"])
    read: list[Any] = []
    with db.session(write=True) as session:
        correction_service.correct(session, q["id"], 0.713, "typo")  # locks held, not committed
        reader = threading.Thread(target=lambda: read.append(query_service.deliver(db, partner, q["id"])))
        reader.start()
        reader.join(timeout=1.0)
        assert reader.is_alive() and read == []  # the read waits for the correction
        session.commit()
    reader.join(timeout=30)
    [view] = read
    assert view.query.y == 0.713 and view.query.delivered_at is not None and view.corrections == []
    admin = (await lab.client.get(f"/v1/queries/{q['id']}", headers=ADMIN)).json()
    assert [c["kind"] for c in admin["corrections"]] == ["correction"]
    # and the next change, after that delivery, is a supersession
    after = (await _correct(lab.client, q["id"], 0.7)).json()
    assert [c["kind"] for c in after["corrections"]] == ["correction", "supersession"]


async def test_what_cannot_be_corrected_is_refused_with_what_to_do(lab: Lab, world: World) -> None:
    pending = await lab.ask(0, 2)
    r = await _correct(lab.client, pending["id"], 1.0)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"query {pending['id']} is still pending: post its value with POST "
        f"/v1/queries/{pending['id']}/result (a correction changes a value already posted)"
    )
    column = await world.client.post(
        f"/v1/releases/{world.release['id']}/queries", headers=world.partner_headers, json={"index": 0}
    )
    r = await _correct(lab.client, column.json()["id"], 1.0)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"query {column.json()['id']} is on a dataset whose outcomes come from its 'outcome' column; only "
        "measured outcomes (objective_mode 'manual') can be corrected"
    )
    assert (await _correct(lab.client, 999, 1.0)).status_code == 404
    q = await _measured(lab, 0, 3, 1.0)
    for body in ({"y": "nan", "reason": "x"}, {"y": 1.0, "reason": "  "}, {"y": 1.0}):
        assert (
            await lab.client.post(f"/v1/queries/{q['id']}/corrections", headers=ADMIN, json=body)
        ).status_code == 422
    r = await lab.client.post(
        f"/v1/queries/{q['id']}/corrections", headers=lab.headers(0), json={"y": 2.0, "reason": "mine"}
    )
    assert r.status_code == 403
    assert (await lab.client.get(f"/v1/queries/{q['id']}", headers=ADMIN)).json()["corrections"] == []


async def test_the_chain_catches_an_edit_of_either_value(lab: Lab, app: Any) -> None:
    q = await _measured(lab, 0, 3, 0.731)
    await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))
    await _correct(lab.client, q["id"], 0.713)
    await _measured(lab, 1, 4, 5.0)
    assert (await _verify(lab.client, lab.release["id"]))["ok"]
    engine = app.state.components.db.engine
    edits = [
        # the current value, behind the log's back: the correction's link (2) no longer ends at it
        ("UPDATE curator_queries SET y = 0.8 WHERE id = :id", 2),
        # the value replaced: the query's own link (1) covered it
        ("UPDATE curator_query_corrections SET previous_y = 0.5 WHERE query_id = :id", 1),
    ]
    for sql, bad in edits:
        with engine.begin() as conn:
            conn.execute(text(sql), {"id": q["id"]})
        v = await _verify(lab.client, lab.release["id"])
        assert (v["ok"], v["first_bad_seq"]) == (False, bad)
        with engine.begin() as conn:  # put it back: the chain is whole again
            conn.execute(text("UPDATE curator_queries SET y = 0.713 WHERE id = :id"), {"id": q["id"]})
            conn.execute(
                text("UPDATE curator_query_corrections SET previous_y = 0.731 WHERE query_id = :id"),
                {"id": q["id"]},
            )
        assert (await _verify(lab.client, lab.release["id"]))["ok"]


# ------------------------------------------------------------------------------------------ output privacy


async def _private_partner(lab: Lab, **op: Any) -> dict[str, Any]:
    body = {"name": "ldp", "release_ids": [lab.release["id"]], "max_queries": 20, "output_privacy": OP | op}
    r = await lab.client.post("/v1/partners", headers=ADMIN, json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def _output(lab: Lab) -> dict[str, Any]:
    r = await lab.client.get(f"/v1/populations/{lab.dataset['population_id']}/ledger", headers=ADMIN)
    return dict(r.json()["output"])


async def test_output_privacy_privatises_again_and_charges_a_supersession(lab: Lab) -> None:
    p = await _private_partner(lab, store_raw=True, max_epsilon_per_row=2.05)  # room for two answers
    q = (
        await lab.client.post(
            f"/v1/releases/{lab.release['id']}/queries", headers=bearer(p["token"]), json={"index": 6}
        )
    ).json()
    posted = (await lab.client.post(f"/v1/queries/{q['id']}/result", headers=ADMIN, json={"y": 1.25})).json()
    assert posted["y"] != 1.25  # CTL
    charged = posted["charged_epsilon"]
    before = await _output(lab)
    assert before["answers_privatised"] == 1
    fixed = (
        await _correct(lab.client, q["id"], 1.5)
    ).json()  # not delivered: replaced, fresh noise, no charge
    [c] = fixed["corrections"]
    assert (
        c["kind"] == "correction" and c["previous_y"] == posted["y"] and c["y"] == fixed["y"] != posted["y"]
    )
    assert (await _output(lab))["answers_privatised"] == 1
    seen = (await lab.client.get(f"/v1/queries/{q['id']}", headers=bearer(p["token"]))).json()
    assert seen["y"] == fixed["y"] and seen["corrections"] == []
    superseded = await _correct(lab.client, q["id"], 1.75)  # delivered: one more answer about the person
    assert superseded.status_code == 201, superseded.text
    s = superseded.json()["corrections"][-1]
    assert s["kind"] == "supersession" and s["charged_epsilon"] == charged and s["y"] != 1.75
    after = await _output(lab)
    assert after["answers_privatised"] == 2
    assert after["largest_row_total"] == pytest.approx(2 * charged)
    refused = await _correct(lab.client, q["id"], 2.0)  # the grant's cap has no room for a third answer
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith(
        f"query {q['id']}'s value was sent to its partner already, so a new value is one more answer about "
        "the person in row 6, and this grant's output allotment for them is used up: "
        "max_epsilon_per_row = 2.05"
    )
    assert "Nothing was recorded and the partner keeps the value it has" in refused.json()["detail"]
    now = (await lab.client.get(f"/v1/queries/{q['id']}", headers=ADMIN)).json()
    assert now["y"] == s["y"] and len(now["corrections"]) == 2 and (await _output(lab)) == after
    assert (await _verify(lab.client, lab.release["id"]))["ok"]


async def test_cached_repeats_change_with_the_query_they_repeat(lab: Lab) -> None:
    p = await _private_partner(lab)
    headers = bearer(p["token"])
    first = (
        await lab.client.post(f"/v1/releases/{lab.release['id']}/queries", headers=headers, json={"index": 8})
    ).json()
    repeat = (
        await lab.client.post(f"/v1/releases/{lab.release['id']}/queries", headers=headers, json={"index": 8})
    ).json()
    await lab.client.post(f"/v1/queries/{first['id']}/result", headers=ADMIN, json={"y": 0.5})
    r = await _correct(lab.client, repeat["id"], 1.0)
    assert r.status_code == 409 and f"correct query {first['id']}" in r.json()["detail"]
    got = (await lab.client.get(f"/v1/queries/{repeat['id']}", headers=headers)).json()  # the repeat is sent
    r = await _correct(lab.client, first["id"], 1.0)
    assert r.status_code == 201
    assert r.json()["corrections"][0]["kind"] == "supersession"  # one of the pair was delivered
    again = (await lab.client.get(f"/v1/queries/{repeat['id']}", headers=headers)).json()
    assert again["y"] == r.json()["y"] != got["y"]
    [c] = again["corrections"]
    assert (c["previous_y"], c["y"], c["charged_epsilon"]) == (got["y"], again["y"], 0.0)  # cached: free
    assert (await _output(lab))["answers_privatised"] == 2  # the first answer and its supersession
    assert (await _verify(lab.client, lab.release["id"]))["ok"]


async def test_a_raw_grants_supersession_is_one_more_disclosure(lab: Lab) -> None:
    q = await _measured(lab, 0, 1, 3.0)
    await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))
    assert (await _output(lab))["answers_raw"] == 1
    c = (await _correct(lab.client, q["id"], 3.5)).json()["corrections"][0]
    assert c["kind"] == "supersession" and c["charged_epsilon"] is None
    assert (await _output(lab))["answers_raw"] == 2


# ------------------------------------------------------------------------------------------ reconcile


def _entry(
    q: dict[str, Any], round_no: int, y: float, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "curator_query_id": q["id"],
        "iteration": round_no,
        "round": round_no,
        "request": 0,
        "index": q["index"],
        "y": y,
        "details": details or {},
    }


async def _compare(lab: Lab, audit: list[dict[str, Any]]) -> Any:
    listed = await lab.client.get(f"/v1/releases/{lab.release['id']}/queries", headers=lab.headers(0))
    queries = QueriesPublic.model_validate(listed.json()).queries
    verified = QueryLogVerification.model_validate(
        await _verify(lab.client, lab.release["id"], lab.headers(0))
    )
    return compare_release_logs(
        STUDY, lab.release["id"], audit, {"ok": True, "first_bad_seq": None}, queries, verified
    )


async def test_reconcile_accepts_a_correction_before_delivery(lab: Lab) -> None:
    q = await _measured(lab, 0, 2, 0.9, key=request_key(STUDY, 1, 0))
    await _correct(lab.client, q["id"], 0.95)
    seen = (await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))).json()
    report = await _compare(lab, [_entry(q, 1, seen["y"])])
    assert report.ok and report.supersessions == [] and report.modeler_entries == 1


async def test_reconcile_lists_a_supersession_both_sides_recorded(lab: Lab) -> None:
    q = await _measured(lab, 0, 2, 0.9, key=request_key(STUDY, 1, 0))
    await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))
    c = (await _correct(lab.client, q["id"], 0.95)).json()["corrections"][0]
    answer = _entry(q, 1, 0.9)
    record = _entry(q, 1, 0.95, {"supersession": {"correction_id": c["id"], "previous_y": 0.9, "y": 0.95}})
    report = await _compare(lab, [answer, record])
    assert report.ok and report.modeler_entries == 1
    assert report.supersessions == [Supersession(q["id"], c["id"], 0.9, 0.95)]
    missing = await _compare(lab, [answer])  # the modeler never recorded it: a mismatch, named
    assert not missing.ok
    assert [(m.query_id, m.kind) for m in missing.mismatches] == [
        (q["id"], "supersession not in the modeler's audit")
    ]
    wrong = _entry(q, 1, 0.96, {"supersession": {"correction_id": c["id"], "previous_y": 0.9, "y": 0.96}})
    report = await _compare(lab, [answer, wrong])
    assert [m.kind for m in report.mismatches] == ["supersession values differ"]
    stale = await _compare(lab, [_entry(q, 1, 0.5)])
    assert [m.kind for m in stale.mismatches] == ["outcome y differs"]


def _link_of(query: dict[str, Any], seq: int, y: float, prev: str) -> str:
    """The hash of ``query``'s chain link if it had been completed with ``y`` (``querylog.query_payload``),
    computed from what the partner is shown of it."""
    payload = {
        "seq": seq,
        "query_id": query["id"],
        "release_id": query["release_id"],
        "partner_id": query["partner_id"],
        "index": query["index"],
        "status": "complete",
        "y": y,
        "idempotency_key": query["idempotency_key"],
        "created_at": datetime.fromisoformat(query["created_at"]),
        "completed_at": datetime.fromisoformat(query["completed_at"]),
    }
    return link_hash(prev, payload)


async def test_a_replaced_value_cannot_be_read_back_from_the_partners_chain_head(lab: Lab) -> None:
    """A value replaced before delivery never reaches the partner, not even as the hash its chain head
    shows: a lab value has few digits, so a hash of it is as good as the value (a dictionary of 0.000 ..
    2.000 finds it). The partner's verification counts only links of values it was sent."""
    q = await _measured(lab, 0, 3, 0.731)
    seen = {(await _verify(lab.client, lab.release["id"], lab.headers(0)))["head"]}  # before delivery
    assert (await _correct(lab.client, q["id"], 0.713, "typo")).json()["corrections"][0][
        "kind"
    ] == "correction"
    got = (await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))).json()
    assert got["y"] == 0.713
    seen.add((await _verify(lab.client, lab.release["id"], lab.headers(0)))["head"])  # after it
    dictionary = {_link_of(got, 1, k / 1000, GENESIS_HASH): k / 1000 for k in range(2001)}
    assert 0.713 in dictionary.values()  # (the dictionary covers the kind of value a lab posts)
    assert [dictionary[h] for h in seen if h in dictionary] == []


async def test_the_curators_reason_cannot_be_confirmed_from_the_partners_chain_head(lab: Lab) -> None:
    """A supersession's link covers the lab's reason, which stays with the curator; every other field of it
    is shown to the partner, so a hash of it among the partner's would confirm a guessed reason (a sample id
    in it: a few thousand guesses)."""
    q = await _measured(lab, 0, 3, 0.731)
    got = (await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))).json()  # delivered
    seen = {(await _verify(lab.client, lab.release["id"], lab.headers(0)))["head"]}
    reason = "sample S-0042 re-measured: bubble in the cuvette"
    r = await _correct(lab.client, q["id"], 0.713, reason)
    [c] = r.json()["corrections"]
    assert c["kind"] == "supersession"
    shown = (await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0))).json()["corrections"][0]
    assert shown["reason"] is None
    seen.add((await _verify(lab.client, lab.release["id"], lab.headers(0)))["head"])
    prev = _link_of(got, 1, 0.731, GENESIS_HASH)
    assert prev in seen  # the partner's own query's link: its value is the one it was sent

    def link(guess: str) -> str:
        payload = {
            "seq": shown["chain_seq"],
            "entry": "correction",
            "query_id": q["id"],
            "release_id": q["release_id"],
            "partner_id": q["partner_id"],
            "kind": "supersession",
            "previous_y": shown["previous_y"],
            "y": shown["y"],
            "reason": guess,
            "created_at": datetime.fromisoformat(shown["created_at"]),
        }
        return link_hash(prev, payload)

    guesses = {link(f"sample S-{k:04d} re-measured: bubble in the cuvette"): k for k in range(100)}
    assert [guesses[h] for h in seen if h in guesses] == []
