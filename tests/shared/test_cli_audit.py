"""``pobo audit privacy``: the table, the JSON rows, and the exit status."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from shared.cli import app


def test_audit_privacy_writes_rows_and_passes_for_sound_mechanisms(tmp_path: Path) -> None:
    out = tmp_path / "audit.json"
    args = ["audit", "privacy", "--trials", "3000", "--calibration-trials", "1000", "--json", str(out)]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, [*args, "--mechanism", "gaussian", "--mechanism", "po-gp-ucb (lift=always)"]
    )
    assert result.exit_code == 0, result.output  # Algorithm 1 has no claim to break: a finding, not a failure
    assert "unbounded" in result.output and "within claim" in result.output
    rows = json.loads(out.read_text())
    assert [r["mechanism"] for r in rows] == ["gaussian", "po-gp-ucb (lift=always)"]
    for row in rows:
        assert {"mechanism", "claimed_epsilon", "delta", "trials", "empirical_epsilon_lower_bound"} <= set(
            row
        )
        assert row["trials"] == 3000
    gaussian, alg1 = rows
    assert (
        gaussian["within_claim"] and gaussian["empirical_epsilon_lower_bound"] <= gaussian["claimed_epsilon"]
    )
    assert alg1["perfect_distinguisher"] and not alg1["within_claim"]


def test_audit_privacy_runs_the_dp_gibo_oracle(tmp_path: Path) -> None:
    # shared.privacy may not import shared.bo: the command merges shared.bo.gibo.audit.GIBO_AUDITS in
    out = tmp_path / "audit.json"
    args = ["audit", "privacy", "--trials", "100", "--calibration-trials", "100", "--json", str(out)]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*args, "--mechanism", "dp-gibo gradient oracle"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())
    assert row["mechanism"] == "dp-gibo gradient oracle" and row["formal_guarantee"]
    # 100 runs can show at most ln(100 / 3.7) ~ 3.3 < 4.377, the claim of one 1-GDP step at delta 1e-5
    assert row["within_claim"] and row["claimed_epsilon"] > 4.3


def test_unknown_mechanism_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["audit", "privacy", "--mechanism", "laplace"])
    assert result.exit_code == 2 and "unknown mechanism" in result.output
