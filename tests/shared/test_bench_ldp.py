"""``pobo bench ldp``: the problem generators (LDP-BO paper, Section 5.1) and the harness's plumbing, on a
tiny run (its numbers are a benchmark, not a test)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from rich.console import Console
from scipy import stats
from typer.testing import CliRunner

from shared.tools.bench import ldp, ldp_problems
from shared.tools.cli import app


def tiny_cases(settings: tuple[str, ...]) -> list[ldp.Case]:
    """The paper's strategies, with one k of the sweep."""
    return ldp.cases(settings, k_sweep=(5,))


def curves(report: dict) -> list[tuple]:
    """Everything but the timings."""
    return [
        tuple(sorted((k, json.dumps(v)) for k, v in item.items() if k != "seconds_mean"))
        for item in report["results"]
    ]


def test_paper_problem_matches_section_5_1():
    for setting in ("se", "matern"):
        p = ldp_problems.make_problem(setting, 0, 3, 500)
        assert p.Z.shape == (100, 1)
        np.testing.assert_allclose(p.Z[:, 0], np.linspace(0.01, 1.0, 100))
        assert p.B == np.abs(p.f).max() > 0
        assert p.R == 1.0 and p.lengthscale == 0.2
        assert p.kernel == ("se" if setting == "se" else "matern52")
        assert np.abs(p.eta).max() <= 1.0 and p.eta.std() > 0.4  # U[-1, 1]: std 0.577
    # se, matern and student-t of one run share the weights and support points; another run does not.
    rng = np.random.default_rng([0, 3, 1])
    w, s = rng.uniform(-1, 1, 100), rng.uniform(0, 1, 100)
    x = np.linspace(0.01, 1.0, 100)
    se = ldp_problems.make_problem("se", 0, 3, 10)
    np.testing.assert_allclose(se.f, np.exp(-0.5 * (x[:, None] - s[None, :]) ** 2 / 0.04) @ w)
    np.testing.assert_array_equal(se.f, ldp_problems.make_problem("student-t", 0, 3, 10).f)
    assert not np.allclose(se.f, ldp_problems.make_problem("se", 0, 4, 10).f)


def test_matern52_kernel():
    r = np.array([0.0, 0.2, 0.5])
    K = ldp_problems.kernel_matrix(np.zeros(1), r, "matern52", 0.2)[0]
    expected = [(1 + math.sqrt(5) * u + 5 * u * u / 3) * math.exp(-math.sqrt(5) * u) for u in r / 0.2]
    np.testing.assert_allclose(K, expected)
    with pytest.raises(ValueError):
        ldp_problems.kernel_matrix(r, r, "rbf", 0.2)


def test_student_t_noise_is_unbounded_with_three_degrees_of_freedom():
    p = ldp_problems.make_problem("student-t", 1, 0, 4000)
    assert p.R is None and p.noise_second_moment == 3.0
    assert np.abs(p.eta).max() > 3.0
    assert stats.kstest(p.eta, stats.t(df=3).cdf).pvalue > 1e-3
    assert stats.kstest(p.eta, stats.norm(scale=math.sqrt(3)).cdf).pvalue < 1e-3
    np.testing.assert_array_equal(p.outcomes(np.arange(5), np.arange(5), None), p.f[:5] + p.eta[:5])


def test_ctl_simulation_clips_then_adds_laplace():
    p = ldp_problems.make_problem("se", 2, 0, 2000)
    rows, pos = np.zeros(2000, dtype=np.int64) + int(np.argmax(p.f)), np.arange(2000)
    y = p.outcomes(rows, pos, 0.5)
    scale = 2 * (p.B + 1.0) / 0.5
    clipped = y - p.laplace * scale
    assert np.abs(clipped).max() <= p.B + 1.0 + 1e-9
    np.testing.assert_allclose(clipped, np.clip(p.f[rows] + p.eta, -(p.B + 1), p.B + 1))
    assert abs(np.median(np.abs(p.laplace)) - math.log(2)) < 0.06  # standard Laplace: median |L| = ln 2


def test_combined_problem_is_the_gaussian_release_of_the_grid():
    p = ldp_problems.make_problem("combined", 0, 0, 20)
    assert p.Z.shape == (10_000, 2) and p.f.shape == (10_000,)
    assert abs(p.f.std() - 1.0) < 1e-9 and p.B == ldp_problems.COMBINED_B and p.R == 1.0
    assert p.extra["epsilon_input"] == 1.0


def test_moma_paper_k():
    assert ldp_problems.moma_paper_k(1000, 0.05) == 295


