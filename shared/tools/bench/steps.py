"""``pobo bench steps``: the cost of one step of every strategy at n = 100 000 (issue 18, deliverable 4).

Each registry strategy runs in-process through the modeler's round interface (``initial_state``, then
``plan`` / ``observe`` per round, the plan's generator ``round_rng``), answered from a synthetic objective,
so what is timed is exactly the modeler's arithmetic of a round (no HTTP, no database):

* row strategies on a release Z of n = 100 000 rows, r = 15: ``gp-ucb``, ``gp-bucb`` (batches of 5),
  ``tgp-ucb``, ``ldp-tgp-ucb``, ``ata-gp-ucb``, ``ldp-ata-gp-ucb``, ``moma-gp-ucb``, ``ldp-moma-gp-ucb``
  (epochs of k = 5 plays) and ``random``, each for ``queries`` queries (default 50), fixed hyper-parameters
  (the MLE refits of gp-ucb are a schedule, not a step);
* ``dp-gibo`` on a d = 20 box: the modeler's acquisition (``plan``: the batch of b = d + 1 points minimising
  alpha) and the curator's oracle over n = 100 000 rows (``oracle_gradient`` on the Gaussian-location loss:
  the loss matrix [m, n] and the clipped, noised gradient), each step;
* the DP-FTS-DE agent step (Dai et al. 2021, Alg. 2 lines 4-10) in d = 2 with M = 50 features: its argmax over
  n candidates (a scrambled Sobol set: 2^17 = 131 072 points, the power of two at or above n) refined by
  L-BFGS-B, and its submission omega_{n,t} ~ N(nu_t, lambda Sigma_t^-1).

Each row strategy runs three times and the better of the last two is reported (the first also pays for
faulting in fresh memory for its factor -- on a virtual machine whose host backs guest memory lazily, ~2 ms
per MB -- which a long-running modeler pays once; its figure is kept as ``first_run_ms_per_query_tail``).
Reported per strategy: milliseconds per query over the last ``tail`` queries (the steady cost at t near T:
the GP strategies' cost grows with t), over all queries, and the cost formula.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shared.bo.strategies import Answer, get_strategy, parse_params, round_rng
from shared.tools.bench.report import publish

N, R = 100_000, 15

#: (registry name, parameters, cost per query with n rows, t observations, r columns)
ROW_STRATEGIES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("gp-ucb", {"hyperparameters": {"lengthscale": 3.0, "signal_variance": 1.0, "noise_variance": 1e-2}},
     "O(n (t + r)): one kernel row, one factor row (reads the t x n factor once), UCB over n"),
    ("gp-bucb", {"hyperparameters": {"lengthscale": 3.0, "signal_variance": 1.0, "noise_variance": 1e-2},
                 "batch_size": 5},
     "O(n (t + r + B)) per query: hallucinated variance updates from the stored factor, B = 5 a round"),
    ("tgp-ucb", {"B": 1.0, "v": 1.0, "lengthscale": 3.0}, "O(n (t + r)): as gp-ucb, on truncated rewards"),
    ("ldp-tgp-ucb", {"epsilon": 1.0, "B": 1.0, "R": 1.0, "lengthscale": 3.0},
     "O(n (t + r)): as gp-ucb, rewards truncated at b_t"),
    ("ata-gp-ucb", {"B": 1.0, "v": 1.0, "lengthscale": 3.0},
     "O(n m r + n m^2 + m^3) a round: Nystrom dictionary of m points resampled, UCB over n"),
    ("ldp-ata-gp-ucb", {"epsilon": 1.0, "B": 1.0, "R": 1.0, "lengthscale": 3.0},
     "O(n m r + n m^2 + m^3) a round, as ata-gp-ucb"),
    ("moma-gp-ucb", {"B": 1.0, "v": 1.0, "k": 5, "lengthscale": 3.0},
     "O(n m (m + r) + n m k) an epoch of k plays, per query / k"),
    ("ldp-moma-gp-ucb", {"epsilon": 1.0, "B": 1.0, "R": 1.0, "k": 5, "lengthscale": 3.0},
     "O(n m (m + r) + n m k) an epoch of k plays, per query / k"),
    ("random", {}, "O(n): one scan for the rows not queried yet"),
)  # fmt: skip


def _objective(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, R))
    f = np.sin(Z @ rng.standard_normal(R) / 2.0) + 0.1 * Z[:, 0]
    return Z, f


def bench_row_strategy(
    name: str, raw: dict[str, Any], Z: np.ndarray, f: np.ndarray, *, queries: int, tail: int, seed: int
) -> dict[str, Any]:
    """One strategy for ``queries`` queries; seconds of plan + observe per round, per query."""
    cls = get_strategy(name)
    params = parse_params(name, raw)
    n = Z.shape[0]
    state = cls.initial_state(params, n=n, budget=queries, rng=np.random.default_rng(seed))
    strategy = cls(Z, params, state)
    noise = np.random.default_rng(seed + 1)
    per_query: list[float] = []
    rounds = 0
    while len(per_query) < queries:
        t0 = time.perf_counter()
        requests = strategy.plan(budget=queries - len(per_query), rng=round_rng(seed, rounds))
        answers = [Answer(q, float(f[q.index] + 0.05 * noise.standard_normal())) for q in requests]
        strategy.observe(answers)
        seconds = time.perf_counter() - t0
        per_query += [seconds / len(requests)] * len(requests)
        rounds += 1
    return {
        "queries": len(per_query),
        "rounds": rounds,
        "ms_per_query_tail": 1e3 * float(np.mean(per_query[-tail:])),
        "ms_per_query_mean": 1e3 * float(np.mean(per_query)),
        "ms_per_query_max": 1e3 * float(np.max(per_query)),
    }


def bench_dp_gibo(n: int, *, d: int = 20, steps: int = 10, seed: int = 0) -> dict[str, Any]:
    """dp-gibo on a d-dimensional box: the modeler's plan (acquisition), the curator's oracle over n rows."""
    from shared.bo.gibo.oracle import builtin_loss_matrix, kernel_from_spec, oracle_gradient
    from shared.bo.strategies.base import GradientAnswer, GradientDomain

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) + 1.0
    domain = GradientDomain(dimension=d, bounds=tuple((-3.0, 3.0) for _ in range(d)), steps=steps)
    cls = get_strategy("dp-gibo")
    params = parse_params("dp-gibo", {"kernel": {"kind": "se"}})
    strategy = cls(domain, params, cls.initial_state(params, n=0, budget=steps, rng=rng))
    loss = builtin_loss_matrix("gaussian-location", X)
    noise = np.random.default_rng(seed + 1)
    plan_s, oracle_s, design = [], [], np.empty((0, d))
    for step in range(steps):
        t0 = time.perf_counter()
        (request,) = strategy.plan(budget=steps - step, rng=round_rng(seed, step))
        plan_s.append(time.perf_counter() - t0)
        design = np.vstack([design, np.asarray(request.points, dtype=np.float64)])
        t0 = time.perf_counter()
        g = oracle_gradient(
            loss,
            n=n,
            row_width=d,
            theta=request.theta,
            design=design,
            bounds=domain.array(),
            kernel=kernel_from_spec(request.kernel),
            clip=1.0,
            steps=steps,
            mu=1.0,
            rng=noise,
            jitter=request.jitter,
        )
        oracle_s.append(time.perf_counter() - t0)
        strategy.observe([GradientAnswer(request, tuple(float(v) for v in g), step + 1)])
    return {
        "d": d,
        "n": n,
        "steps": steps,
        "batch": int(len(request.points)),
        "plan_ms_mean": 1e3 * float(np.mean(plan_s)),
        "plan_ms_last": 1e3 * plan_s[-1],
        "oracle_ms_mean": 1e3 * float(np.mean(oracle_s)),
        "oracle_ms_last": 1e3 * oracle_s[-1],
        "formula": "plan: L-BFGS-B over the b x d batch, alpha O(m^2 b) an evaluation (m design points); "
        "oracle: O(m n d), the loss matrix [m, n] and the clipped per-row gradients",
    }


def bench_fts_agent(n: int, *, rounds: int = 10, M: int = 50, d: int = 2, seed: int = 0) -> dict[str, Any]:
    """The DP-FTS-DE agent step (choose_query over n candidates, then agent_submission), ``rounds`` times."""
    from shared.federated.agent_step import agent_submission, choose_query
    from shared.federated.regions import split_box
    from shared.federated.rff import draw_rff

    rng = np.random.default_rng(seed)
    rff = draw_rff(d, M, 0.2, rng=rng)
    regions = split_box(np.zeros(d), np.ones(d), 2)
    X = rng.random((10, d))
    y = np.sin(3 * X).sum(1)
    aggregates = rng.standard_normal((regions.P, M)) * 0.1
    choose_s, submit_s = [], []
    for t in range(1, rounds + 1):
        t0 = time.perf_counter()
        choice = choose_query(
            t, rff, X, y, aggregates if t > 1 else None, regions, rng=rng, n_candidates=n, lam=0.01
        )
        choose_s.append(time.perf_counter() - t0)
        X = np.vstack([X, choice.x])
        y = np.append(y, float(np.sin(3 * choice.x).sum()))
        t0 = time.perf_counter()
        agent_submission(rff, X, y, rng=rng, lam=0.01)
        submit_s.append(time.perf_counter() - t0)
    return {
        "n_candidates": 2 ** max(0, math.ceil(math.log2(n))),
        "M": M,
        "d": d,
        "rounds": rounds,
        "choose_ms_mean": 1e3 * float(np.mean(choose_s)),
        "submit_ms_mean": 1e3 * float(np.mean(submit_s)),
        "formula": "choose: O(n M d) features of the candidates, L-BFGS-B from 5 starts; "
        "submit: O(t M^2 + M^3)",
    }


def run_benchmark(
    *,
    n: int = N,
    queries: int = 50,
    tail: int = 10,
    seed: int = 0,
    gibo_dimension: int = 20,
    gibo_steps: int = 10,
    on_result: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every strategy at n rows (see the module docstring); ``on_result(name)`` after each."""
    load_before = list(os.getloadavg())
    Z, f = _objective(n, seed)
    rows: dict[str, Any] = {}
    for name, raw, formula in ROW_STRATEGIES:
        runs = [bench_row_strategy(name, raw, Z, f, queries=queries, tail=tail, seed=seed) for _ in range(3)]
        best = min(runs[1:], key=lambda run: run["ms_per_query_tail"])  # runs[0]: fresh memory (see above)
        rows[name] = {**best, "formula": formula, "first_run_ms_per_query_tail": runs[0]["ms_per_query_tail"]}
        if on_result:
            on_result(name)
    gibo = bench_dp_gibo(n, d=gibo_dimension, steps=gibo_steps, seed=seed)
    if on_result:
        on_result("dp-gibo")
    agent = bench_fts_agent(n, seed=seed)
    if on_result:
        on_result("dp-fts-de agent")
    return {"n": n, "r": R, "queries": queries, "tail": tail, "seed": seed, "rows": rows, "dp_gibo": gibo,
            "fts_agent": agent, "load_before": load_before}  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    """The per-strategy table of docs/benchmarks.md."""
    q, tail = report["queries"], report["tail"]
    lines = [
        f"| strategy (n = {report['n']:,}) | ms per query, last {tail} of {q} | mean | cost |",
        "|---|---|---|---|",
    ]
    for name, row in report["rows"].items():
        lines.append(
            f"| {name} | {row['ms_per_query_tail']:.2f} | {row['ms_per_query_mean']:.2f} | {row['formula']} |"
        )
    g, a = report["dp_gibo"], report["fts_agent"]
    step = a["choose_ms_mean"] + a["submit_ms_mean"]
    lines.append(
        f"| dp-gibo acquisition (d = {g['d']}, b = {g['batch']}) | {g['plan_ms_last']:.1f} | "
        f"{g['plan_ms_mean']:.1f} | {g['formula'].split(';')[0]} |"
    )
    lines.append(
        f"| dp-gibo curator oracle (n = {g['n']:,} rows) | {g['oracle_ms_last']:.1f} | "
        f"{g['oracle_ms_mean']:.1f} | {g['formula'].split(';')[1].strip()} |"
    )
    lines.append(
        f"| dp-fts-de agent step ({a['n_candidates']:,} candidates, M = {a['M']}) | {step:.1f} | "
        f"{step:.1f} | {a['formula']} |"
    )
    return "\n".join(lines)


def main(
    *, json_path: Path | None, n: int, queries: int, seed: int, gibo_dimension: int = 20, gibo_steps: int = 10
) -> dict[str, Any]:
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console()
    with console.status("timing each strategy's steps...") as status:
        report = run_benchmark(
            n=n,
            queries=queries,
            tail=min(10, queries),
            seed=seed,
            gibo_dimension=gibo_dimension,
            gibo_steps=gibo_steps,
            on_result=lambda s: status.update(f"done: {s}"),
        )
    return publish(console, report, show=[Markdown(markdown(report))], json_path=json_path)
