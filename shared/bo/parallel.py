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
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CHUNK", "argmax", "split", "threads"]

#: Below this many elements one thread is faster than handing slices to the pool.
MIN_PARALLEL = 200_000

#: Elements per chunk when a slice runs several passes chunk by chunk (``split(..., chunk=CHUNK)``): five
#: float64 arrays of this many entries (2.5 MB) stay in a core's L2 cache between passes, and a chunk is long
#: enough that numpy's per-call overhead is small against its arithmetic.
CHUNK = 65_536

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


def _slices(n: int) -> list[slice]:
    parts = threads() if n >= MIN_PARALLEL else 1
    bounds = [n * k // parts for k in range(parts + 1)]
    return [slice(bounds[k], bounds[k + 1]) for k in range(parts)]


def _in_chunks(fn: Callable[[slice], None], chunk: int) -> Callable[[slice], None]:
    def run(s: slice) -> None:
        for start in range(s.start, s.stop, chunk):
            fn(slice(start, min(start + chunk, s.stop)))

    return run


def split(fn: Callable[[slice], None], n: int, *, chunk: int | None = None) -> None:
    """Call ``fn(s)`` for contiguous slices ``s`` covering ``range(n)``, in parallel when n is large; returns
    when every slice is done (and re-raises the first error). With ``chunk``, each thread calls ``fn`` on
    consecutive pieces of its slice of at most ``chunk`` elements: a function running several passes then
    runs them on data still in cache."""
    slices = _slices(n)
    run = fn if chunk is None else _in_chunks(fn, int(chunk))
    if len(slices) == 1:
        run(slices[0])
        return
    futures = [_executor().submit(run, s) for s in slices[1:]]
    run(slices[0])
    for future in futures:
        future.result()


def argmax(x: npt.NDArray[Any]) -> int:
    """``int(np.argmax(x))`` for a 1-D array, the slices searched in parallel: the first maximum (or the first
    NaN), exactly as numpy's."""
    slices = _slices(x.shape[0])
    if len(slices) == 1:
        return int(np.argmax(x))
    found = [0] * len(slices)

    def search(k: int) -> None:
        found[k] = slices[k].start + int(np.argmax(x[slices[k]]))

    futures = [_executor().submit(search, k) for k in range(1, len(slices))]
    search(0)
    for future in futures:
        future.result()
    # numpy's rule over the slices' winners (in order) picks the first maximum, or the first NaN
    return found[int(np.argmax(x[found]))]
