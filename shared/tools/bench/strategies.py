"""``pobo bench synthetic --strategies gp-ucb,gp-bucb,random``: the modeler's
registry strategies (``shared.bo.strategies``) run through their round interface (``initial_state`` /
``plan`` / ``observe``, the plan's generator ``round_rng``) on the same f draws, on the grid itself and on
the Gaussian release at eps = e^1.1, with ``transfer`` (fixed) or ``mle`` hyper-parameters, as the service
runs them (distinct rows, empirical prior mean, the study's random initial row shared by gp-ucb and
gp-bucb). A budget of Q queries in total (initial row included); simple regret after each query and after
each round: GP-BUCB with batch k (Desautels et al. 2014, Alg. 1) uses about Q / k rounds where GP-UCB and
random search use Q.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shared.bo.strategies import Answer, get_strategy, parse_params, round_rng
from shared.privacy.gaussian import gaussian_release
from shared.tools.bench.pool import map_runs
from shared.tools.bench.report import bench_main, save_figure
from shared.tools.bench.synthetic import (
    DELTA,
    GRID,
    LENGTHSCALE,
    NOISE_VARIANCE,
    T,
    _grid_factor,
    grid_inputs,
    sample_f,
)

STRATEGIES = ("gp-ucb", "gp-bucb", "random")
#: (inputs, hyper-parameter mode) the GP strategies are compared on; random search ignores both.
STRATEGY_SETTINGS: tuple[tuple[str, str], ...] = (
    ("grid", "transfer"),
    ("grid", "mle"),
    ("gaussian", "transfer"),
    ("gaussian", "mle"),
)
QUICK_STRATEGY_SETTINGS: tuple[tuple[str, str], ...] = (("grid", "mle"),)
STRATEGY_LOG_EPS = 1.1  # the Gaussian release's eps (the paper's smallest feasible setting at r = 10)


def strategy_cases(strategies: Sequence[str], quick: bool) -> list[tuple[str, str | None, str | None]]:
    """(strategy, inputs, mode) to run: the GP strategies on every setting, random search once."""
    cases: list[tuple[str, str | None, str | None]] = []
    for name in strategies:
        if name == "random":
            cases.append((name, None, None))
        else:
            cases += [(name, i, m) for i, m in (QUICK_STRATEGY_SETTINGS if quick else STRATEGY_SETTINGS)]
    return cases


def _strategy_params(name: str, mode: str | None, batch_size: int, scale: float) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    if name in ("gp-ucb", "gp-bucb") and mode == "transfer":
        raw["hyperparameters"] = {
            "lengthscale": LENGTHSCALE * scale,
            "signal_variance": 1.0,
            "noise_variance": NOISE_VARIANCE,
        }
    if name == "gp-bucb":
        raw["batch_size"] = batch_size
    return raw


def strategy_run(
    inputs: np.ndarray,
    f: np.ndarray,
    name: str,
    raw_params: dict[str, Any],
    queries: int,
    *,
    state_seed: Sequence[int],
    noise_seed: Sequence[int],
    round_seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """One study through the registry interface: simple regret after each query [Q] and each round."""
    cls = get_strategy(name)
    params = parse_params(name, raw_params)
    n = inputs.shape[0]
    state = cls.initial_state(params, n=n, budget=queries, rng=np.random.default_rng(list(state_seed)))
    strategy = cls(inputs, params, state)
    noise_rng = np.random.default_rng(list(noise_seed))
    noise = math.sqrt(NOISE_VARIANCE)
    f_max, best = float(f.max()), -math.inf
    by_query: list[float] = []
    by_round: list[float] = []
    while len(by_query) < queries:
        requests = strategy.plan(budget=queries - len(by_query), rng=round_rng(round_seed, len(by_round)))
        answers = []
        for request in requests:
            best = max(best, float(f[request.index]))
            by_query.append(f_max - best)
            answers.append(Answer(request, float(f[request.index] + noise * noise_rng.standard_normal())))
        strategy.observe(answers)
        by_round.append(f_max - best)
    return np.array(by_query), np.array(by_round)


def one_strategy_run(
    args: tuple[int, int, Sequence[tuple[str, str | None, str | None]], int, int],
) -> dict[tuple[str, str | None, str | None], tuple[np.ndarray, np.ndarray]]:
    """Every (strategy, inputs, mode) on one fresh f (the same f as ``one_run`` for this seed and run)."""
    seed, run, cases, batch_size, queries = args
    rng = np.random.default_rng([seed, run])
    X, scale = grid_inputs()
    f = sample_f(rng, _grid_factor())
    release = None
    if any(inputs == "gaussian" for _, inputs, _ in cases):
        rng_rel = np.random.default_rng([seed, run, 99, int(STRATEGY_LOG_EPS * 10)])
        release = gaussian_release(X, epsilon=math.exp(STRATEGY_LOG_EPS), delta=DELTA, rng=rng_rel).Z
    round_seed = int(np.random.default_rng([seed, run, 11]).integers(2**62))
    out = {}
    for case in cases:
        name, inputs, mode = case
        Z = release if inputs == "gaussian" else X
        assert Z is not None
        out[case] = strategy_run(
            Z,
            f,
            name,
            _strategy_params(name, mode, batch_size, scale),
            queries,
            state_seed=(seed, run, 5),  # the same initial row for gp-ucb and gp-bucb: a paired comparison
            noise_seed=(seed, run, 7),
            round_seed=round_seed,
        )
    return out


def _mean_se(curves: list[np.ndarray]) -> dict[str, list[float]]:
    """Mean and standard error over runs; a shorter curve (a run that ended in fewer rounds) keeps its
    final value."""
    width = max(c.size for c in curves)
    C = np.vstack([np.pad(c, (0, width - c.size), mode="edge") for c in curves])
    se = C.std(0, ddof=1) / math.sqrt(C.shape[0]) if C.shape[0] > 1 else np.zeros(width)
    return {"mean": C.mean(0).tolist(), "se": se.tolist()}


def run_strategy_benchmark(
    runs: int,
    *,
    strategies: Sequence[str] = STRATEGIES,
    batch_size: int = 5,
    queries: int = T,
    quick: bool = False,
    seed: int = 0,
    workers: int = 2,
    progress: Any = None,
) -> dict[str, Any]:
    """Regret by query and by round of the registry strategies (see the module docstring)."""
    for name in strategies:
        get_strategy(name)  # InputDataError listing the registry
    if queries < 1:
        raise ValueError(f"queries must be >= 1, got {queries}")
    cases = strategy_cases(strategies, quick)
    by_query: dict[tuple[str, str | None, str | None], list[np.ndarray]] = {c: [] for c in cases}
    by_round: dict[tuple[str, str | None, str | None], list[np.ndarray]] = {c: [] for c in cases}
    jobs = [(seed, run, cases, batch_size, queries) for run in range(runs)]

    def collect(res: dict[tuple[str, str | None, str | None], tuple[np.ndarray, np.ndarray]]) -> None:
        for case, (q, r) in res.items():
            by_query[case].append(q)
            by_round[case].append(r)
        if progress:
            progress()

    for res in map_runs(one_strategy_run, jobs, workers):
        collect(res)
    _, scale = grid_inputs()
    results = []
    for case in cases:
        name, inputs, mode = case
        rounds = [c.size for c in by_round[case]]
        results.append(
            {
                "strategy": name,
                "inputs": inputs,
                "epsilon": math.exp(STRATEGY_LOG_EPS) if inputs == "gaussian" else None,
                "hyperparameters": mode,
                "params": _strategy_params(name, mode, batch_size, scale),
                "runs": runs,
                "queries": queries,
                "rounds": max(rounds),
                "rounds_min": min(rounds),
                "regret_by_query": _mean_se(by_query[case]),
                "regret_by_round": _mean_se(by_round[case]),
            }
        )
    return {
        "settings": {
            "n": GRID * GRID,
            "d": 2,
            "queries": queries,
            "batch_size": batch_size,
            "strategies": list(strategies),
            "inputs": ["grid"] + ([] if quick else [f"gaussian eps=e^{STRATEGY_LOG_EPS}"]),
            "noise_variance": NOISE_VARIANCE,
            "runs": runs,
            "seed": seed,
            "quick": quick,
        },
        "strategies": results,
    }


def _case_label(item: dict[str, Any]) -> str:
    if item["inputs"] is None:
        return str(item["strategy"])
    inputs = "grid" if item["inputs"] == "grid" else f"gaussian e^{STRATEGY_LOG_EPS}"
    return f"{item['strategy']} ({inputs}, {item['hyperparameters']})"


def strategy_checkpoints(report: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Queries and rounds at which the table reports the simple regret."""
    q, k = report["settings"]["queries"], report["settings"]["batch_size"]
    batch_rounds = math.ceil(q / k)
    query_points = sorted({max(1, q // 5), max(1, q // 2), q})
    round_points = sorted({max(1, batch_rounds // 2), batch_rounds, q})
    return query_points, round_points


def strategy_rows(report: dict[str, Any], sep: str = " +- ") -> tuple[list[str], list[list[str]]]:
    """Header and rows of the strategy table: S after q queries and after r rounds (mean +- s.e.)."""
    query_points, round_points = strategy_checkpoints(report)
    header = ["strategy", "rounds"]
    header += [f"S @ {q} queries" for q in query_points] + [f"S @ {r} rounds" for r in round_points]
    rows = []
    for item in report["strategies"]:

        def cell(curve: dict[str, list[float]], at: int) -> str:
            if at > len(curve["mean"]):
                return "-"  # the budget was spent in fewer rounds
            return f"{curve['mean'][at - 1]:.3f}{sep}{curve['se'][at - 1]:.3f}"

        row = [_case_label(item), str(item["rounds"])]
        row += [cell(item["regret_by_query"], q) for q in query_points]
        row += [cell(item["regret_by_round"], r) for r in round_points]
        rows.append(row)
    return header, rows


def strategy_markdown(report: dict[str, Any]) -> str:
    st = report["settings"]
    header, rows = strategy_rows(report)
    lines = [
        "# Registry strategies on the synthetic GP (simple regret, units of sigma_y)",
        "",
        f"runs = {st['runs']}, n = {st['n']}, Q = {st['queries']} queries, gp-bucb batch k = "
        f"{st['batch_size']}; mean +- standard error; '-' = budget spent in fewer rounds.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def strategy_table(report: dict[str, Any]) -> Any:
    """The strategy comparison as a rich Table."""
    from rich.table import Table

    st = report["settings"]
    _, rows = strategy_rows(report, sep=" ±")  # wraps to two lines in a narrow terminal
    query_points, round_points = strategy_checkpoints(report)
    table = Table(
        title=f"Simple regret S (units of sigma_y) after q queries / r rounds: mean±s.e. over {st['runs']} "
        f"runs; Q = {st['queries']} queries, gp-bucb k = {st['batch_size']}"
    )
    table.add_column("strategy", ratio=2)
    table.add_column("rounds", justify="right")
    for name in [f"q={q}" for q in query_points] + [f"r={r}" for r in round_points]:
        table.add_column(name, justify="right", ratio=1)
    for row in rows:
        table.add_row(*row)
    return table


def plot_strategies(report: dict[str, Any], path: Path) -> None:
    """Simple regret vs queries and vs rounds (two panels per inputs/mode setting), mean +- s.e."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = report["strategies"]
    settings_ = list(
        dict.fromkeys((i["inputs"], i["hyperparameters"]) for i in items if i["inputs"] is not None)
    )
    settings_ = settings_ or [(None, None)]
    baselines = [i for i in items if i["inputs"] is None]
    fig, grid = plt.subplots(len(settings_), 2, figsize=(11, 3.8 * len(settings_)), squeeze=False)
    for axes, (inputs, mode) in zip(grid, settings_, strict=True):
        chosen = [i for i in items if (i["inputs"], i["hyperparameters"]) == (inputs, mode)] + baselines
        for ax, key, xlabel in zip(
            axes, ("regret_by_query", "regret_by_round"), ("queries", "rounds"), strict=True
        ):
            for item in chosen:
                m, se = np.array(item[key]["mean"]), np.array(item[key]["se"])
                x = np.arange(1, m.size + 1)
                label = item["strategy"] + (
                    f" (k={report['settings']['batch_size']})" if item["strategy"] == "gp-bucb" else ""
                )
                ax.plot(x, m, label=label, lw=1.6)
                ax.fill_between(x, m - se, m + se, alpha=0.15)
            where = (
                ""
                if inputs is None
                else (f"{inputs}, {mode}" if inputs == "grid" else f"{inputs} e^{STRATEGY_LOG_EPS}, {mode}")
            )
            ax.set_title(f"simple regret vs {xlabel}; {where}", fontsize=9)
            ax.set_xlabel(xlabel)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("simple regret (units of sigma_y)")
        axes[1].legend(fontsize=8)
    save_figure(fig, path)


def main(
    *,
    runs: int,
    strategies: Sequence[str],
    json_path: Path | None,
    plot_path: Path | None,
    quick: bool,
    seed: int,
    workers: int,
    batch_size: int = 5,
    queries: int = T,
) -> dict[str, Any]:
    """``pobo bench synthetic --strategies``: the registry strategies compared on the paper's functions."""
    if quick:
        runs = min(runs, 2)
    return bench_main(
        lambda advance: run_strategy_benchmark(
            runs,
            strategies=strategies,
            batch_size=batch_size,
            queries=queries,
            quick=quick,
            seed=seed,
            workers=workers,
            progress=advance,
        ),
        label="strategies",
        runs=runs,
        show=lambda report: [strategy_table(report)],
        json_path=json_path,
        markdown=strategy_markdown,
        plot=plot_strategies,
        plot_path=plot_path,
    )
