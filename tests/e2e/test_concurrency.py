"""Issue 5, item 3: concurrent requests against real uvicorn processes (SQLite and PostgreSQL).

* 20 simultaneous releases against a budget that admits exactly k = 3: exactly 3 succeed (201), 17 are
  refused (409), the ledger holds 3 entries and exactly 3 Z files exist;
* 20 simultaneous queries with one Idempotency-Key: one query row, one charge, one answer for all;
* two simultaneous ``run`` calls on one study: one 202, one 409.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import TWO_WORKERS, Services, write_csv

pytestmark = pytest.mark.slow


@pytest.fixture(params=[1, 2], ids=["1-process", "2-workers"])
def workers(request: pytest.FixtureRequest) -> int:
    """uvicorn workers per service: a test's mark (``TWO_WORKERS``) picks them with its database."""
    return int(request.param)


def simultaneously(n: int, call: Callable[[httpx.Client], httpx.Response]) -> list[httpx.Response]:
    """``n`` threads, each with its own connection, released together by a barrier."""
    barrier = threading.Barrier(n)

    def one(_: int) -> httpx.Response:
        with httpx.Client(timeout=120) as client:
            barrier.wait()
            return call(client)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@TWO_WORKERS
def test_twenty_releases_exactly_k_succeed(services: Services) -> None:
    csv = services.tmp / "data.csv"
    write_csv(csv)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="race", objective="objective", epsilon_budget=3.0)
    url = f"{services.curator.url}/v1/datasets/{dataset.id}/releases"
    body = {"epsilon": 1.0, "delta": 1e-6}
    responses = simultaneously(20, lambda c: c.post(url, json=body, headers=_auth(services.admin_token)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] * 3 + [409] * 17, [(r.status_code, r.text[:120]) for r in responses]
    assert all("budget" in r.json()["detail"] for r in responses if r.status_code == 409)
    with services.admin() as admin:
        ledger = admin.ledger(dataset.id)
        releases = admin.list_releases(dataset.id).data
    assert len(ledger.entries) == 3 and all(e.status == "spent" for e in ledger.entries)
    assert ledger.epsilon_spent == pytest.approx(3.0)
    assert sorted(r.id for r in releases) == sorted(r.json()["id"] for r in responses if r.status_code == 201)
    z_files = list((services.tmp / "curator" / "arrays" / "releases").glob("*.npy"))
    assert len(z_files) == 3, z_files  # refused releases wrote nothing


@TWO_WORKERS
def test_twenty_queries_one_idempotency_key(services: Services) -> None:
    csv = services.tmp / "data.csv"
    write_csv(csv)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="q", objective="objective", noise_std=0.1)
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-5)
        partner = admin.create_partner("p", release_ids=[release.id], max_queries=5)
    url = f"{services.curator.url}/v1/releases/{release.id}/queries"
    headers = {**_auth(partner.token), "Idempotency-Key": "study-x:1"}
    responses = simultaneously(20, lambda c: c.post(url, json={"index": 7}, headers=headers))
    assert all(r.status_code in (200, 201) for r in responses), [r.text for r in responses]
    answers = {(r.json()["id"], r.json()["y"]) for r in responses}
    assert len(answers) == 1  # one answer (with its noise drawn once) for all twenty
    with services.admin() as admin:
        queries = admin.list_queries(release.id).queries
        used = admin.get_partner(partner.id).queries_used
    assert len(queries) == 1 and used == 1


@TWO_WORKERS
def test_two_runs_one_wins(services: Services) -> None:
    csv = services.tmp / "data.csv"
    write_csv(csv)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="r", objective="objective")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-5)
        partner = admin.create_partner("p", release_ids=[release.id], max_queries=50)
    with services.modeler_http() as http:
        study: dict[str, Any] = http.post(
            "/v1/studies",
            json={
                "curator_url": services.curator.url,
                "release_id": release.id,
                "curator_token": partner.token,
                "iterations": 10,
                "hyperparameters": {"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 1e-4},
            },
        ).json()
    url = f"{services.modeler.url}/v1/studies/{study['id']}/run"
    responses = simultaneously(2, lambda c: c.post(url, headers=_auth(services.modeler_token)))
    assert sorted(r.status_code for r in responses) == [202, 409], [r.text for r in responses]
