"""POST /v1/releases/{id}/queries, GET /v1/queries/{id}[?wait], POST /v1/queries/{id}/result, listings."""

from __future__ import annotations

import asyncio
import hashlib
import os

import httpx
import numpy as np
import pytest
from sqlalchemy import update

from curator_service.db import Database
from curator_service.main import create_app
from curator_service.models import Partner, Query
from curator_service.services import answers
from tests.conftest import status_codes_at_once
from tests.curator_service.conftest import ADMIN, World, bearer, make_csv, synthetic, upload

pytestmark = pytest.mark.anyio


async def _query(
    world: World, index: int, key: str | None = None, headers: dict | None = None
) -> httpx.Response:
    h = dict(headers or world.partner_headers)
    if key is not None:
        h["Idempotency-Key"] = key
    return await world.client.post(
        f"/v1/releases/{world.release['id']}/queries", headers=h, json={"index": index}
    )


async def test_column_query_returns_the_stored_outcome(world: World) -> None:
    response = await _query(world, 7)
    assert response.status_code == 201, response.text
    q = response.json()
    assert set(q) >= {"id", "release_id", "index", "status", "y", "created_at", "completed_at"}
    assert (q["release_id"], q["index"], q["status"]) == (world.release["id"], 7, "complete")
    assert q["y"] == float(world.y[7])  # noise_std = 0: exactly the stored outcome
    assert q["completed_at"] is not None and q["partner_id"] == world.partner["id"]
    got = await world.client.get(f"/v1/queries/{q['id']}", headers=world.partner_headers)
    assert got.status_code == 200 and got.json() == q and q["cached"] is None  # the partner's view
    # the admin's view is the same query, with what only the curator sees: whether it was a cached repeat,
    # and when the partner was first sent it complete (here: by its GET just above)
    admin_view = (await world.client.get(f"/v1/queries/{q['id']}", headers=ADMIN)).json()
    assert admin_view["delivered_at"] is not None
    assert admin_view == q | {"cached": False, "delivered_at": admin_view["delivered_at"]}


async def test_idempotent_retry_same_answer_no_second_charge(world: World) -> None:
    first = await _query(world, 3, key="study-1-iter-1")
    retry = await _query(world, 3, key="study-1-iter-1")
    assert first.status_code == retry.status_code == 201
    assert retry.json() == first.json() and retry.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    me = (await world.client.get("/v1/partners/me", headers=world.partner_headers)).json()
    assert me["queries_used"] == 1
    listed = (await world.client.get(f"/v1/releases/{world.release['id']}/queries", headers=ADMIN)).json()
    assert listed["count"] == 1


async def test_concurrent_duplicates_return_one_query(world: World) -> None:
    responses = await asyncio.gather(*(_query(world, 11, key="same-key") for _ in range(8)))
    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["id"] for r in responses}) == 1
    assert {r.json()["y"] for r in responses} == {float(world.y[11])}
    me = (await world.client.get("/v1/partners/me", headers=world.partner_headers)).json()
    assert me["queries_used"] == 1


async def test_key_reuse_for_another_query_is_409(world: World) -> None:
    first = await _query(world, 1, key="k")
    response = await _query(world, 2, key="k")
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"this Idempotency-Key was already used for query {first.json()['id']} "
        f"(release {world.release['id']}, index 1); use a new key for a different query"
    }


async def test_index_out_of_range_is_422_and_not_charged(world: World) -> None:
    response = await _query(world, 120)
    assert response.status_code == 422
    assert response.json() == {
        "detail": f"index 120 is out of range: release {world.release['id']} has n = 120 rows (valid 0..119)"
    }
    negative = await _query(world, -1)
    assert negative.status_code == 422
    assert "body field 'index': Input should be greater than or equal to 0" in negative.json()["detail"]
    me = (await world.client.get("/v1/partners/me", headers=world.partner_headers)).json()
    assert me["queries_used"] == 0


