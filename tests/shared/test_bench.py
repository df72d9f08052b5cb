"""Smoke tests of the benchmarks' plumbing (their numbers are benchmarks, not tests)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from shared.privacy.gaussian import calibrate
from shared.privacy.po_gp_ucb import centred_sigma_min, largest_feasible_r, omega
from shared.tools.bench import synthetic
from shared.tools.cli import app


def test_grid_is_scaled_to_the_papers_thresholds():
    X, scale = synthetic.grid_inputs()
    assert X.shape == (10_000, 2)
    assert math.isclose(centred_sigma_min(X), synthetic.SIGMA_TARGET, rel_tol=1e-9)
    # The paper: among each table's r values, the largest feasible is 10, 15, 20 at e^1.1, e^1.3, e^1.5.
    for log_eps, r_star in [(1.1, 10), (1.3, 15), (1.5, 20)]:
        feasible = [
            r for r in synthetic.SWEEPS[log_eps] if omega(r, math.exp(log_eps), synthetic.DELTA) <= 3800
        ]
        assert max(feasible) == r_star
        assert (
            r_star
            <= largest_feasible_r(X, math.exp(log_eps), synthetic.DELTA)
            < min(r for r in synthetic.SWEEPS[log_eps] if r > r_star)
        )
    assert math.isclose(np.ptp(X[:, 0]) / scale, synthetic.SPAN)


def test_sampled_f_is_standardised_and_has_the_grid_covariance():
    L1 = synthetic._grid_factor()
    g = np.linspace(0.0, synthetic.SPAN, synthetic.GRID)
    K1 = np.exp(-0.5 * (g[:, None] - g[None, :]) ** 2 / synthetic.LENGTHSCALE**2)
    np.testing.assert_allclose(L1 @ L1.T, K1, atol=1e-8)
    f = synthetic.sample_f(np.random.default_rng(3), L1)
    assert f.shape == (10_000,)
    assert abs(f.mean()) < 1e-12 and abs(f.std() - 1.0) < 1e-12


def test_quick_benchmark_json_shape(tmp_path):
    report = synthetic.run_benchmark(1, quick=True, seed=1, workers=1)
    assert report["settings"]["T"] == synthetic.T
    algos = {(r["algorithm"], r["hyperparameters"]) for r in report["results"]}
    assert algos == {(a, m) for a in ("gp-ucb", "po-gp-ucb", "gaussian") for m in ("transfer", "mle")}
    for item in report["results"]:
        assert len(item["simple_regret_mean"]) == synthetic.T == len(item["simple_regret_se"])
        curve = np.array(item["simple_regret_mean"])
        assert (curve >= 0).all() and (np.diff(curve) <= 1e-12).all()  # simple regret never increases
        if item["algorithm"] == "po-gp-ucb":
            expected_lift = item["log_epsilon"] < 1.1 - 1e-9  # at r = 10 only e^1.1 is feasible
            assert item["lifted"] is expected_lift and item["formal_guarantee"] is False
        if item["algorithm"] == "gaussian":
            assert item["formal_guarantee"] is True and item["r"] is None
            assert item["noise_std"] == pytest.approx(
                calibrate(math.exp(item["log_epsilon"]), synthetic.DELTA, 2).sigma
            )
    synthetic.plot(report, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = synthetic.markdown(report)
    assert "Fig. 2a" in md and "| PO-GP-UCB | e^1.1 | False |" in md
    assert "| Gaussian | e^1.1 | 1.39 |" in md


def test_cli_bench_perf_small(tmp_path):
    out = tmp_path / "perf.json"
    result = CliRunner().invoke(
        app,
        ["bench", "perf", "--n-release", "20000", "--n-gp", "2000", "--n-floor", "3000", "--n-large", "4000"]
        + ["--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["release"]["max_relative_difference"] < 1e-8
    assert report["gp_ucb_loop"]["same_choices"] == report["gp_ucb_loop"]["T"]
    assert report["release"]["speedup"] > 0 and report["gp_ucb_loop"]["speedup"] > 0
    floor = report["gp_loop_floor"]  # the floor: A's t x n rows at every step t, over the measured rate
    assert floor["n"] == 3000 and floor["T"] == 100 and floor["repeats"] == 3
    assert floor["floor_bytes"] == 8 * 3000 * 100 * 101 / 2
    assert floor["full_floor_bytes"] == floor["floor_bytes"] + 8 * 3000 * 15 * 101  # + Z for each kernel row
    assert floor["floor_seconds"] == pytest.approx(floor["floor_bytes"] / floor["bandwidth"]["bytes_per_s"])
    assert floor["bandwidth"]["bytes_per_s"] >= floor["bandwidth"]["gemv_bytes_per_s"] > 0
    for dtype in ("float64", "float32"):
        run = floor[dtype]
        assert run["seconds"] == min(run["all_seconds"]) and run["first_seconds"] == run["all_seconds"][0]
        assert run["ratio_to_floor"] == pytest.approx(run["seconds"] / floor["floor_seconds"])
        assert run["same_choices_across_repeats"] is True
    assert floor["float64"]["same_choices_as_reference"] == 100  # exact: the textbook loop's choices
    versus = floor["float32"]["versus_float64"]
    assert 0 < versus["max_abs_ucb_difference"] < 1e-4 and versus["same_choices"] == 100
    assert versus["within_bound"] is True  # the float32 GP's a-posteriori bound held at every step
    assert versus["max_abs_ucb_difference"] <= versus["ucb_difference_bound"] < 1.0
    assert 0 < versus["ucb_difference_bound_at_choice"] <= versus["ucb_difference_bound"]
    large = report["gp_loop_large"]  # factor memory-mapped
    assert large["n"] == 4000 and large["T"] == 50 and large["memory_mapped"] is True
    assert large["seconds_per_step"] == pytest.approx(large["seconds"] / 50)
    gaussian = report["gaussian_release"]
    assert gaussian["n"] == 20000 and gaussian["seconds"] > 0 and gaussian["opendp_seconds_per_entry"] > 0


@pytest.mark.slow
def test_cli_bench_load_smoke(tmp_path):
    """A short `pobo bench load` (the full 20 x 50 run is a benchmark, not a test): both services under
    uvicorn with 2 workers and as single processes, on SQLite (the PostgreSQL paths it drives are the
    services', tested on PostgreSQL elsewhere; running them here too doubled this test's time)."""
    out = tmp_path / "load.json"
    args = ["bench", "load", "--studies", "3", "--iterations", "4", "--workers", "2", "--n", "300"]
    args += ["--json", str(out), "--database", "sqlite"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["ok"] is True
    assert {(r["database"], r["workers"]) for r in report["results"]} == {("sqlite", 1), ("sqlite", 2)}
    for r in report["results"]:
        assert r["errors"] == 0 and r["iterations_completed"] == 12
        checks = r["checks"]
        assert checks["studies_reconciled"] == 3 and checks["queries_charged"] == 12
        assert r["processes"]["curator"] >= r["workers"] + (r["workers"] > 1)  # supervisor + workers
        assert r["processes"]["modeler"] >= r["workers"] + (r["workers"] > 1)
        assert r["peak_rss_mib"]["curator"] > 10 and r["peak_rss_mib"]["modeler"] > 10
        assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p99"]
        assert r["throughput_per_s"] > 0
        if r["workers"] == 2:
            assert r["vs_baseline"]["throughput_ratio"] > 0
    assert "it/s" in result.output and "p99 ms" in result.output


def test_cli_bench_synthetic_strategies_small(tmp_path):
    """`pobo bench synthetic --strategies`: both regret curves for each registry strategy; gp-bucb spends the
    Q queries in ceil(Q / k) rounds where gp-ucb and random search spend Q."""
    out, png = tmp_path / "strategies.json", tmp_path / "strategies.png"
    args = ["bench", "synthetic", "--strategies", "gp-ucb,gp-bucb,random", "--batch-size", "3"]
    args += ["--queries", "12", "--runs", "2", "--quick", "--workers", "1", "--seed", "1"]
    result = CliRunner().invoke(app, [*args, "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["settings"]["batch_size"] == 3 and report["settings"]["queries"] == 12
    items = {item["strategy"]: item for item in report["strategies"]}
    assert set(items) == {"gp-ucb", "gp-bucb", "random"} and len(report["strategies"]) == 3
    expected_rounds = {"gp-ucb": 12, "gp-bucb": math.ceil(12 / 3), "random": 12}
    for name, item in items.items():
        assert item["runs"] == 2 and item["rounds"] == item["rounds_min"] == expected_rounds[name]
        by_query, by_round = item["regret_by_query"], item["regret_by_round"]
        assert len(by_query["mean"]) == len(by_query["se"]) == 12
        assert len(by_round["mean"]) == len(by_round["se"]) == expected_rounds[name]
        q = np.array(by_query["mean"])
        assert (q >= 0).all() and (np.diff(q) <= 1e-12).all()
        # After the last round every query has been made: the two curves end at the same regret.
        assert by_round["mean"][-1] == pytest.approx(q[-1])
    # gp-bucb's regret after round j is its regret after query 3 j.
    bucb = items["gp-bucb"]
    np.testing.assert_allclose(
        bucb["regret_by_round"]["mean"], np.array(bucb["regret_by_query"]["mean"])[2::3]
    )
    assert items["gp-bucb"]["params"] == {"batch_size": 3} and items["random"]["inputs"] is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gp-bucb (grid, mle)" in out.with_suffix(".md").read_text()
    assert "Simple regret" in result.output and "gp-bucb" in result.output


def test_cli_bench_synthetic_rejects_an_unknown_strategy():
    result = CliRunner().invoke(app, ["bench", "synthetic", "--strategies", "gp-ucb,nope", "--runs", "1"])
    assert result.exit_code == 2
    assert "unknown strategy ['nope']" in result.output


def test_cli_bench_steps_small(tmp_path):
    """`pobo bench steps`: every registry strategy through its round interface, DP-GIBO's two sides and the
    FTS-DE agent step, each with its time per query and cost formula."""
    from shared.bo.strategies.base import REGISTRY

    out = tmp_path / "steps.json"
    args = ["bench", "steps", "--n", "600", "--queries", "6", "--gibo-dimension", "2", "--gibo-steps", "2"]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    row_strategies = {name for name, cls in REGISTRY.items() if cls.runs_on == "release"}
    assert set(report["rows"]) == row_strategies  # every row strategy of the registry is timed
    for row in report["rows"].values():
        assert row["queries"] == 6 and 0 < row["ms_per_query_tail"] <= row["ms_per_query_max"]
        assert row["formula"].startswith("O(")
    assert report["rows"]["gp-bucb"]["rounds"] == 2 and report["rows"]["moma-gp-ucb"]["rounds"] < 6
    gibo, agent = report["dp_gibo"], report["fts_agent"]
    assert gibo["d"] == 2 and gibo["steps"] == 2 and gibo["plan_ms_mean"] > 0 and gibo["oracle_ms_mean"] > 0
    assert agent["n_candidates"] == 1024 and agent["choose_ms_mean"] > 0
    assert "| gp-ucb |" in result.output or "gp-ucb" in result.output
