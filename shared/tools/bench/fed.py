"""``pobo bench fed``: DP-FTS-DE's Section 5 experiments (Dai, Low & Jaillet, NeurIPS 2021; issue 16 item 5).

Settings (``SETTINGS``; problems and the simulation loop in ``shared.tools.bench.fed_problems``):

* ``synthetic`` (Section 5.1, Fig. 2): a GP(0, SE) sample on a 30 x 30 grid of [0, 1]^2 (lengthscale 0.2),
  each agent's objective the sample plus iid N(0, 0.05^2) per grid point, observation noise std 0.1
  (lambda = 0.01), M = 50, 1 - p_t = 1/sqrt(t), 10 initial points, 40 rounds. The paper's N = 200 agents is
  kept. Curves: ``ts`` (every agent alone), ``fts`` (P = 1, no DP), ``fts-de`` (P = 2, 4, no DP) (Fig. 2a);
  ``dp-fts`` (P = 1) and ``dp-fts-de`` (P = 2) for the impact of S (q = 0.5, z = 1; Fig. 2b), q (z = 1,
  S = 11; Fig. 2c) and z (q = 0.5, S = 11; Fig. 2d).
* ``svm-shards`` (Section 5.2's landmine experiment, offline substitute): N = 20 agents, each a shard of
  scikit-learn's digits (odd vs even), tuning an RBF SVM's (log10 C in [-3, 3], log10 gamma in [-4, 2]) on a
  15 x 15 grid for validation AUC; P = 4, S = 22, M = 100, 1 - p_t = 1/t, 10 initial points + 60 rounds;
  DP at q = 0.35 with z = 1, 2, 4 and at q = 0.15 with z = 1 (Fig. 3a's axes). Regret: the gap to the best
  AUC on the grid, per agent, averaged over agents.

Choices the paper leaves open (App. B is not in our copy): the temperature schedule T_t = 1 for 10
releases, then 1 + 0.5 (t - 10) (the shape of the authors' landmine code: weight constant 16 for 10 rounds
falling to 1 over 30), a = 15; the RFF lengthscale equals the GP's (synthetic) or 0.2 on the unit box (SVM);
the domain is a finite grid (footnote 3) so each argmax is exact. Privacy: epsilon from
``shared.accounting.federated_epsilon`` (PLD and RDP, zero-out relation) over the ``rounds`` releases, at
delta = 1e-5.

Paired design: within a run every curve of a setting sees the same objectives, features, initial points
(per P) and random stream. Runs are independent jobs (``map_runs``), one per (setting, curve, run).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.accounting import federated_epsilon
from shared.federated import TemperatureSchedule, draw_rff
from shared.federated.agent_step import PSchedule
from shared.tools.bench.fed_problems import AlgConfig, GridProblem, make_svm_shards, make_synthetic, simulate
from shared.tools.bench.pool import map_runs
from shared.tools.bench.report import bench_main, markdown_table, rich_table, save_figure

FloatArray = npt.NDArray[np.float64]

SETTINGS = ("synthetic", "svm-shards")
_INDEX = {name: k for k, name in enumerate(SETTINGS)}

SYNTHETIC_CURVES: tuple[AlgConfig, ...] = (
    AlgConfig("ts"),
    AlgConfig("fts", P=1),
    AlgConfig("fts-de", P=2),
    AlgConfig("fts-de", P=4),
    AlgConfig("dp-fts", P=1, q=0.5, z=1.0, S=11.0),
    *(AlgConfig("dp-fts-de", P=2, q=0.5, z=1.0, S=s) for s in (1.0, 11.0, 50.0)),
    *(AlgConfig("dp-fts-de", P=2, q=q, z=1.0, S=11.0) for q in (0.15, 0.25)),
    *(AlgConfig("dp-fts-de", P=2, q=0.5, z=z, S=11.0) for z in (2.0, 4.0)),
)
SVM_CURVES: tuple[AlgConfig, ...] = (
    AlgConfig("ts"),
    AlgConfig("fts", P=1),
    AlgConfig("fts-de", P=4),
    *(AlgConfig("dp-fts-de", P=4, q=0.35, z=z, S=22.0) for z in (1.0, 2.0, 4.0)),
    AlgConfig("dp-fts-de", P=4, q=0.15, z=1.0, S=22.0),
)


@dataclass(frozen=True)
class SyntheticConfig:
    """Section 5.1 (the paper: N = 200, M = 50, 1 - p_t = 1/sqrt(t))."""

    N: int = 200
    rounds: int = 40
    n_init: int = 10
    M: int = 50
    side: int = 30
    d: int = 2
    lengthscale: float = 0.2
    perturb: float = 0.05
    noise_std: float = 0.1
    schedule: PSchedule = "inv_sqrt"
    curves: tuple[AlgConfig, ...] = SYNTHETIC_CURVES


@dataclass(frozen=True)
class SvmConfig:
    """Section 5.2's landmine setting on digits shards (P = 4, S = 22, M = 100, 1 - p_t = 1/t, 60 + 10)."""

    N: int = 20
    rounds: int = 60
    n_init: int = 10
    M: int = 100
    side: int = 15
    lengthscale: float = 0.2
    schedule: PSchedule = "inv"
    curves: tuple[AlgConfig, ...] = SVM_CURVES


