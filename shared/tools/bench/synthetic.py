"""The paper's synthetic GP experiment: PO-GP-UCB vs non-private GP-UCB (Fig. 2a, Tables 1-3), and the
Gaussian release (pobo's default, formally DP) beside them.

Kharkovskii, Dai & Low (ICML 2020), Section 4 "Synthetic GP dataset": a 100 x 100 grid (d = 2, n = 10 000),
f ~ GP(0, k) with l = 1.25, sigma_y^2 = 1, sigma_n^2 = 1e-5; delta = 1e-5, T = 50, delta' = 0.05.

The paper's thresholds (largest feasible r = 10, 15, 20 at eps = e^1.1, e^1.3, e^1.5) pin sigma_min of the
centred grid inside [3503, 4113) (natural logs). The grid spans [0, 10]^2 in "grid units"; we scale it by
``SIGMA_TARGET / sigma_min`` so that sigma_min = 3800 in the units the curator releases, and keep f's
lengthscale at 1.25 grid units (1.25 x scale in released units).

Two hyper-parameter modes for the modeler:
- ``transfer``: the paper's setting, f's own hyper-parameters (in released units) used unchanged on Z;
- ``mle``: learned by maximum likelihood from the observations on Z, as a real modeler must.

Three algorithms: ``gp-ucb`` (non-private, on the grid itself), ``po-gp-ucb`` (the paper's Algorithm 1 at
(eps, r); no formal guarantee, see docs/privacy.md) and ``gaussian`` (the Gaussian release at eps, all d = 2
coordinates, noise std from the analytic calibration; Algorithm 1's transfer of hyper-parameters applies
unchanged because the release keeps the grid's units).

Each run draws a fresh f (exactly, via the Kronecker structure of the SE kernel on a grid: F = L1 W L1^T),
a fresh initial row (shared by every setting of the run, a paired comparison) and a fresh M (or noise) per
(algorithm, eps, r).
Simple regret S_t = max f - max_{s <= t} f(x_s) in units of sigma_y (f standardised), t = 1..T counting the
T GP-UCB queries after the initial row. ``--strategies`` compares the modeler's registry strategies on the
same problem instead (``shared.tools.bench.strategies``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared.bo.gp import Hyperparameters
from shared.bo.kernels import se_from_sqdist
from shared.bo.strategies import GPUCB
from shared.privacy.gaussian import calibrate, gaussian_release
from shared.privacy.po_gp_ucb import centred_sigma_min, omega, release_projection
from shared.tools.bench.pool import map_runs
from shared.tools.bench.report import bench_main, save_figure

GRID = 100
SPAN = 10.0
LENGTHSCALE = 1.25
NOISE_VARIANCE = 1e-5
DELTA = 1e-5
DELTA_PRIME = 0.05
T = 50
SIGMA_TARGET = 3800.0
MODES = ("transfer", "mle")

FIG2A_EPS = (0.0, 0.5, 0.9, 1.1)  # log(eps) at r = 10; also the Gaussian release's eps
SWEEPS: dict[float, tuple[int, ...]] = {
    1.1: (3, 6, 8, 10, 15, 20),
    1.3: (3, 9, 12, 15, 20, 30),
    1.5: (5, 10, 15, 20, 30, 50),
}
#: S_50 reported by the paper (Tables 1-3), for the markdown comparison.
PAPER_TABLES: dict[float, dict[int, float]] = {
    1.1: {3: 0.073, 6: 0.038, 8: 0.018, 10: 0.014, 15: 0.118, 20: 0.137},
    1.3: {3: 0.091, 9: 0.009, 12: 0.019, 15: 0.008, 20: 0.127, 30: 0.134},
    1.5: {5: 0.05, 10: 0.021, 15: 0.003, 20: 0.002, 30: 0.094, 50: 0.142},
}


@dataclass(frozen=True)
class Setting:
    algorithm: str  # "gp-ucb" | "po-gp-ucb" | "gaussian"
    mode: str  # "transfer" | "mle"
    log_eps: float | None
    r: int | None

    @property
    def epsilon(self) -> float | None:
        return None if self.log_eps is None else math.exp(self.log_eps)


def grid_inputs() -> tuple[np.ndarray, float]:
    """The scaled grid X [n, 2] and the scale factor (released units per grid unit)."""
    g = np.linspace(0.0, SPAN, GRID)
    X0 = np.stack(np.meshgrid(g, g, indexing="ij"), axis=-1).reshape(-1, 2)
    scale = SIGMA_TARGET / centred_sigma_min(X0)
    return X0 * scale, float(scale)


def _grid_factor() -> np.ndarray:
    """L1 [100, 100] with L1 L1^T = k(g, g) (eigen-square-root; the 1-D kernel matrix is singular)."""
    g = np.linspace(0.0, SPAN, GRID)
    K1 = se_from_sqdist((g[:, None] - g[None, :]) ** 2, sq_scale=LENGTHSCALE**2)
    lam, Q = np.linalg.eigh(K1)
    L1: np.ndarray = Q * np.sqrt(np.clip(lam, 0.0, None))
    return L1


def sample_f(rng: np.random.Generator, L1: np.ndarray) -> np.ndarray:
    """f ~ GP(0, k) on the grid, exactly: K = K1 (x) K1, so vec(L1 W L1^T) has covariance K. Standardised."""
    F = L1 @ rng.standard_normal((GRID, GRID)) @ L1.T
    f = F.reshape(-1)
    out: np.ndarray = (f - f.mean()) / f.std()
    return out


def settings(quick: bool) -> list[Setting]:
    pairs: list[tuple[float, int]] = [(e, 10) for e in FIG2A_EPS]
    if not quick:
        pairs += [(e, r) for e, rs in SWEEPS.items() for r in rs if (e, r) not in pairs]
    out: list[Setting] = []
    for mode in MODES:
        out.append(Setting("gp-ucb", mode, None, None))
        out += [Setting("gaussian", mode, e, None) for e in ((1.1,) if quick else FIG2A_EPS)]
        out += [Setting("po-gp-ucb", mode, e, r) for e, r in pairs]
    return out


def _bo_run(
    inputs: np.ndarray, f: np.ndarray, init: int, mode: str, lengthscale: float, rng: np.random.Generator
) -> np.ndarray:
    """One GP-UCB run (repeats allowed, as in the paper); returns S_1..S_T."""
    if mode == "transfer":
        hp = Hyperparameters(LENGTHSCALE * lengthscale, 1.0, NOISE_VARIANCE)
        strategy = GPUCB(
            inputs, hyperparameters=hp, exclude_queried=False, prior_mean="zero", delta_prime=DELTA_PRIME
        )
    else:
        strategy = GPUCB(inputs, hyperparameters="mle", exclude_queried=False, delta_prime=DELTA_PRIME)
    noise = math.sqrt(NOISE_VARIANCE)
    strategy.observe(init, float(f[init] + noise * rng.standard_normal()))
    best = f[init]
    regret = np.empty(T)
    f_max = f.max()
    for t in range(T):
        i = strategy.suggest().index
        strategy.observe(i, float(f[i] + noise * rng.standard_normal()))
        best = max(best, f[i])
        regret[t] = f_max - best
    return regret


def one_run(args: tuple[int, int, Sequence[Setting]]) -> dict[Setting, tuple[np.ndarray, bool | None]]:
    """Every setting on one fresh (f, initial row, M) draw."""
    seed, run, todo = args
    rng = np.random.default_rng([seed, run])
    X, scale = grid_inputs()
    f = sample_f(rng, _grid_factor())
    init = int(rng.integers(X.shape[0]))
    releases: dict[tuple[float, int], tuple[np.ndarray, bool]] = {}
    noisy: dict[float, np.ndarray] = {}
    out: dict[Setting, tuple[np.ndarray, bool | None]] = {}
    for s in todo:
        lifted: bool | None = None
        inputs = X
        if s.algorithm == "gaussian":
            assert s.log_eps is not None
            if s.log_eps not in noisy:
                rng_rel = np.random.default_rng([seed, run, 99, int(s.log_eps * 10)])
                noisy[s.log_eps] = gaussian_release(
                    X, epsilon=math.exp(s.log_eps), delta=DELTA, rng=rng_rel
                ).Z
            inputs = noisy[s.log_eps]
        elif s.algorithm == "po-gp-ucb":
            assert s.log_eps is not None and s.r is not None
            key = (s.log_eps, s.r)
            if key not in releases:
                rel = release_projection(
                    X,
                    epsilon=math.exp(s.log_eps),
                    delta=DELTA,
                    r=s.r,
                    rng=np.random.default_rng([seed, run, s.r, int(s.log_eps * 10)]),
                )
                releases[key] = (rel.Z, rel.lifted)
            inputs, lifted = releases[key]
        bo_rng = np.random.default_rng([seed, run, 7])
        out[s] = (_bo_run(inputs, f, init, s.mode, scale, bo_rng), lifted)
    return out


def run_benchmark(
    runs: int, *, quick: bool = False, seed: int = 0, workers: int = 2, progress: Any = None
) -> dict[str, Any]:
    todo = settings(quick)
    X, scale = grid_inputs()
    s_min = centred_sigma_min(X)
    curves: dict[Setting, list[np.ndarray]] = {s: [] for s in todo}
    lifted: dict[Setting, bool | None] = {}
    jobs = [(seed, run, todo) for run in range(runs)]
    for res in map_runs(one_run, jobs, workers):
        for s, (curve, lf) in res.items():
            curves[s].append(curve)
            lifted[s] = lf
        if progress:
            progress()
    results_json = []
    for s in todo:
        C = np.vstack(curves[s])
        results_json.append(
            {
                "algorithm": s.algorithm,
                "hyperparameters": s.mode,
                "epsilon": s.epsilon,
                "log_epsilon": s.log_eps,
                "r": s.r,
                "lifted": lifted[s],
                "omega": None if s.r is None else omega(s.r, math.exp(s.log_eps or 0.0), DELTA),
                "noise_std": (
                    calibrate(math.exp(s.log_eps), DELTA, 2).sigma
                    if s.algorithm == "gaussian" and s.log_eps is not None
                    else None
                ),
                "formal_guarantee": s.algorithm == "gaussian",
                "runs": int(C.shape[0]),
                "simple_regret_mean": C.mean(0).tolist(),
                "simple_regret_se": (
                    C.std(0, ddof=1) / math.sqrt(C.shape[0]) if C.shape[0] > 1 else np.zeros(T)
                ).tolist(),
            }
        )
    return {
        "settings": {
            "grid": [GRID, GRID],
            "n": GRID * GRID,
            "d": 2,
            "span_grid_units": SPAN,
            "scale_factor": scale,
            "sigma_min": s_min,
            "lengthscale_grid_units": LENGTHSCALE,
            "lengthscale_released_units": LENGTHSCALE * scale,
            "signal_variance": 1.0,
            "noise_variance": NOISE_VARIANCE,
            "delta": DELTA,
            "delta_prime": DELTA_PRIME,
            "T": T,
            "runs": runs,
            "seed": seed,
            "quick": quick,
            "initial_points": 1,
            "repeats_allowed": True,
        },
        "results": results_json,
    }


def _final(
    results: list[dict[str, Any]],
    algorithm: str,
    mode: str,
    log_eps: float | None = None,
    r: int | None = None,
) -> dict[str, Any] | None:
    for item in results:
        if (item["algorithm"], item["hyperparameters"], item["r"]) == (algorithm, mode, r) and (
            log_eps is None or (item["log_epsilon"] is not None and abs(item["log_epsilon"] - log_eps) < 1e-9)
        ):
            return item
    return None


def markdown(report: dict[str, Any]) -> str:
    """Fig. 2a final values and Tables 1-3, S_50 mean +- s.e., transfer and mle, beside the paper's."""
    res = report["results"]
    lines = [
        "# Synthetic GP benchmark (PO-GP-UCB, paper Section 4)",
        "",
        f"runs = {report['settings']['runs']}, sigma_min = {report['settings']['sigma_min']:.1f}, "
        f"T = {T}; S_{T} in units of sigma_y (mean +- standard error).",
        "",
    ]

    def cell(item: dict[str, Any] | None) -> str:
        if item is None:
            return "-"
        return f"{item['simple_regret_mean'][-1]:.3f} +- {item['simple_regret_se'][-1]:.3f}"

    lines += [
        "## Fig. 2a (r = 10)",
        "",
        "| algorithm | eps | lifted | transfer | mle |",
        "|---|---|---|---|---|",
    ]
    base = {m: _final(res, "gp-ucb", m) for m in MODES}
    lines.append(f"| GP-UCB (non-private, on X) | - | - | {cell(base['transfer'])} | {cell(base['mle'])} |")
    for e in FIG2A_EPS:
        items = {m: _final(res, "po-gp-ucb", m, e, 10) for m in MODES}
        lf = items["transfer"]["lifted"] if items["transfer"] else None
        lines.append(f"| PO-GP-UCB | e^{e} | {lf} | {cell(items['transfer'])} | {cell(items['mle'])} |")
    lines += [
        "",
        "## The Gaussian release (formally (eps, delta)-DP) vs eps, beside GP-UCB on X",
        "",
        "| algorithm | eps | noise std | transfer | mle |",
        "|---|---|---|---|---|",
        f"| GP-UCB (non-private, on X) | - | - | {cell(base['transfer'])} | {cell(base['mle'])} |",
    ]
    for e in FIG2A_EPS:
        items = {m: _final(res, "gaussian", m, e) for m in MODES}
        std = items["transfer"]["noise_std"] if items["transfer"] else None
        std_cell = "-" if std is None else f"{std:.2f}"
        lines.append(f"| Gaussian | e^{e} | {std_cell} | {cell(items['transfer'])} | {cell(items['mle'])} |")
    for k, (e, rs) in enumerate(SWEEPS.items(), start=1):
        items_any = [_final(res, "po-gp-ucb", "transfer", e, r) for r in rs]
        if not any(items_any):
            continue
        lines += [
            "",
            f"## Table {k} (eps = e^{e})",
            "",
            "| r | omega | lifted | paper | transfer | mle |",
            "|---|---|---|---|---|---|",
        ]
        for r in rs:
            items = {m: _final(res, "po-gp-ucb", m, e, r) for m in MODES}
            lf = items["transfer"]["lifted"] if items["transfer"] else None
            lines.append(
                f"| {r} | {omega(r, math.exp(e), DELTA):.0f} | {lf} | {PAPER_TABLES[e][r]} | "
                f"{cell(items['transfer'])} | {cell(items['mle'])} |"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Fig. 2a: simple regret vs iteration, GP-UCB and PO-GP-UCB (r = 10) per eps, one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    fig, grid = plt.subplots(2, 2, figsize=(11, 8.4), sharey=True)
    t = np.arange(1, T + 1)
    rows = [  # (algorithm, panel title, r of its curves)
        ("po-gp-ucb", "PO-GP-UCB (no guarantee), r = 10", 10),
        ("gaussian", "Gaussian release (formal DP)", None),
    ]
    for axes, (name, title, r) in zip(grid, rows, strict=True):
        for ax, mode in zip(axes, MODES, strict=True):
            items = [("GP-UCB", _final(res, "gp-ucb", mode))]
            items += [(f"{name} eps=e^{e}", _final(res, name, mode, e, r)) for e in FIG2A_EPS]
            for label, item in items:
                if item is None:
                    continue
                m, se = np.array(item["simple_regret_mean"]), np.array(item["simple_regret_se"])
                ax.plot(t, m, label=label, lw=2 if label == "GP-UCB" else 1.4)
                ax.fill_between(t, m - se, m + se, alpha=0.15)
            ax.set_title(f"{title}; hyper-parameters: {mode}", fontsize=9)
            ax.set_xlabel("iteration t")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("simple regret S_t (units of sigma_y)")
        axes[1].legend(fontsize=8)
    save_figure(fig, path)


def main(
    *,
    runs: int,
    json_path: Path | None,
    plot_path: Path | None,
    quick: bool,
    seed: int,
    workers: int,
) -> dict[str, Any]:
    """The paper's experiment (``pobo bench synthetic``; ``--strategies``:
    ``shared.tools.bench.strategies``)."""
    from rich.markdown import Markdown

    if quick:
        runs = min(runs, 2)
    n_settings = len(settings(quick))
    return bench_main(
        lambda advance: run_benchmark(runs, quick=quick, seed=seed, workers=workers, progress=advance),
        label="synthetic GP",
        runs=runs,
        show=lambda report: [Markdown(markdown(report)), f"{n_settings} settings x {runs} runs"],
        json_path=json_path,
        markdown=markdown,
        plot=plot,
        plot_path=plot_path,
    )
