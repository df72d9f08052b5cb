"""``pobo demo`` end to end (both services as real processes), shortened, and its exact random baseline."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from shared.demo import expected_random_regret, run_demo

pytestmark = pytest.mark.slow


def test_expected_random_regret_is_exact() -> None:
    y = np.array([3.0, 1.0, 4.0, 1.5, 9.0, 2.6])
    for k in (1, 2, 3, 6):
        brute = np.mean([y.max() - max(y[list(c)]) for c in combinations(range(y.size), k)])
        assert expected_random_regret(y, k) == pytest.approx(brute)


def test_demo_runs_and_beats_random(tmp_path: Path) -> None:
    result = run_demo(output=tmp_path / "out", iterations=30)
    assert result["iterations"] == 30
    assert result["audit_ok"] and result["reconciled"]
    assert result["regret"] < result["random_regret"]
    assert result["mechanism"] == "gaussian" and result["formal_guarantee"] is True
    assert result["r"] == 7 and result["noise_std"] == pytest.approx(3.7306, abs=1e-3)  # all 7 features
    assert "age_years by 0.4" in result["protected"]
    assert result["epsilon_spent"] == pytest.approx(1.0)
    assert result["clean_shutdown"]  # both services stopped on SIGTERM, without needing SIGKILL
    assert (tmp_path / "out" / "plot.png").read_bytes()[:4] == b"\x89PNG"
    header = (tmp_path / "out" / "audit.csv").read_text().splitlines()[0]
    assert header.startswith("seq,at,iteration,index,y")
    assert result["runtime_s"] < 120
