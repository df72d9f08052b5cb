"""Run a benchmark's independent runs in worker processes (or inline), results in job order."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

J = TypeVar("J")
R = TypeVar("R")

__all__ = ["map_runs"]


def map_runs(fn: Callable[[J], R], jobs: Iterable[J], workers: int) -> Iterator[R]:
    """``fn(job)`` for every job, in order. With ``workers`` > 1 in a pool of spawned processes, each with
    one BLAS thread (the runs are the parallelism; spawned, so no worker inherits a parent's generator)."""
    jobs = list(jobs)
    if workers <= 1:
        for job in jobs:
            yield fn(job)
        return
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        yield from pool.map(fn, jobs)
