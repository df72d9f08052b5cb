"""``pobo bench scale``: the GP-UCB loop on a Dask LocalCluster against the local loop, in one run, and a
model of n = 10^8 on a stated cluster (issue 36).

For each n (default 10^6 and 4 x 10^6; Z [n, 15] from a fixed seed; fixed hyper-parameters so that both loops
do the same arithmetic), both loops observe one row and then make T choices (GP-UCB, PO-GP-UCB Alg. 2). The
benchmark checks that they make the same choices with the same acquisition values bit for bit, and reports
the median time per step of each, the Dask overhead per step (Dask's minus the local one), the memory of
every worker process, and the time each partition spends computing (measured on the workers).

The model of a larger run (``predict``), with its inputs in the report:

    step(n, P) = c n / P + o P + b

with c the measured compute per candidate and step (the median partition time over its candidates, at the
run's mean t; the step's work grows linearly in t, so c is quoted at t = T / 2 and scaled by t), o the
measured overhead per partition and step (the Dask overhead over the partitions of the measured run), and b
the broadcast of one ``StepMessage`` (8 (t + r) bytes) at the stated network bandwidth plus one round trip.
Memory per worker: 8 bytes x (r + 1 + T + 5) per candidate (``[Z/l; ...]``, the factor's T rows, the
posterior arrays) plus Z itself, against the stated worker memory.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from shared.bo.gp import Hyperparameters
from shared.bo.partition import StepMessage
from shared.bo.strategies import GPUCB

R = 15
HP = Hyperparameters(lengthscale=3.0, signal_variance=1.0, noise_variance=1e-4)


def _loop(engine: GPUCB, f: np.ndarray, steps: int) -> tuple[list[tuple[int, str]], list[float]]:
    engine.observe(0, float(f[0]))
    trace, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        s = engine.suggest()
        engine.observe(s.index, float(f[s.index]))
        times.append(time.perf_counter() - t0)
        trace.append((s.index, s.acquisition.hex()))
    return trace, times


def _rss(client: Any) -> dict[str, int]:
    import psutil

    def rss() -> int:
        return int(psutil.Process().memory_info().rss)

    out: dict[str, int] = client.run(rss)
    return out


def measure(client: Any, n: int, steps: int, partitions: int, seed: int = 0) -> dict[str, Any]:
    """Both loops at n (see the module docstring); the local one first."""
    from shared.bo.backend import set_dask_backend

    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, R))
    f = np.sin(Z[:, :3].sum(axis=1)) + 0.1 * rng.standard_normal(n)
    local_trace, local_times = _loop(GPUCB(Z, hyperparameters=HP), f, steps)
    set_dask_backend(client, partitions)
    try:
        engine = GPUCB(Z, hyperparameters=HP)
    finally:
        set_dask_backend(None)
    rss_before = _rss(client)
    t0 = time.perf_counter()
    dask_trace, dask_times = _loop(engine, f, steps)
    dask_total = time.perf_counter() - t0
    rss_after = _rss(client)
    compute = _partition_compute(engine, client)
    engine.gp.close()  # type: ignore[attr-defined]
    local_step = statistics.median(local_times)
    dask_step = statistics.median(dask_times)
    return {
        "n": n,
        "steps": steps,
        "partitions": partitions,
        "same_choices": [i for i, _ in local_trace] == [i for i, _ in dask_trace],
        "same_bits": local_trace == dask_trace,
        "local_step_s": local_step,
        "dask_step_s": dask_step,
        "dask_overhead_per_step_s": dask_step - local_step,
        "dask_over_local": dask_step / local_step,
        "dask_total_s": dask_total,
        "partition_compute_s": compute,
        "worker_rss_bytes": {"before": rss_before, "after": rss_after},
    }


def _partition_compute(engine: GPUCB, client: Any) -> float:
    """Seconds one partition spends on one more step's update pass, measured on its worker (the median
    over the partitions): the compute the model scales."""
    from shared.bo import dask_tasks

    gp: Any = engine.gp
    futures = list(gp._futures)

    def timed(part: Any, msg: StepMessage) -> float:
        t0 = time.perf_counter()
        dask_tasks.advance(part, msg)
        return time.perf_counter() - t0

    t = gp.t
    x, shift, log_s2 = gp._kernel_factors(int(gp.indices[0]))
    msg = StepMessage(t, x, shift, log_s2, np.full(t, 0.1), 0.0, 0.0, 1.0, (1.0, 0.0))
    times = client.gather([client.submit(timed, fut, msg, pure=False) for fut in futures])
    return float(statistics.median(times))


def predict(
    measured: dict[str, Any],
    *,
    n: int = 10**8,
    workers: int = 32,
    worker_memory: float = 16e9,
    steps: int = 200,
    bandwidth: float = 1.25e9,
    round_trip: float = 0.5e-3,
) -> dict[str, Any]:
    """The model of the module docstring, from the largest measured run."""
    p = measured["partitions"]
    n_m, t_m = measured["n"], measured["steps"] / 2 + 1
    c = measured["partition_compute_s"] / (n_m / p) / t_m  # seconds per candidate per factor row
    o = max(measured["dask_overhead_per_step_s"], 0.0) / p
    t_mean = steps / 2 + 1
    compute = c * (n / workers) * t_mean
    broadcast = 8 * (t_mean + R) / bandwidth + round_trip
    step = compute + o * workers + broadcast
    per_worker = 8 * (n / workers) * (R + R + 1 + steps + 5)
    return {
        "n": n,
        "workers": workers,
        "worker_memory_bytes": worker_memory,
        "steps": steps,
        "inputs": {
            "compute_per_candidate_per_row_s": c,
            "overhead_per_partition_s": o,
            "bandwidth_bytes_per_s": bandwidth,
            "round_trip_s": round_trip,
            "measured_at_n": n_m,
        },
        "mean_step_s": step,
        "total_s": step * steps,
        "memory_per_worker_bytes": per_worker,
        "fits": per_worker <= worker_memory,
        "workers_needed_for_memory": math.ceil(8 * n * (2 * R + 1 + steps + 5) / worker_memory),
    }


def main(
    *,
    json_path: Path | None,
    sizes: list[int],
    steps: int,
    workers: int,
    address: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    from shared.distributed.cluster import connect

    console = Console()
    client = connect(address, n_workers=workers)
    try:
        partitions = max(1, len(client.scheduler_info()["workers"]))
        runs = [measure(client, n, steps, partitions, seed) for n in sizes]
    finally:
        client.close()  # type: ignore[no-untyped-call]
    report: dict[str, Any] = {"runs": runs, "prediction": predict(max(runs, key=lambda r: r["n"]))}
    table = Table(title="GP-UCB loop: Dask LocalCluster vs local (median s per step)")
    for col in ("n", "local", "dask", "overhead", "dask/local", "same bits", "max worker RSS"):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            f"{r['n']:,}",
            f"{r['local_step_s']:.4f}",
            f"{r['dask_step_s']:.4f}",
            f"{r['dask_overhead_per_step_s'] * 1000:.1f} ms",
            f"{r['dask_over_local']:.2f}x",
            str(r["same_bits"]),
            f"{max(r['worker_rss_bytes']['after'].values()) / 2**20:.0f} MiB",
        )
    console.print(table)
    pr = report["prediction"]
    console.print(
        f"predicted n = {pr['n']:.0e} on {pr['workers']} workers x {pr['worker_memory_bytes'] / 1e9:.0f} GB, "
        f"T = {pr['steps']}: {pr['mean_step_s']:.2f} s per step, {pr['total_s'] / 60:.1f} min in all; "
        f"{pr['memory_per_worker_bytes'] / 1e9:.1f} GB per worker (fits: {pr['fits']})"
    )
    if json_path is not None:
        tmp = Path(f"{json_path}.tmp")
        tmp.write_text(json.dumps(report, indent=2), encoding="utf-8")
        tmp.replace(json_path)
    return report