async def test_quota_used_up_is_429(world: World) -> None:
    for i in range(5):
        assert (await _query(world, i)).status_code == 201
    response = await _query(world, 5)
    assert response.status_code == 429
    assert response.json() == {
        "detail": "query quota used up: this partner has used 5 of its 5 queries; "
        f"ask the curator to raise max_queries (PATCH /v1/partners/{world.partner['id']})"
    }
    replay_after = await _query(world, 0, key="new-key")
    assert replay_after.status_code == 429
    listed = (await world.client.get(f"/v1/releases/{world.release['id']}/queries", headers=ADMIN)).json()
    assert listed["count"] == 5


async def test_concurrent_queries_respect_the_quota(world: World) -> None:
    responses = await asyncio.gather(*(_query(world, i) for i in range(12)))
    assert sorted(r.status_code for r in responses) == [201] * 5 + [429] * 7


async def test_more_concurrent_queries_than_threads_all_complete(four_threads: None, world: World) -> None:
    """Six times as many queries as worker threads: a query holds the write lock from its authentication
    hop to its commit hop, so without admission the queries waiting for the lock took every thread and
    the holder never got one to commit (a deadlock until the 60 s lock waits ran out)."""
    response = await world.client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "busy", "release_ids": [world.release["id"]], "max_queries": 50},
    )
    headers = bearer(response.json()["token"])
    statuses = await status_codes_at_once(24, lambda index: _query(world, index, headers=headers))
    assert statuses == [201] * 24
    listed = (await world.client.get(f"/v1/releases/{world.release['id']}/queries", headers=ADMIN)).json()
    assert listed["count"] == 24


async def test_noise_is_fresh_per_query(client: httpx.AsyncClient) -> None:
    X, y = synthetic(n=20, d=2)
    ds = (await upload(client, make_csv(X, y), objective="outcome", noise_std=0.5)).json()["id"]
    rel = (
        await client.post(f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5})
    ).json()
    token = (
        await client.post(
            "/v1/partners", headers=ADMIN, json={"name": "p", "release_ids": [rel["id"]], "max_queries": 400}
        )
    ).json()["token"]
    ys = []
    for _ in range(200):
        r = await client.post(f"/v1/releases/{rel['id']}/queries", headers=bearer(token), json={"index": 4})
        ys.append(r.json()["y"])
    ys = np.array(ys)
    assert len(set(ys.tolist())) == 200  # a fresh draw every time
    # OS-entropy noise: false-failure rates 5.7e-7 (5 standard errors) and 6.7e-5 (chi-square, 199 dof)
    assert abs(ys.mean() - y[4]) < 5 * 0.5 / np.sqrt(200)
    assert 0.4 < ys.std(ddof=1) < 0.6


async def test_manual_queries_pending_until_the_result_is_posted(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=20, d=2)
    ds = (await upload(client, make_csv(X))).json()  # no objective: manual
    assert ds["objective_mode"] == "manual"
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
    created = await client.post(f"/v1/releases/{rel['id']}/queries", headers=bearer(token), json={"index": 2})
    assert created.status_code == 201
    q = created.json()
    assert q["status"] == "pending" and q["y"] is None and q["completed_at"] is None

    short = await client.get(f"/v1/queries/{q['id']}", headers=bearer(token), params={"wait": 0.3})
    assert short.status_code == 200 and short.json()["status"] == "pending"

    async def post_later() -> httpx.Response:
        await asyncio.sleep(0.5)
        return await client.post(f"/v1/queries/{q['id']}/result", headers=ADMIN, json={"y": 0.731})

    poll, posted = await asyncio.gather(
        client.get(f"/v1/queries/{q['id']}", headers=bearer(token), params={"wait": 30}), post_later()
    )
    assert posted.status_code == 200 and posted.json()["status"] == "complete" and posted.json()["y"] == 0.731
    # the partner's long-poll sees what the admin's post returned, but for the admin-only cached flag
    assert poll.status_code == 200 and poll.json() == posted.json() | {"cached": None}

    twice = await client.post(f"/v1/queries/{q['id']}/result", headers=ADMIN, json={"y": 1.0})
    assert twice.status_code == 409
    assert twice.json() == {  # a measured value is changed through its corrections instead
        "detail": f"query {q['id']} is already complete; a result is posted once. To change the value, POST "
        f'/v1/queries/{q["id"]}/corrections with {{"y": <new value>, "reason": "<why>"}}: it is replaced if '
        "the partner has not been sent it yet, else superseded (both values kept in the log)"
    }
    not_finite = await client.post(f"/v1/queries/{q['id']}/result", headers=ADMIN, json={"y": "nan"})
    assert not_finite.status_code == 422
    assert (await client.post("/v1/queries/999/result", headers=ADMIN, json={"y": 1})).status_code == 404


