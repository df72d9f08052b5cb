"""Element-wise passes over the n candidates, split across the cores.

numpy runs an element-wise operation (``exp``, ``sqrt``, ``*``) on one core; on arrays of a million entries
that is the GP loop's cost beside its BLAS calls (which OpenBLAS already runs on every core). ``split`` runs a
function on contiguous slices of ``range(n)`` in a small thread pool: numpy releases the GIL inside its
element-wise loops, so the slices run in parallel, and element-wise results are bit-for-bit those of one
pass over the whole array.

The pool belongs to the process that made it: a server that forks workers gets a new pool in each child (a
thread pool does not survive ``fork``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["split", "threads"]

#: Below this many elements one thread is faster than handing slices to the pool.
MIN_PARALLEL = 200_000

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0


def threads() -> int:
    """Threads used: the cores this process may run on, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


def _executor() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid():
        _pool = ThreadPoolExecutor(max_workers=max(1, threads() - 1), thread_name_prefix="pobo-split")
        _pool_pid = os.getpid()
    return _pool


def split(fn: Callable[[slice], None], n: int) -> None:
    """Call ``fn(s)`` for contiguous slices ``s`` covering ``range(n)``, in parallel when n is large; returns
    when every slice is done (and re-raises the first error)."""
    parts = threads() if n >= MIN_PARALLEL else 1
    if parts == 1:
        fn(slice(0, n))
        return
    bounds = [n * k // parts for k in range(parts + 1)]
    slices = [slice(bounds[k], bounds[k + 1]) for k in range(parts)]
    futures = [_executor().submit(fn, s) for s in slices[1:]]
    fn(slices[0])
    for future in futures:
        future.result()
