"""SIGKILL the curator during a release and during a query's evaluation, then start it again (issue 5,
item 2). Pause points (``POBO_CURATOR_FAULT_PAUSE``, testing only) hold the process at the worst moment:
Z written but its release row not committed; a query answered in memory (noise drawn, charges and chain link
made) but not committed, so not yet sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from shared.processes import ServiceProcess, curator_env, free_port
from tests.e2e.conftest import DEPLOYMENTS, Services, write_csv

pytestmark = pytest.mark.slow


@pytest.fixture(params=[1, 2], ids=["1-process", "2-workers"])
def workers(request: pytest.FixtureRequest) -> int:
    """uvicorn workers per service: a test's mark (``DEPLOYMENTS``) picks them with its database."""
    return int(request.param)


PAUSE = "release.after_file=120,query.before_commit=120"


def _restart_curator(services: Services, **extra: str) -> ServiceProcess:
    env = curator_env(services.tmp / "curator", services.admin_token, services.curator_db) | extra
    services.curator = ServiceProcess(
        "curator", port=free_port(), env=env, log_path=services.tmp / "curator.log", workers=services.workers
    )
    services.curator.start().wait_healthy()
    return services.curator


def _in_background(call: Callable[[], Any]) -> threading.Thread:
    def swallow() -> None:
        try:
            call()
        except httpx.HTTPError:
            pass  # the server is killed under this request

    thread = threading.Thread(target=swallow, daemon=True)
    thread.start()
    return thread


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@DEPLOYMENTS
def test_sigkill_during_release_and_during_query(services: Services) -> None:
    csv = services.tmp / "data.csv"
    outcomes = write_csv(csv)
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="crash", objective="objective")
        first = admin.create_release(dataset.id, epsilon=1.0, delta=1e-5)
        partner = admin.create_partner("p", release_ids=[first.id], max_queries=10)
    services.curator.stop()
    curator = _restart_curator(services, POBO_CURATOR_FAULT_PAUSE=PAUSE)
    z_dir = services.tmp / "curator" / "arrays" / "releases"
    auth = {"Authorization": f"Bearer {services.admin_token}"}

    # 1. a release killed after its Z file is written, before its row is committed
    url = f"{curator.url}/v1/datasets/{dataset.id}/releases"
    body = {"epsilon": 1.0, "delta": 1e-5}
    _in_background(lambda: httpx.post(url, json=body, headers=auth, timeout=300))
    _wait_for(lambda: len(list(z_dir.glob("*.npy"))) == 2, "the second Z file")
    curator.kill()
    # no pause points now; the sweep runs before any request is served (in the supervisor when there are
    # workers), and nothing else writes this data dir, so leftovers go at once
    curator = _restart_curator(services, POBO_CURATOR_ORPHAN_MIN_AGE_SECONDS="0")
    with services.admin() as admin:
        releases = admin.list_releases(dataset.id).data
        ledger = admin.ledger(dataset.id)
    assert [r.id for r in releases] == [first.id]  # no release row without its file ...
    assert len(list(z_dir.glob("*.npy"))) == 1  # ... and no file without its row (swept at start-up)
    statuses = sorted(e.status for e in ledger.entries)
    assert statuses == ["reserved", "spent"]  # charged exactly once for the attempt (reserved counts)
    assert ledger.epsilon_spent == pytest.approx(2.0)

    # 2. a query killed after it is answered in memory, before anything is committed: nothing is on record,
    # nothing was sent, so the retry is a new question, answered and charged once
    curator.stop()
    curator = _restart_curator(services, POBO_CURATOR_FAULT_PAUSE=PAUSE)
    log = services.tmp / "curator.log"
    qurl = f"{curator.url}/v1/releases/{first.id}/queries"
    headers = {"Authorization": f"Bearer {partner.token}", "Idempotency-Key": "study-crash:1"}
    _in_background(lambda: httpx.post(qurl, json={"index": 5}, headers=headers, timeout=300))
    _wait_for(
        lambda: "at query.before_commit" in log.read_text(errors="replace"), "the answered, uncommitted query"
    )
    with services.admin() as admin:
        assert admin.list_queries(first.id).queries == []  # not on record while uncommitted ...
        assert admin.get_partner(partner.id).queries_used == 0  # ... nor charged
    curator.kill()
    curator = _restart_curator(services)
    qurl = f"{curator.url}/v1/releases/{first.id}/queries"  # the restarted process listens elsewhere
    retry = httpx.post(qurl, json={"index": 5}, headers=headers, timeout=60)
    assert retry.status_code == 201, retry.text
    answer = retry.json()
    assert answer["status"] == "complete" and answer["y"] == pytest.approx(outcomes[5])
    assert retry.headers.get("Idempotent-Replayed") is None  # a new question: the killed one left nothing
    again = httpx.post(qurl, json={"index": 5}, headers=headers, timeout=60)
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json() == answer
    with services.admin() as admin:
        queries = admin.list_queries(first.id).queries
        used = admin.get_partner(partner.id).queries_used
        chain = admin.verify_queries(first.id)
    assert [(q.id, q.status) for q in queries] == [(answer["id"], "complete")]  # one query, answered once
    assert used == 1  # one charge
    assert chain.ok and chain.entries == 1