async def test_result_for_a_column_query_is_409(world: World) -> None:
    q = (await _query(world, 0)).json()
    response = await world.client.post(f"/v1/queries/{q['id']}/result", headers=ADMIN, json={"y": 2.0})
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"query {q['id']} is already complete; a result can be posted only once"
    }


async def test_query_access_rules(world: World) -> None:
    q = (await _query(world, 0)).json()
    other = (
        await world.client.post(
            "/v1/partners",
            headers=ADMIN,
            json={"name": "o", "release_ids": [world.release["id"]], "max_queries": 2},
        )
    ).json()
    response = await world.client.get(f"/v1/queries/{q['id']}", headers=bearer(other["token"]))
    # another partner's query is indistinguishable from a missing one (no probing of query ids)
    assert response.status_code == 404 and response.json() == {"detail": f"query {q['id']} does not exist"}
    mine = await world.client.get(
        f"/v1/releases/{world.release['id']}/queries", headers=bearer(other["token"])
    )
    assert mine.json() == {"queries": [], "count": 0}
    admin_query = await _query(world, 0, headers=ADMIN)
    assert admin_query.status_code == 403
    assert admin_query.json()["detail"].startswith("queries are asked with a partner token")
    missing = await world.client.get("/v1/queries/999", headers=ADMIN)
    assert missing.status_code == 404 and missing.json() == {"detail": "query 999 does not exist"}
    no_release = await world.client.post(
        "/v1/releases/999/queries", headers=world.partner_headers, json={"index": 0}
    )
    assert no_release.status_code == 404
    stranger = await world.client.post(
        "/v1/partners", headers=ADMIN, json={"name": "s", "release_ids": [], "max_queries": 2}
    )
    ungranted = await _query(world, 0, headers=bearer(stranger.json()["token"]))
    assert ungranted.status_code == 404  # the same answer as for a release that does not exist
    assert ungranted.json() == no_release.json() | {"detail": f"release {world.release['id']} does not exist"}


async def test_queries_are_listed_in_creation_order(world: World) -> None:
    ids = [(await _query(world, i, key=f"k{i}")).json()["id"] for i in (9, 4, 6)]
    listed = (
        await world.client.get(f"/v1/releases/{world.release['id']}/queries", headers=world.partner_headers)
    ).json()
    assert [q["id"] for q in listed["queries"]] == ids == sorted(ids)
    assert [q["index"] for q in listed["queries"]] == [9, 4, 6]
    assert [q["idempotency_key"] for q in listed["queries"]] == ["k9", "k4", "k6"]
    assert [q["y"] for q in listed["queries"]] == [float(world.y[i]) for i in (9, 4, 6)]


async def test_a_column_query_and_its_answer_are_committed_together(
    world: World, monkeypatch, settings
) -> None:
    """A ``column`` query is inserted, charged, answered and linked in one transaction: a failure before its
    commit leaves no query and no charge (no answer left, so nothing can be answered twice with fresh
    noise), and the retry under the same key is answered once and charged once."""

    def crash(*_args, **_kwargs):
        raise RuntimeError("power cut")

    monkeypatch.setattr(answers, "column_outcome", crash)  # the outcome, on either path (``answers``)
    response = await _query(world, 8, key="crashy")
    assert response.status_code == 500
    listed = (await world.client.get(f"/v1/releases/{world.release['id']}/queries", headers=ADMIN)).json()
    assert listed["queries"] == []  # question and answer are lost together: nothing was sent
    me = (await world.client.get("/v1/partners/me", headers=world.partner_headers)).json()
    assert me["queries_used"] == 0  # and nothing was charged
    monkeypatch.undo()
    retry = await _query(world, 8, key="crashy")
    assert retry.status_code == 201
    assert retry.json()["status"] == "complete" and retry.json()["y"] == float(world.y[8])
    listed = (await world.client.get(f"/v1/releases/{world.release['id']}/queries", headers=ADMIN)).json()
    assert [(q["id"], q["status"]) for q in listed["queries"]] == [(retry.json()["id"], "complete")]
    me = (await world.client.get("/v1/partners/me", headers=world.partner_headers)).json()
    assert me["queries_used"] == 1
    again = await _query(world, 8, key="crashy")
    assert again.json() == retry.json() and again.headers.get("Idempotent-Replayed") == "true"
    verify = await world.client.get(f"/v1/releases/{world.release['id']}/queries/verify", headers=ADMIN)
    assert verify.json()["ok"] and verify.json()["entries"] == 1