def test_tiny_run_shape_monotone_and_reproducible():
    settings = ("se", "student-t", "combined")
    todo = tiny_cases(settings)
    kwargs = {"T": 30, "combined_T": 30, "settings": settings, "seed": 4, "todo": todo}
    report = ldp.run_benchmark(2, workers=1, **kwargs)
    again = ldp.run_benchmark(2, workers=2, **kwargs)  # the process pool gives the same numbers
    assert curves(report) == curves(again)
    assert len(report["results"]) + len(report["settings"]["skipped"]) == len(todo)
    keys = {"strategy", "setting", "epsilon", "runs", "cumulative_regret_mean", "cumulative_regret_se"}
    for item in report["results"]:
        assert keys <= item.keys()
        assert item["setting"] in ("se", "student-t", "combined") and item["runs"] == 2
        m = np.array(item["cumulative_regret_mean"])
        assert m.shape == (30,) and len(item["cumulative_regret_se"]) == 30
        assert (m >= 0).all() and (np.diff(m) >= -1e-12).all()
        if item["setting"] == "student-t":
            assert item["epsilon"] is None
    eps = {i["epsilon"] for i in report["results"] if i["setting"] == "se"}
    assert eps == set(ldp.PAPER_EPSILONS)
    baseline = [i for i in report["results"] if i["setting"] == "combined" and i["epsilon"] is None]
    assert [i["strategy"] for i in baseline] == ["gp-ucb"]
    moma = {(i["strategy"], i["k"]) for i in report["results"] if i["setting"] == "se"}
    assert ("ldp-moma-gp-ucb[k=5]", 5) in moma
    assert ("ldp-moma-gp-ucb", 30) not in moma and ("ldp-moma-gp-ucb", 211) not in moma
    # the paper's k (211 at T = 30) does not fit: skipped, and said so
    skipped = {(i["setting"], i["strategy"]) for i in report["settings"]["skipped"]}
    assert skipped == {
        (s, f"{p}moma-gp-ucb") for s, p in [("se", "ldp-"), ("student-t", ""), ("combined", "ldp-")]
    }
    swept = [i for i in report["results"] if i["strategy"] == "ldp-moma-gp-ucb[k=5]"]
    assert all(i["plays_per_row"] == 5 and i["first_round_requests"] == 5 for i in swept)
    facts = report["settings"]["problems"]
    assert facts["se"]["random_regret_per_step"] > 0 and facts["combined"]["n"] == 10_000
    rows = ldp.summary_rows(report)
    assert len(rows) == len(report["results"]) and all(len(r) == len(ldp.HEADER) for r in rows)
    other = ldp.run_benchmark(2, workers=1, **{**kwargs, "seed": 5})
    assert curves(other) != curves(report)


def test_beta_multiplier_reaches_the_strategies():
    problem = ldp_problems.make_problem("se", 0, 0, 30)
    base = ldp.Case("se", "ldp-tgp-ucb", 1.0)
    assert "beta_multiplier" not in ldp.strategy_params(base, problem)
    raw = ldp.strategy_params(ldp.Case("se", "ldp-tgp-ucb", 1.0, None, 0.1), problem)
    assert (
        raw["beta_multiplier"] == 0.1 and raw["B"] == problem.B and raw["R"] == 1.0 and raw["epsilon"] == 1.0
    )
    heavy = ldp.strategy_params(ldp.Case("student-t", "tgp-ucb", None), problem)
    assert heavy["v"] == problem.B**2 + problem.noise_second_moment and "epsilon" not in heavy


def test_the_three_ldp_strategies_are_compared_on_equal_terms():
    """Same problem facts and the same beta_multiplier for TGP, ATA and MoMA; T counted in plays (each of
    MoMA's k plays of an epoch is a play with its own noise draw and its own regret); same initial row."""
    T, k = 20, 5
    problem = ldp_problems.make_problem("se", 0, 0, T)
    todo = [ldp.Case("se", n, 1.0, k if "moma" in n else None, 0.1) for n in ldp.LDP_STRATEGIES]
    shared = {"epsilon", "B", "R", "kernel", "lengthscale", "beta_multiplier"}
    raws = [ldp.strategy_params(c, problem) for c in todo]
    assert all({key: r[key] for key in shared} == {key: raws[0][key] for key in shared} for r in raws)
    assert raws[0]["beta_multiplier"] == 0.1 and "k" not in raws[0] and raws[2]["k"] == k
    res = {c.strategy: ldp.study(problem, c, state_seed=(0, 0, 5), round_seed=1) for c in todo}
    gaps = problem.f.max() - problem.f
    for name, r in res.items():
        assert r.regret.shape == (T,)
        steps = np.diff(r.regret, prepend=0.0)
        assert np.all(np.isclose(steps[:, None], gaps[None, :]).any(axis=1))  # each step is one play's gap
    moma = res["ldp-moma-gp-ucb"]
    assert moma.rounds == T // k and res["ldp-tgp-ucb"].rounds == T
    steps = np.diff(moma.regret, prepend=0.0).reshape(T // k, k)
    np.testing.assert_allclose(steps, steps[:, :1] * np.ones((1, k)))  # one row per epoch, k plays
    assert len({float(v) for v in problem.outcomes(np.full(k, 3), np.arange(k), 1.0)}) == k  # fresh noise
    first = {float(np.diff(r.regret, prepend=0.0)[0]) for r in res.values()}
    assert len(first) == 1  # the same random initial row for the three


def test_plot_and_markdown(tmp_path):
    todo = tiny_cases(("se", "combined"))
    report = ldp.run_benchmark(1, T=10, combined_T=10, settings=("se", "combined"), workers=1, todo=todo)
    ldp.plot(report, tmp_path / "ldp.png")
    assert (tmp_path / "ldp.png").read_bytes()[:4] == b"\x89PNG"
    assert "| se | 1 |" in ldp.markdown(report)
    console = Console(width=140, record=True)
    console.print(ldp.summary_table(report))
    assert "R_T/R_{T/2}" in console.export_text()


def test_cli_rejects_unknown_settings():
    result = CliRunner().invoke(app, ["bench", "ldp", "--settings", "se,bogus"])
    assert result.exit_code != 0


def test_cli_writes_json(tmp_path):
    out = tmp_path / "ldp.json"
    args = ["bench", "ldp", "--runs", "1", "--T", "12", "--settings", "student-t", "--workers", "1"]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    names = {i["strategy"] for i in report["results"]}
    # k <= T = 12 only: the paper's k (209) and the sweep's 15 and 25 are skipped
    assert names == {"tgp-ucb", "ata-gp-ucb", "moma-gp-ucb[k=5]", "moma-gp-ucb[k=9]"}
    assert "skipped moma-gp-ucb on student-t" in result.output