@dataclass(frozen=True)
class Config:
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    svm: SvmConfig = field(default_factory=SvmConfig)
    lam: float = 0.01
    delta: float = 1e-5
    hold: int = 10
    growth: float = 0.5


Job = tuple[str, int, int, int, Config, GridProblem | None]


def one_job(job: Job) -> tuple[str, int, FloatArray, float]:
    """One curve of one setting on one run: (setting, curve index, regret path, clipped fraction)."""
    setting, k, run, seed, config, table = job
    s = _INDEX[setting]
    scfg: SyntheticConfig | SvmConfig = config.synthetic if setting == "synthetic" else config.svm
    cfg = scfg.curves[k]
    if setting == "synthetic":
        sc = config.synthetic
        prob = make_synthetic(
            np.random.default_rng([seed, run, s, 0]),
            N=sc.N, side=sc.side, d=sc.d, lengthscale=sc.lengthscale, perturb=sc.perturb,
            noise_std=sc.noise_std,
        )  # fmt: skip
    else:
        assert table is not None  # noqa: S101 - built once by run_benchmark
        prob = table
    rff = draw_rff(prob.d, scfg.M, scfg.lengthscale, rng=np.random.default_rng([seed, run, s, 1]))
    regret, clipped = simulate(
        prob,
        cfg,
        rff,
        rounds=scfg.rounds,
        n_init=scfg.n_init,
        schedule=scfg.schedule,
        lam=config.lam,
        temperature=TemperatureSchedule(hold=config.hold, growth=config.growth),
        rng_init=np.random.default_rng([seed, run, s, 2, cfg.P]),
        rng=np.random.default_rng([seed, run, s, 3]),
    )
    return setting, k, regret, clipped


@functools.lru_cache(maxsize=256)
def _epsilon(q: float, z: float, rounds: int, delta: float, accountant: str) -> float:
    """``federated_epsilon`` (zero-out relation), cached: the PLD accountant takes seconds per call."""
    return federated_epsilon(q, z, rounds, delta, accountant="pld" if accountant == "pld" else "rdp")


def _se(P: FloatArray) -> FloatArray:
    se: FloatArray = P.std(axis=0, ddof=1) / math.sqrt(P.shape[0]) if P.shape[0] > 1 else 0.0 * P[0]
    return se


