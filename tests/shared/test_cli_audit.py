"""``pobo audit privacy``: the table, the JSON rows (with ``control`` and ``caught``), and the exit status."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from shared.tools.cli import app


def _run(tmp_path: Path, *args: str) -> tuple[int, str, list[dict[str, object]]]:
    out = tmp_path / "audit.json"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["audit", "privacy", "--json", str(out), *args])
    rows = json.loads(out.read_text()) if out.exists() else []
    return result.exit_code, result.output, rows


def test_audit_privacy_writes_rows_and_passes_when_controls_are_caught(tmp_path: Path) -> None:
    code, output, rows = _run(
        tmp_path,
        *("--trials", "1000", "--calibration-trials", "1000"),
        *("--mechanism", "dp-gibo gradient oracle", "--mechanism", "po-gp-ucb (lift=always)"),
    )
    assert code == 0, output  # Algorithm 1 has no claim to break: a finding, not a failure
    assert "unbounded" in output and "within claim" in output and "caught" in output
    assert [(r["mechanism"], r["control"], r["test"]) for r in rows] == [
        ("dp-gibo gradient oracle", None, "likelihood ratio"),
        ("dp-gibo gradient oracle", None, "precision"),
        ("dp-gibo gradient oracle", "sensitivity x1.5", "likelihood ratio"),
        ("dp-gibo gradient oracle", "float addition", "precision"),
        ("po-gp-ucb (lift=always)", None, "column space"),
    ]
    for row in rows:
        assert {
            "mechanism",
            "claimed_epsilon",
            "delta",
            "trials",
            "empirical_epsilon_lower_bound",
            "control",
            "caught",
        } <= set(row)
        assert row["trials"] == 1000
        assert row["caught"] is (None if row["control"] is None else True)
    oracle, alg1 = rows[0], rows[-1]
    assert oracle["within_claim"] and oracle["formal_guarantee"] and oracle["claimed_epsilon"] > 4.3
    assert alg1["perfect_distinguisher"] and not alg1["within_claim"] and not alg1["formal_guarantee"]


def test_a_control_the_audit_cannot_catch_fails_the_run(tmp_path: Path) -> None:
    # 1000 runs measure the release's mu (0.27) too coarsely to tell a 1.5x sensitivity error apart
    code, output, rows = _run(tmp_path, "--trials", "1000", "--mechanism", "gaussian")
    assert code == 1, output
    assert "NOT CAUGHT" in output and "control 'sensitivity x1.5' of gaussian" in output
    (missed,) = [r for r in rows if r["control"] == "sensitivity x1.5"]
    assert missed["caught"] is False
    # without the controls the same run passes: the release itself is within its claim
    code, output, rows = _run(tmp_path, "--trials", "1000", "--mechanism", "gaussian", "--no-controls")
    assert code == 0, output
    assert rows and all(r["control"] is None for r in rows)


def test_unknown_mechanism_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["audit", "privacy", "--mechanism", "laplace"])
    assert result.exit_code == 2 and "unknown mechanism" in result.output


def test_control_trials_sets_the_runs_of_the_controls_rows_only(tmp_path: Path) -> None:
    _, output, rows = _run(
        tmp_path, *("--trials", "300", "--control-trials", "200", "--mechanism", "dp-fts-de round (q=1)")
    )
    assert [(r["control"], r["trials"]) for r in rows] == [
        (None, 300),
        (None, 300),
        ("sensitivity x1.5", 200),
        ("float addition", 200),
    ], output
