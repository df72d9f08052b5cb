"""Issue 12, item 4: a study survives its curator's outage. Transient failures (connection refused, lost
answers, 502/503/504, 429 with Retry-After) make it wait, visibly (``waiting_for_curator``, the last error,
the next attempt's time), and continue by itself; no iteration is charged twice; permanent errors fail it
with a message that says what to do."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from modeler_service.config import Settings
from modeler_service.retry import delay_seconds
from tests.modeler_service.conftest import AUTH, TOKEN, make_app, study_body
from tests.modeler_service.fake_curator import FakeCurator


@pytest.fixture
def fast(tmp_path: Path, database_url: str) -> Settings:
    """Fast retries (50 ms, doubling up to 200 ms), no client-level retries."""
    return Settings(
        data_dir=tmp_path / "modeler",
        database_url=database_url,
        token=TOKEN,
        poll_seconds=0.5,
        curator_retries=0,
        curator_retry_base_seconds=0.05,
        curator_retry_max_seconds=0.2,
    )


def _wait(client: TestClient, study_id: str, predicate: Any, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        study = client.get(f"/v1/studies/{study_id}").json()
        if predicate(study):
            return study
        time.sleep(0.01)
    raise AssertionError(f"timed out; last state {study}")


def test_a_curator_outage_pauses_the_run_visibly_and_it_resumes_by_itself(
    fast: Settings, curator: FakeCurator
) -> None:
    with TestClient(make_app(fast, curator), headers=AUTH) as client:
        study = client.post("/v1/studies", json=study_body(iterations=12)).json()
        curator.down = True
        assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
        waiting = _wait(
            client, study["id"], lambda s: s["status"] == "waiting_for_curator" and s["retry_attempts"] >= 2
        )
        assert (
            "the curator could not be reached" in waiting["error"]
            and "Connection refused" in waiting["error"]
        )
        assert waiting["retry_at"] is not None
        assert client.post(f"/v1/studies/{study['id']}/run").status_code == 409  # still owned by its runner
        curator.down = False
        done = _wait(client, study["id"], lambda s: s["status"] in ("done", "failed"))
        assert done["status"] == "done", done["error"]
        assert done["iterations_done"] == 12 and done["error"] is None and done["retry_at"] is None
    assert curator.charged() == 12  # every iteration charged exactly once


def test_lost_answers_and_overloaded_curator_never_charge_twice(fast: Settings, curator: FakeCurator) -> None:
    curator.lose_answers = 3  # charged at the curator, but the modeler never hears back
    with TestClient(make_app(fast, curator), headers=AUTH) as client:
        study = client.post("/v1/studies", json=study_body(iterations=8)).json()
        curator.fail_next = [503, 502, 504]
        assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
        done = _wait(client, study["id"], lambda s: s["status"] in ("done", "failed"))
        assert done["status"] == "done", done["error"]
        audit = client.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
    assert curator.charged() == 8 and len(audit) == 8
    assert [e["curator_query_id"] for e in audit] == list(range(1, 9))  # the lost answers were replayed


def test_a_throttled_modeler_waits_as_long_as_the_curator_asks(fast: Settings, curator: FakeCurator) -> None:
    curator.retry_after = "1"
    with TestClient(make_app(fast, curator), headers=AUTH) as client:
        study = client.post("/v1/studies", json=study_body(iterations=3)).json()
        curator.fail_next = [429]
        started = time.monotonic()
        assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
        done = _wait(client, study["id"], lambda s: s["status"] in ("done", "failed"))
        assert done["status"] == "done", done["error"]
        assert time.monotonic() - started >= 1.0  # Retry-After beats the 50 ms backoff


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ({"fail_next": [401]}, "the curator refused the study's partner token"),
        ({"fail_next": [404]}, "not found at the curator"),
        ({"max_queries": 3}, "query quota"),
        ({"fail_next": [429]}, "query quota"),  # a 429 without Retry-After: the quota, not a throttle
    ],
)
def test_permanent_errors_fail_the_study_with_an_actionable_message(
    fast: Settings, setup: dict[str, Any], expected: str
) -> None:
    curator = FakeCurator()
    with TestClient(make_app(fast, curator), headers=AUTH) as client:
        study = client.post("/v1/studies", json=study_body(iterations=6)).json()
        curator.max_queries = setup.get("max_queries", 10_000)  # lowered after the study was created
        curator.fail_next = list(setup.get("fail_next", []))
        assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
        failed = _wait(client, study["id"], lambda s: s["status"] in ("done", "failed"))
    assert failed["status"] == "failed"
    assert expected in failed["error"]
    assert "no answer" not in failed["error"]


def test_the_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 10.0), (200, 10.0)]:
        waits = [delay_seconds(attempt, base=1.0, cap=10.0) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert max(waits) - min(waits) > ceiling / 10  # jittered, not a fixed delay
    assert delay_seconds(1, base=1.0, cap=10.0, retry_after=30.0) == 30.0