def aggregate(
    setting: str, cfg: AlgConfig, paths: list[FloatArray], clipped: list[float], rounds: int, delta: float
) -> dict[str, Any]:
    """Mean / s.e. over runs of one curve, with epsilon (PLD, RDP) after ``rounds`` releases for DP."""
    P = np.vstack(paths)
    eps = {
        acc: _epsilon(cfg.q, cfg.z, rounds, delta, acc)
        if cfg.dp and cfg.q is not None and cfg.z is not None
        else None
        for acc in ("pld", "rdp")
    }
    return {
        "setting": setting,
        "algorithm": cfg.algorithm,
        "P": cfg.P,
        "q": cfg.q,
        "z": cfg.z,
        "S": cfg.S,
        "epsilon_pld": eps["pld"],
        "epsilon_rdp": eps["rdp"],
        "delta": delta if cfg.dp else None,
        "runs": int(P.shape[0]),
        "regret_mean": P.mean(axis=0).tolist(),
        "regret_se": _se(P).tolist(),
        "final_regret_mean": float(P[:, -1].mean()),
        "final_regret_se": float(_se(P)[-1]),
        "final_regrets": P[:, -1].tolist(),
        "average_regret_mean": float(P[:, 1:].mean()),
        "average_regrets": P[:, 1:].mean(axis=1).tolist(),
        "clipped_fraction": float(np.mean(clipped)) if cfg.dp else None,
    }


