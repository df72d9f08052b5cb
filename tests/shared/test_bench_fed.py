"""``pobo bench fed``: the DP-FTS-DE Section 5 benchmark on tiny configurations (fixed seeds only)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from shared.accounting import federated_epsilon
from shared.tools.bench import fed
from shared.tools.bench.fed_problems import AlgConfig
from shared.tools.cli import app

LOW_Z, HIGH_Z = 1.0, 20.0
TINY = fed.Config(
    synthetic=fed.SyntheticConfig(
        N=30,
        rounds=8,
        n_init=3,
        M=30,
        side=12,
        curves=(
            AlgConfig("ts"),
            AlgConfig("fts-de", P=2),
            AlgConfig("dp-fts-de", P=2, q=0.5, z=LOW_Z, S=11.0),
            AlgConfig("dp-fts-de", P=2, q=0.5, z=HIGH_Z, S=11.0),
        ),
    ),
    svm=fed.SvmConfig(
        N=4,
        rounds=3,
        n_init=2,
        M=20,
        side=4,
        curves=(AlgConfig("ts"), AlgConfig("fts", P=1), AlgConfig("dp-fts-de", P=4, q=0.5, z=1.0, S=22.0)),
    ),
)
RUNS = 4


@pytest.fixture(scope="module")
def report() -> dict:
    return fed.run_benchmark(RUNS, seed=0, workers=1, config=TINY)


def entry(report: dict, setting: str, algorithm: str, z: float | None = None) -> dict:
    (item,) = [
        i for i in report["results"] if (i["setting"], i["algorithm"], i["z"]) == (setting, algorithm, z)
    ]
    return item


def _paired(a: list[float], b: list[float]) -> tuple[float, float]:
    d = np.asarray(a) - np.asarray(b)
    return float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))


def test_json_has_the_documented_shape(report: dict) -> None:
    report = json.loads(json.dumps(report, allow_nan=False))  # plain JSON: no NaN / numpy values
    keys = {
        "setting",
        "algorithm",
        "P",
        "q",
        "z",
        "S",
        "epsilon_pld",
        "epsilon_rdp",
        "regret_mean",
        "regret_se",
    }
    got = [(i["setting"], i["algorithm"], i["P"], i["z"]) for i in report["results"]]
    assert got == [
        ("synthetic", "ts", 1, None),
        ("synthetic", "fts-de", 2, None),
        ("synthetic", "dp-fts-de", 2, LOW_Z),
        ("synthetic", "dp-fts-de", 2, HIGH_Z),
        ("svm-shards", "ts", 1, None),
        ("svm-shards", "fts", 1, None),
        ("svm-shards", "dp-fts-de", 4, 1.0),
    ]
    for item in report["results"]:
        assert keys <= set(item)
        rounds = TINY.synthetic.rounds if item["setting"] == "synthetic" else TINY.svm.rounds
        assert len(item["regret_mean"]) == len(item["regret_se"]) == rounds + 1
        assert item["runs"] == RUNS and len(item["final_regrets"]) == RUNS
        assert item["regret_mean"][-1] == pytest.approx(item["final_regret_mean"])
        assert min(item["regret_se"]) >= 0
        # simple regret (best so far, averaged over agents) never increases and is >= 0
        m = np.asarray(item["regret_mean"])
        assert (np.diff(m) <= 1e-12).all() and m.min() >= -1e-12
        if item["algorithm"].startswith("dp-"):
            assert item["epsilon_pld"] > 0 and item["epsilon_rdp"] > 0
            assert 0.0 <= item["clipped_fraction"] <= 1.0
        else:
            assert item["q"] is item["z"] is item["S"] is item["epsilon_pld"] is item["epsilon_rdp"] is None


def test_epsilon_is_the_accountants(report: dict) -> None:
    """The printed epsilon is shared.accounting.federated_epsilon over all releases at delta = 1e-5 (checked
    on the cheap high-z curve: the PLD accountant takes seconds at small z)."""
    item = entry(report, "synthetic", "dp-fts-de", HIGH_Z)
    for acc in ("pld", "rdp"):
        want = federated_epsilon(0.5, HIGH_Z, TINY.synthetic.rounds, 1e-5, accountant=acc)  # type: ignore[arg-type]
        assert item[f"epsilon_{acc}"] == pytest.approx(want)


def test_fts_de_converges_faster_than_ts(report: dict) -> None:
    """Paired over the 4 seeded runs (same objectives, features and streams): FTS-DE's final regret and its
    regret averaged over rounds are below TS's; at this size the gap is several paired standard errors."""
    ts, de = entry(report, "synthetic", "ts"), entry(report, "synthetic", "fts-de")
    final, final_se = _paired(ts["final_regrets"], de["final_regrets"])
    avg, avg_se = _paired(ts["average_regrets"], de["average_regrets"])
    assert final > 0 and avg > 2 * avg_se, (final, final_se, avg, avg_se)


def test_more_noise_less_epsilon_and_no_better_regret(report: dict) -> None:
    low, high = (
        entry(report, "synthetic", "dp-fts-de", LOW_Z),
        entry(report, "synthetic", "dp-fts-de", HIGH_Z),
    )
    assert high["epsilon_pld"] < low["epsilon_pld"] and high["epsilon_rdp"] < low["epsilon_rdp"]
    diff, se = _paired(high["average_regrets"], low["average_regrets"])
    assert diff > 0, (diff, se)  # z = 20 makes the aggregates nearly pure noise: not better than z = 0.5


def test_cli_writes_json_and_plot(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = fed.Config(
        synthetic=fed.SyntheticConfig(
            N=6, rounds=2, n_init=2, M=10, side=5, curves=TINY.synthetic.curves[:3]
        ),
        svm=TINY.svm,
    )
    monkeypatch.setattr(fed, "Config", lambda: tiny)
    out, png = tmp_path / "fed.json", tmp_path / "fed.png"
    args = ["bench", "fed", "--runs", "2", "--settings", "synthetic", "--workers", "1", "--seed", "3"]
    result = CliRunner().invoke(app, [*args, "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [i["algorithm"] for i in data["results"]] == ["ts", "fts-de", "dp-fts-de"]
    assert {i["setting"] for i in data["results"]} == {"synthetic"}
    assert data["config"]["seed"] == 3 and data["wall_seconds"] > 0
    assert png.stat().st_size > 0 and out.with_suffix(".md").exists()
    bad = CliRunner().invoke(app, ["bench", "fed", "--settings", "landmine"])
    assert bad.exit_code != 0
