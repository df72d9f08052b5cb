"""``pobo bench gibo``: the DP-GIBO Section 4 benchmark on tiny configurations (fixed seeds only)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from shared.bo.gibo.losses import check_row_independent
from shared.tools.bench import gibo
from shared.tools.bench import gibo_problems as gp
from shared.tools.cli import app

TINY = gibo.Config(
    location=gibo.LocationConfig(T=25),
    huber=gibo.HuberConfig(T=15),
    tuning=gibo.TuningConfig(d=3, n_train=40, n_val=120, T=3, b=4),
)


@pytest.fixture(scope="module")
def report() -> dict:
    return gibo.run_benchmark(3, seed=0, workers=1, config=TINY)


def entry(report: dict, example: str, method: str, mu: float | None = None) -> dict:
    (item,) = [i for i in report["results"] if (i["example"], i["method"], i["mu"]) == (example, method, mu)]
    return item


def test_json_has_the_documented_shape(report: dict) -> None:
    report = json.loads(json.dumps(report))  # JSON-serialisable (no inf / numpy values)
    got = {(i["example"], i["method"], i["mu"]) for i in report["results"]}
    assert got == {
        ("normal-location", "gibo", None),
        ("normal-location", "dp-gibo", 2.0),
        ("normal-location", "dp-gibo", 0.5),
        ("huber-regression", "dp-gibo", 1.0),
        ("huber-regression", "noisy-gd", 1.0),
        ("gp-lengthscales", "dp-gibo", 1.0),
        ("gp-lengthscales", "random-search", None),
        ("gp-lengthscales", "gp-ucb", None),
    }
    for item in report["results"]:
        assert item["runs"] == 3
        assert isinstance(item["final_error_mean"], float) and isinstance(item["final_error_se"], float)
        assert item["final_error_se"] >= 0
        assert len(item["final_errors"]) == 3
        assert np.mean(item["final_errors"]) == pytest.approx(item["final_error_mean"])
        assert item["path_mean"][-1] == pytest.approx(item["final_error_mean"])
        assert len(item["path_mean"]) == len(item["path_x"])
    steps = {"normal-location": 26, "huber-regression": 16}
    for item in report["results"]:
        if item["example"] in steps:
            assert len(item["path_mean"]) == steps[item["example"]]
    # 4.3: the same evaluation budget, T b = 12 design points, for every method
    assert entry(report, "gp-lengthscales", "dp-gibo", 1.0)["path_x"][-1] == 12
    assert len(entry(report, "gp-lengthscales", "random-search")["path_mean"]) == 12
    assert entry(report, "gp-lengthscales", "gp-ucb")["path_x"] == list(range(1, 13))
    assert report["config"]["location"]["mus"] == [2.0, 0.5]


def test_section_4_1_gibo_converges_and_mu_orders_the_error(report: dict) -> None:
    exact = entry(report, "normal-location", "gibo")
    assert exact["final_error_mean"] < 0.2 * exact["start_error_mean"]  # sqrt(5)-ish start, clip bias left
    assert exact["sigma"] == 0.0 and max(exact["noise_mean"]) == 0.0
    # ... and what is left is the clipping bias: the fixed point of noiseless clipped GD, not the MLE
    # (T = 25 steps of contraction ~0.79 leave ~2.3 * 0.79^25 < 0.01 of the start)
    assert exact["final_error_mean"] == pytest.approx(exact["noise_floor_rms_mean"], abs=0.02)
    hi, lo = (
        entry(report, "normal-location", "dp-gibo", 2.0),
        entry(report, "normal-location", "dp-gibo", 0.5),
    )
    assert hi["sigma"] == pytest.approx(2 * 1.0 * math.sqrt(25) / (50 * 2.0))
    assert lo["sigma"] == pytest.approx(4 * hi["sigma"])
    # mu = 2 closer to the MLE than mu = 0.5 over the last 10 steps (mean over runs and steps), by more than
    # two standard errors of the difference (the mean of the per-step s.e. bounds the s.e. of the average)
    late = {
        k: (np.mean(i["path_mean"][-10:]), np.mean(i["path_se"][-10:])) for k, i in (("hi", hi), ("lo", lo))
    }
    assert late["lo"][0] - late["hi"][0] > 2 * math.hypot(late["lo"][1], late["hi"][1])
    for item, (late_mean, _) in ((hi, late["hi"]), (lo, late["lo"])):
        # at the noise floor predicted by linearised noisy clipped GD (an RMS, so >= the mean norm)
        assert 0.5 < late_mean / item["noise_floor_rms_mean"] < 1.2
        # the released noise has the norm of N(0, sigma^2 I_5): E|w| = sigma sqrt(2) Gamma(3) / Gamma(5/2)
        expected = item["sigma"] * math.sqrt(2) * math.gamma(3) / math.gamma(2.5)
        assert np.mean(item["noise_mean"]) == pytest.approx(expected, rel=0.15)
        # Fig. 1 (bottom): after a few steps the surrogate's gradient error is negligible beside the noise
        assert max(item["surrogate_bias_mean"][5:]) < 0.05 * expected
        assert len(item["objective_mean"]) == 26 and len(item["estimate_mean"][0]) == 5
        assert item["objective_mean"][-1] >= item["objective_mle_mean"]  # the MLE minimises it


class NeverDrawn:
    """A generator that must not be drawn from (mu = inf: no noise)."""

    def standard_normal(self, *args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("no noise may be drawn at mu = inf")


def test_section_4_2_noisy_gd_runs_and_is_private_gd() -> None:
    runs = gibo.run_huber(TINY.huber, 0, 1)
    by = {r.method: r for r in runs}
    assert set(by) == {"dp-gibo", "noisy-gd"}
    for r in runs:
        assert np.isfinite(r.path).all() and r.path[-1] < r.path[0]
        assert r.sigma == pytest.approx(2 * 1.0 * math.sqrt(15) / (100 * 1.0))
    # without noise and with an inactive clip, noisy GD is plain GD: it reaches the minimiser
    X, y = gp.huber_data(np.random.default_rng(3), 100)
    theta_hat = gp.huber_minimiser(X, y, np.zeros(4))
    path = gp.noisy_gd(
        lambda t: gp.huber_user_gradients(t, X, y),
        np.zeros(4),
        np.tile([-5.0, 5.0], (4, 1)),
        T=200,
        B=100.0,
        mu=math.inf,
        lr=1.0,
        rng=NeverDrawn(),  # type: ignore[arg-type]
    )
    assert np.linalg.norm(path[-1] - theta_hat) < 1e-6
    # the exact gradient matches a finite difference of the mean loss
    from shared.bo.gibo.losses import huber_regression

    theta, e = np.array([0.3, -0.2, 0.5, 1.0]), 1e-6
    fd = [
        (
            huber_regression((theta + e * u)[None], X, y).mean()
            - huber_regression((theta - e * u)[None], X, y).mean()
        )
        / (2 * e)
        for u in np.eye(4)
    ]
    np.testing.assert_allclose(gp.huber_user_gradients(theta, X, y).mean(axis=0), fd, atol=1e-7)


def test_section_4_3_problem_and_baselines(report: dict) -> None:
    problem = gp.make_gp_tuning(np.random.default_rng(0), d=3, n_train=30, n_val=50)
    # the per-user loss is a function of the user's own validation row (the training set is public)
    check_row_independent(
        lambda Z, Xv, yv: replace(problem, X_val=Xv, y_val=yv).loss_matrix(Z),
        problem.X_val,
        problem.y_val,
        rng=np.random.default_rng(1),
        theta_batch=np.array([[0.5, 1.0, 2.0], [3.0, 0.2, 4.0]]),
    )
    calls: list[int] = []

    def objective(Z: np.ndarray) -> np.ndarray:
        calls.append(Z.shape[0])
        return problem.validation_loss(Z)

    x0 = np.full(3, 2.0)
    values = gp.gp_ucb(objective, problem.bounds, 9, np.random.default_rng(2), x0)
    assert values.shape == (9,) and sum(calls) == 9 and values[0] == pytest.approx(objective(x0[None])[0])
    assert (
        values.shape
        == gp.random_search(problem.validation_loss, problem.bounds, 9, np.random.default_rng(2), x0).shape
    )
    for method in ("dp-gibo", "random-search", "gp-ucb"):
        item = entry(report, "gp-lengthscales", method, 1.0 if method == "dp-gibo" else None)
        assert min(item["path_mean"]) >= 0  # the gap to the best value any method saw in the run
        if method != "dp-gibo":
            assert np.all(np.diff(item["path_mean"]) <= 1e-12)  # best so far
    # App. C.3: one random start per run, shared -- theta0 is each baseline's first evaluation
    dp = entry(report, "gp-lengthscales", "dp-gibo", 1.0)
    for method in ("random-search", "gp-ucb"):
        assert entry(report, "gp-lengthscales", method)["path_mean"][0] == pytest.approx(dp["path_mean"][0])
    assert 0 <= dp["dp_best_iterate_mean"] <= dp["final_error_mean"] + 1e-12


def test_section_4_3_defaults_follow_the_paper() -> None:
    cfg = gibo.TuningConfig()
    assert (cfg.d, cfg.n_val, cfg.T, cfg.b, cfg.B, cfg.mu) == (10, 4500, 25, 11, 1.0, 1.0)  # App. C.3
    # where the paper is silent (see the module docstring): AdaGrad step, surrogate length-scale, maxiter
    assert (cfg.lr, cfg.lengthscale, cfg.maxiter) == (1.0, 1.0, 100)


def test_run_dp_gibo_maxiter_pass_through() -> None:
    from shared.bo.gibo.kernels import SEKernel
    from shared.bo.gibo.loop import run_dp_gibo
    from shared.bo.gibo.updates import AdaGrad
    from shared.errors import InputDataError

    def loss_matrix(Z: np.ndarray) -> np.ndarray:
        return np.sum((Z - 0.3) ** 2, axis=1)[:, None] * np.ones((1, 5))

    def go(**kw: object) -> np.ndarray:
        res = run_dp_gibo(
            loss_matrix,
            np.zeros(2),
            np.tile([-1.0, 1.0], (2, 1)),
            T=2,
            B=1.0,
            mu=math.inf,
            kernel=SEKernel(),
            updater=AdaGrad(lr=0.1),
            rng=np.random.default_rng(0),
            **kw,  # type: ignore[arg-type]
        )
        return res.design

    # the default (None) is optimize_batch's own default of 200 iterations
    np.testing.assert_array_equal(go(batch_size=3), go(batch_size=3, maxiter=200))
    assert go(batch_size=3, maxiter=1).shape == (6, 2)
    with pytest.raises(InputDataError):
        go(batch_size=3, maxiter=0)
    with pytest.raises(InputDataError):
        go(tolerance=0.1, maxiter=10)


def test_cli_writes_json_and_plot(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gibo, "Config", lambda: replace(TINY, huber=replace(TINY.huber, T=5)))
    out, png = tmp_path / "g.json", tmp_path / "g.png"
    args = ["bench", "gibo", "--runs", "2", "--workers", "1", "--json", str(out), "--plot", str(png)]
    result = CliRunner().invoke(app, [*args, "--examples", "huber-regression,gp-lengthscales"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert {i["example"] for i in data["results"]} == {"huber-regression", "gp-lengthscales"}
    assert all(i["runs"] == 2 for i in data["results"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = CliRunner().invoke(app, ["bench", "gibo", "--examples", "svm"])
    assert bad.exit_code != 0
