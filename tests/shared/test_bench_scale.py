"""Issue 36, item 5: ``pobo bench scale`` runs the GP-UCB loop on a LocalCluster and locally in one run, with
the same choices bit for bit, and predicts a large n from what it measured (``shared.tools.bench.scale``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared.tools.cli import app

pytest.importorskip("distributed", reason="the dask extra (pobo[dask]) is part of pobo[test]")

pytestmark = pytest.mark.slow


def test_bench_scale_measures_both_loops_with_the_same_bits_and_predicts(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    args = ["bench", "scale", "--n", "3000", "--steps", "3", "--workers", "2", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert run["n"] == 3000 and run["steps"] == 3 and run["partitions"] == 2
    assert run["same_choices"] is True and run["same_bits"] is True
    assert run["local_step_s"] > 0 and run["dask_step_s"] > 0
    assert run["dask_over_local"] == pytest.approx(run["dask_step_s"] / run["local_step_s"])
    assert len(run["worker_rss_bytes"]["after"]) == 2
    prediction = report["prediction"]
    assert prediction["n"] == 10**8 and prediction["inputs"]["measured_at_n"] == 3000
    # the model: every step's time is positive and the whole run is the sum of its steps' mean
    assert prediction["mean_step_s"] > 0
    assert prediction["total_s"] == pytest.approx(prediction["mean_step_s"] * prediction["steps"])
    assert "same bits" in result.output
