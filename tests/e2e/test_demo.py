"""``pobo demo`` end to end (both services as real processes), shortened, and its exact random baseline."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import httpx
import numpy as np
import pytest

from shared.bo.strategies import GPUCB
from shared.bo.strategies.gp_ucb import BETA_SCALE_DEFAULT
from shared.privacy.gaussian import gaussian_release
from shared.tools.data.make_demo_dataset import DP_UNITS, FEATURES, generate
from shared.tools.demo import expected_random_regret, progress_figure, run_demo, write_progress_plot

pytestmark = pytest.mark.slow


def test_expected_random_regret_is_exact() -> None:
    y = np.array([3.0, 1.0, 4.0, 1.5, 9.0, 2.6])
    for k in (1, 2, 3, 6):
        brute = np.mean([y.max() - max(y[list(c)]) for c in combinations(range(y.size), k)])
        assert expected_random_regret(y, k) == pytest.approx(brute)


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    """The whole loop on real processes: plumbing only. Its outcome depends on the curator's noise, drawn
    from OS entropy (no seed reaches a release), so whether this one run beats random is not asserted here
    (issue 12, item 11: that made this test flaky); ``test_the_demo_pipeline_beats_random`` asserts it on
    the same data and pipeline with fixed seeds."""
    seen: dict[str, int] = {}

    def consoles_are_up(urls: dict[str, str]) -> None:  # `--keep-running`: the services wait for Ctrl-C
        for name, url in urls.items():
            seen[name] = httpx.get(f"{url}/console/sign-in", timeout=10).status_code
        raise KeyboardInterrupt

    result = run_demo(output=tmp_path / "out", iterations=30, keep_running=True, wait_forever=consoles_are_up)
    assert seen == {"curator": 200, "modeler": 200}
    assert result["iterations"] == 30
    assert result["audit_ok"] and result["reconciled"]
    assert 0 <= result["regret"] <= result["true_best_y"] - min(result["outcomes_seen"])
    assert result["mechanism"] == "gaussian" and result["formal_guarantee"] is True
    assert result["r"] == 7 and result["noise_std"] == pytest.approx(3.7306, abs=1e-3)  # all 7 features
    assert "age_years by 0.4" in result["protected"]
    assert result["epsilon_spent"] == pytest.approx(1.0)
    assert result["clean_shutdown"]  # both services stopped on SIGTERM, without needing SIGKILL
    assert (tmp_path / "out" / "plot.png").read_bytes()[:4] == b"\x89PNG"
    header = (tmp_path / "out" / "audit.csv").read_text().splitlines()[0]
    assert header.startswith("seq,at,round,request,kind,index,y")
    assert result["runtime_s"] < 120


def test_the_demo_pipeline_beats_random() -> None:
    """The demo's pipeline (declared scales, Gaussian release at epsilon = 1, delta = 1e-5, GP-UCB with
    MLE at gp-ucb's default beta_scale, 1 random initial row, 30 queries) on its data, with fixed seeds:
    deterministic, so it cannot flake. Over 40 seeds the regret stayed in [0, 1.58] against 12.9 expected
    for 30 random rows (before issue 32's round 2, at the theorem's beta and the old fit: [1.2, 3.5])."""
    _, X, y = generate()
    Xs = X / np.array([DP_UNITS.get(f, 1.0) for f in FEATURES])
    random_regret = expected_random_regret(y, 30)
    regrets = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        Z = gaussian_release(Xs, epsilon=1.0, delta=1e-5, rng=rng).Z
        strategy = GPUCB(Z, hyperparameters="mle", beta_scale=BETA_SCALE_DEFAULT)  # the demo's study
        first = int(rng.integers(y.size))
        strategy.observe(first, float(y[first]))
        best = y[first]
        for _ in range(29):
            i = strategy.suggest().index
            strategy.observe(i, float(y[i]))
            best = max(best, y[i])
        regrets.append(y.max() - best)
    assert max(regrets) < random_regret / 2, (regrets, random_regret)


def test_the_demo_plot_names_the_objective_and_shows_the_true_best(tmp_path: Path) -> None:
    """Issue 12, item 10."""
    fig = progress_figure([3.0, 5.0, 4.0, 7.5], ylabel="recovery_score", true_best=9.0)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "recovery_score"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["true best (9)"].get_ydata()) == [9.0, 9.0]
    assert list(lines["best found so far"].get_ydata()) == [3.0, 5.0, 5.0, 7.5]
    write_progress_plot([1.0, 2.0], tmp_path / "p.png", ylabel="y")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