def run_benchmark(
    runs: int,
    *,
    settings: Sequence[str] = SETTINGS,
    seed: int = 0,
    workers: int = 2,
    config: Config | None = None,
    progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One job per (setting, curve, run); results per (setting, curve) in the order of the curves."""
    cfg = config or Config()
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise ValueError(f"unknown setting {unknown}; the settings are {', '.join(SETTINGS)}")
    table = None
    if "svm-shards" in settings:  # the AUC of every grid point, once (the shards depend on the seed only)
        table = make_svm_shards(seed, N=cfg.svm.N, side=cfg.svm.side)
    jobs: list[Job] = []
    for s in settings:
        curves = cfg.synthetic.curves if s == "synthetic" else cfg.svm.curves
        shared = table if s == "svm-shards" else None
        jobs += [(s, k, r, seed, cfg, shared) for k in range(len(curves)) for r in range(runs)]
    paths: dict[tuple[str, int], list[FloatArray]] = {}
    clips: dict[tuple[str, int], list[float]] = {}
    for setting, k, regret, clipped in map_runs(one_job, jobs, workers):
        paths.setdefault((setting, k), []).append(regret)
        clips.setdefault((setting, k), []).append(clipped)
        if progress:
            progress()
    results = []
    for s in settings:
        scfg: SyntheticConfig | SvmConfig = cfg.synthetic if s == "synthetic" else cfg.svm
        for k, curve in enumerate(scfg.curves):
            results.append(aggregate(s, curve, paths[(s, k)], clips[(s, k)], scfg.rounds, cfg.delta))
    return {
        "config": {"runs": runs, "seed": seed, "settings": list(settings), **asdict(cfg)},
        "results": results,
    }


# ------------------------------------------------------------------------------------------------ report
HEADER = [
    "setting",
    "algorithm",
    "P",
    "q",
    "z",
    "S",
    "eps PLD",
    "eps RDP",
    "final regret ± s.e.",
    "mean regret over rounds",
    "clipped",
]


def _num(v: float | None, fmt: str = "g") -> str:
    return "-" if v is None else str(format(v, fmt))


def summary_rows(report: dict[str, Any]) -> list[list[str]]:
    return [
        [
            i["setting"],
            i["algorithm"],
            str(i["P"]),
            _num(i["q"]),
            _num(i["z"]),
            _num(i["S"]),
            _num(i["epsilon_pld"], ".2f"),
            _num(i["epsilon_rdp"], ".2f"),
            f"{i['final_regret_mean']:.4f} ± {i['final_regret_se']:.4f}",
            f"{i['average_regret_mean']:.4f}",
            "-" if i["clipped_fraction"] is None else f"{100 * i['clipped_fraction']:.1f}%",
        ]
        for i in report["results"]
    ]


def summary_table(report: dict[str, Any]) -> Any:
    delta = report["config"]["delta"]
    title = (
        f"DP-FTS-DE Section 5: simple regret averaged over agents (epsilon at delta = {delta:g}, "
        "zero-out relation, after all releases)"
    )
    return rich_table(title, HEADER, summary_rows(report), left=("setting", "algorithm"))


def markdown(report: dict[str, Any]) -> str:
    return markdown_table("DP-FTS-DE Section 5 benchmark", HEADER, summary_rows(report))


def _label(i: dict[str, Any]) -> str:
    if i["algorithm"] == "ts":
        return "TS"
    name = str(i["algorithm"]).upper() + f" (P={i['P']})"
    if i["q"] is None:
        return name
    q, z, S = float(i["q"]), float(i["z"]), float(i["S"])
    eps_pld, eps_rdp = float(i["epsilon_pld"]), float(i["epsilon_rdp"])
    return f"{name} q={q:g} z={z:g} S={S:g}: eps {eps_pld:.2f} / {eps_rdp:.2f}"


def _panels(report: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Fig. 2a-d for synthetic (non-DP; S at q = 0.5, z = 1; q at z = 1, S = 11; z at q = 0.5, S = 11), and
    Fig. 3d for svm-shards (all curves)."""
    res = report["results"]
    syn = [i for i in res if i["setting"] == "synthetic"]
    ref = [i for i in syn if i["algorithm"] == "ts" or (i["algorithm"] == "fts-de" and i["P"] == 2)]
    dp = [i for i in syn if i["algorithm"] == "dp-fts-de"]
    panels = []
    if syn:
        panels += [
            ("synthetic: TS vs FTS vs FTS-DE (Fig. 2a)", [i for i in syn if i["q"] is None]),
            ("synthetic: impact of S (Fig. 2b)", ref + [i for i in dp if i["q"] == 0.5 and i["z"] == 1.0]),
            ("synthetic: impact of q (Fig. 2c)", ref + [i for i in dp if i["z"] == 1.0 and i["S"] == 11.0]),
            ("synthetic: impact of z (Fig. 2d)", ref + [i for i in dp if i["q"] == 0.5 and i["S"] == 11.0]),
        ]
    svm = [i for i in res if i["setting"] == "svm-shards"]
    if svm:
        panels.append(("svm-shards (digits; 1 - AUC gap to the grid's best)", svm))
    return [(t, list({id(i): i for i in items}.values())) for t, items in panels]


def plot(report: dict[str, Any], path: Path) -> None:
    """One panel per figure: regret averaged over agents (mean ± s.e. over runs) by round, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(report)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.2), squeeze=False)
    for ax, (title, items) in zip(axes[0], panels, strict=True):
        for i in items:
            m, se = np.asarray(i["regret_mean"]), np.asarray(i["regret_se"])
            t = np.arange(m.size)
            ax.plot(t, m, label=_label(i), ls="--" if i["algorithm"] == "ts" else "-")
            ax.fill_between(t, np.maximum(m - se, 1e-6), m + se, alpha=0.15)
        ax.set_yscale("log")
        ax.set_xlabel("round t (0 = after the initial points)")
        ax.set_ylabel("simple regret, mean over agents")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    save_figure(fig, path)


def main(
    *,
    runs: int,
    settings: Sequence[str],
    seed: int,
    workers: int,
    json_path: Path | None,
    plot_path: Path | None,
    config: Config | None = None,
) -> dict[str, Any]:
    import time

    cfg = config or Config()
    n_jobs = runs * sum(len(cfg.synthetic.curves if s == "synthetic" else cfg.svm.curves) for s in settings)
    start = time.perf_counter()

    def complete(report: dict[str, Any]) -> None:
        report["wall_seconds"] = time.perf_counter() - start
        report["config"]["workers"] = workers

    return bench_main(
        lambda advance: run_benchmark(
            runs, settings=settings, seed=seed, workers=workers, config=cfg, progress=advance
        ),
        label=f"DP-FTS-DE ({', '.join(settings)}; curves x {runs})",
        runs=n_jobs,
        complete=complete,
        show=lambda report: [
            summary_table(report),
            f"wall time {report['wall_seconds']:.1f} s with {workers} worker(s)",
        ],
        json_path=json_path,
        markdown=lambda report: markdown(report) + f"\nWall time {report['wall_seconds']:.1f} s.\n",
        plot=plot,
        plot_path=plot_path,
    )
