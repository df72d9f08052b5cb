"""The floor of ``pobo bench service`` (issue 18): its plumbing, not its numbers."""

from __future__ import annotations

import contextlib
import math
import sqlite3

import pytest
from fastapi.testclient import TestClient

from shared.tools.bench import service
from shared.tools.bench.floor import back_app, measure_floor, open_database


def test_floor_times_requests_and_every_one_is_on_disk() -> None:
    result = measure_floor(requests=5, warmup=2)
    for key in ("p50", "p90", "mean"):
        assert math.isfinite(result[key]) and result[key] > 0
    assert result["p50"] <= result["p90"]
    assert len(result["samples_ms"]) == result["requests"] == 5
    assert result["rows"] == 5 + 2  # one durable row per request, warm-up included


def test_back_uses_pobos_durability_settings(tmp_path) -> None:
    with contextlib.closing(open_database(tmp_path / "a.sqlite")) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with TestClient(back_app(tmp_path / "b.sqlite")) as client:
        answers = [client.post("/query", json={"x": x}).json() for x in (1, 2, 3)]
    assert [a["id"] for a in answers] == [1, 2, 3]
    assert answers[0]["y"] == math.sin(1)
    with contextlib.closing(sqlite3.connect(tmp_path / "b.sqlite")) as conn:
        assert conn.execute("SELECT x FROM answers ORDER BY id").fetchall() == [(1,), (2,), (3,)]


@pytest.mark.slow
def test_bench_service_times_the_floor_between_pobos_steps() -> None:
    result = service.measure(
        n=200, d=3, r=3, iterations=4, studies=1, floor_per_step=2, floor_warmup=2, floor_sequential=3
    )
    steps = result["setup"]["steps"]
    assert steps == 3 and result["setup"]["floor_requests"] == 2 * steps  # two floor requests per step
    assert result["setup"]["floor_sequential_requests"] == 3
    for floor in (result["floor_ms"], result["floor_sequential_ms"]):
        assert 0 < floor["p50"] <= floor["p95"]
    overhead = result["summary_ms"]["overhead"]["p50"]
    assert result["overhead_ratio_to_floor"] == pytest.approx(overhead / result["floor_ms"]["p50"])
    assert result["overhead_ratio_to_sequential_floor"] == pytest.approx(
        overhead / result["floor_sequential_ms"]["p50"]
    )
    assert result["pass_ratio_to_floor"] == (result["overhead_ratio_to_floor"] <= 2.0)
