"""The answered-query hot path (``services/answers.py``): a raw ``column`` query answered in Core statements
writes what the ORM path (``queries.create_query``) writes, and every other case steps aside to it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select

from curator_service.api.routes import queries as query_routes
from curator_service.models import AccessLog, OutputCharge, Query
from curator_service.services import answers
from tests.curator_service.conftest import ADMIN, World, bearer

pytestmark = pytest.mark.anyio


class Spy:
    """Counts the requests that took the ORM path (which authenticates in its own session first)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = query_routes.partner_in_session

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(query_routes, "partner_in_session", counted)


def _rows(app: Any, table: Any) -> list[dict[str, Any]]:
    with app.state.components.db.session(write=False) as session:
        return [dict(r._mapping) for r in session.execute(select(table.__table__).order_by(table.id))]


async def _ask(world: World, index: int, key: str | None = None, token: str | None = None) -> httpx.Response:
    headers = bearer(token or world.partner["token"]) | ({"Idempotency-Key": key} if key else {})
    url = f"/v1/releases/{world.release['id']}/queries"
    return await world.client.post(url, headers=headers, json={"index": index})


async def test_the_core_path_writes_what_the_orm_path_writes(
    world: World, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = Spy(monkeypatch)
    fast = await _ask(world, 1, key="a")
    assert fast.status_code == 201 and spy.calls == 0  # answered in Core
    with monkeypatch.context() as m:
        m.setattr(answers, "answer_at_once", lambda *args, **kwargs: None)  # force the ORM path
        slow = await _ask(world, 2, key="b")
    assert slow.status_code == 201 and spy.calls == 1
    a, b = fast.json(), slow.json()
    assert set(a) == set(b) and a["y"] == float(world.y[1]) and b["y"] == float(world.y[2])
    assert [(q["status"], q["cached"], q["charged_epsilon"]) for q in (a, b)] == [
        ("complete", None, None)  # a partner is never told whether an answer was cached
    ] * 2
    queries = _rows(app, Query)
    assert [q["id"] for q in queries] == [a["id"], b["id"]]
    # the same columns set, the same way: only the row's own values differ
    own = {
        "id",
        "row_index",
        "y",
        "idempotency_key",
        "created_at",
        "completed_at",
        "chain_seq",
        "hash",
        "prev_hash",
    }
    assert {k: v for k, v in queries[0].items() if k not in own} == {
        k: v for k, v in queries[1].items() if k not in own
    }
    assert [q["chain_seq"] for q in queries] == [1, 2] and queries[1]["prev_hash"] == queries[0]["hash"]
    assert all(q[k] is not None for q in queries for k in ("created_at", "completed_at", "hash", "prev_hash"))
    charges = _rows(app, OutputCharge)
    assert [(c["query_id"], c["row_index"], c["epsilon"]) for c in charges] == [
        (a["id"], 1, None),
        (b["id"], 2, None),
    ]
    assert charges[0]["population_id"] == charges[1]["population_id"] and charges[0]["created_at"] is not None
    entries = [e for e in _rows(app, AccessLog) if e["path"].endswith("/queries")]
    assert [(e["actor"], e["status_code"]) for e in entries] == [(f"partner:{world.partner['id']}", 201)] * 2
    verify = await world.client.get(f"/v1/releases/{world.release['id']}/queries/verify", headers=ADMIN)
    assert verify.json()["ok"] and verify.json()["entries"] == 2
    me = (await world.client.get("/v1/partners/me", headers=world.partner_headers)).json()
    assert me["queries_used"] == 2


async def test_every_other_case_steps_aside_with_nothing_written(
    world: World, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await _ask(world, 3, key="k")
    spy = Spy(monkeypatch)
    cases = [
        ({"index": 3, "key": "k"}, 201),  # a replay (its insert fails the unique key: rolled back)
        ({"index": 4, "key": "k"}, 409),  # the key of another query
        ({"index": 10_000}, 422),  # out of range
        ({"index": 1, "token": "not-a-token"}, 401),
        ({"index": 1, "token": ADMIN["Authorization"].split()[1]}, 403),
    ]
    for n, (args, status) in enumerate(cases, start=1):
        response = await _ask(world, **args)  # type: ignore[arg-type]
        assert response.status_code == status and spy.calls == n, (args, response.text)
    assert (await _ask(world, 3, key="k")).json() == first.json()
    for index in range(4):  # the rest of the quota (5), then 429
        assert (await _ask(world, 10 + index)).status_code == 201
    calls = spy.calls
    assert (await _ask(world, 20)).status_code == 429 and spy.calls == calls + 1
    assert len(_rows(app, Query)) == 5 and len(_rows(app, OutputCharge)) == 5  # nothing half-written