async def test_start_up_completes_queries_a_crash_left_pending(world: World, monkeypatch, settings) -> None:
    # a pending ``column`` query, committed and charged, as a version that committed the question before
    # evaluating it could leave behind when it crashed in between
    db = Database(settings.resolved_database_url())
    try:
        with db.session(write=True) as session:
            session.add(
                Query(
                    release_id=world.release["id"],
                    partner_id=world.partner["id"],
                    row_index=5,
                    status="pending",
                )
            )
            session.execute(
                update(Partner)
                .where(Partner.id == world.partner["id"])
                .values(queries_used=Partner.queries_used + 1)
            )
            session.commit()
    finally:
        db.dispose()
    restarted = create_app(settings)  # same database and data dir
    try:
        transport = httpx.ASGITransport(app=restarted)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            listed = (await c.get(f"/v1/releases/{world.release['id']}/queries", headers=ADMIN)).json()
            verify = (await c.get(f"/v1/releases/{world.release['id']}/queries/verify", headers=ADMIN)).json()
    finally:
        restarted.state.components.db.dispose()
    assert [(q["index"], q["status"], q["y"]) for q in listed["queries"]] == [
        (5, "complete", float(world.y[5]))
    ]
    assert verify["ok"] and verify["entries"] == 1


async def test_idempotency_key_too_long_is_422(world: World) -> None:
    response = await _query(world, 0, key="k" * 201)
    assert response.status_code == 422
    assert (
        "header field 'idempotency-key': String should have at most 200 characters"
        in response.json()["detail"]
    )


def test_a_kept_map_of_a_file_another_worker_deleted_is_dropped(tmp_path, monkeypatch) -> None:
    """Two workers' stores over one data dir: the map one keeps of a file the other deletes is dropped by
    its next load (at most every ``UNLINKED_CHECK_SECONDS``), so the unlinked file's space is freed."""
    from curator_service import storage

    first, second = storage.ArrayStore(tmp_path), storage.ArrayStore(tmp_path)
    saved = []
    for k in range(2):
        relpath = first.new_relpath("datasets", f"outcomes{k}")
        path = first.abspath(relpath)
        np.save(path, np.arange(5.0) + k)
        saved.append((relpath, hashlib.sha256(path.read_bytes()).hexdigest()))
    (gone, gone_sha), (kept, kept_sha) = saved
    mapped = first.load(gone, gone_sha)
    assert first.load(gone, gone_sha) is mapped and len(first._mapped) == 1
    second.delete(gone)  # another worker deletes the dataset
    monkeypatch.setattr(storage, "UNLINKED_CHECK_SECONDS", 0.0)
    first.load(kept, kept_sha)
    assert list(first._mapped) == [str(first.abspath(kept))]
    assert str(first.abspath(gone)) not in first._verified


async def test_an_outcome_file_altered_after_it_was_mapped_is_refused(world: World, app, data_dir) -> None:
    """The store hands out its kept map of the outcomes only while the file is the one it verified."""
    assert (await _query(world, 3)).status_code == 201
    store = app.state.components.store
    path = next((data_dir / "arrays" / "datasets").glob("*-outcomes.npy"))
    relpath, sha = path.relative_to(store.data_dir).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest()
    assert store.load(relpath, sha) is store.load(relpath, sha)  # kept, not mapped again
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    response = await _query(world, 4)
    assert response.status_code == 500
    assert response.json()["detail"].startswith("a stored array failed its sha256 integrity check")
