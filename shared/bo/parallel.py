"""Element-wise passes over the n candidates, split across the cores.

numpy runs an element-wise operation (``exp``, ``sqrt``, ``*``) on one core; on arrays of a million entries
that is the GP loop's cost beside its BLAS calls (which OpenBLAS already runs on every core). ``split`` runs a
function on contiguous slices of ``range(n)`` in a small thread pool: numpy releases the GIL inside its
element-wise loops, so the slices run in parallel, and element-wise results are bit-for-bit those of one
pass over the whole array.

A pass whose slices call BLAS themselves (``split(..., blas=True)``: the GP step's ``x^T A`` on the
chunk it is working on) runs with BLAS limited to one thread: OpenBLAS called from two threads at once,
each call asking for every core, is slower than one thread per call (measured: the GP step's pass at 1.5x
its time). The limit is process-wide (OpenBLAS has one thread count) and counted: the first of concurrent
passes lowers it, the last one out restores it; a BLAS call elsewhere in the process meanwhile runs on one
thread, which changes its speed, never its result.

The pool belongs to the process that made it: a server that forks workers gets a new pool in each child (a
thread pool does not survive ``fork``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
from threadpoolctl import ThreadpoolController

__all__ = ["CHUNK", "argmax", "chunk_buffer", "in_parallel", "one_blas_thread", "split", "threads"]

#: Below this many elements one thread is faster than handing slices to the pool.
MIN_PARALLEL = 200_000

#: Elements per chunk when a slice runs several passes chunk by chunk (``split(..., chunk=CHUNK)``): five
#: float64 arrays of this many entries (2.5 MB) stay in a core's L2 cache between passes, and a chunk is long
#: enough that numpy's per-call overhead is small against its arithmetic.
CHUNK = 65_536

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0

_blas_lock = threading.Lock()
_blas_passes = 0  # passes inside one_blas_thread() now
_blas_restore: Any = None  # threadpoolctl's limiter of the first of them
_controller: ThreadpoolController | None = None


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


_chunks = threading.local()  # chunk_buffer()'s arrays, per thread


def chunk_buffer(name: str, dtype: np.dtype[Any], size: int) -> npt.NDArray[Any]:
    """A [size] array of the calling thread's own under ``name``, kept for its next chunk (a pass's function
    under ``split(..., chunk=...)``): the pass's temporaries then stay in the core's cache instead of being
    written back to an [n] array. Its contents are stale."""
    key = (name, dtype.char)
    buffers = getattr(_chunks, "buffers", None)
    if buffers is None:
        buffers = _chunks.buffers = {}
    buf = buffers.get(key)
    if buf is None or buf.size < size:
        buf = buffers[key] = np.empty(size, dtype=dtype)
    out: npt.NDArray[Any] = buf[:size]
    return out


def in_parallel(n: int) -> bool:
    """Whether ``split`` over n runs more than one slice."""
    return len(_slices(n)) > 1


def _slices(n: int) -> list[slice]:
    parts = threads() if n >= MIN_PARALLEL else 1
    bounds = [n * k // parts for k in range(parts + 1)]
    return [slice(bounds[k], bounds[k + 1]) for k in range(parts)]


def _in_chunks(fn: Callable[[slice], None], chunk: int) -> Callable[[slice], None]:
    def run(s: slice) -> None:
        for start in range(s.start, s.stop, chunk):
            fn(slice(start, min(start + chunk, s.stop)))

    return run


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS limited to one thread while the block runs (process-wide, counted across threads: see the module
    docstring)."""
    global _blas_passes, _blas_restore, _controller
    with _blas_lock:
        if _blas_passes == 0:
            if _controller is None:
                _controller = ThreadpoolController()  # the BLAS libraries loaded by now (numpy's, scipy's)
            _blas_restore = _controller.limit(limits=1, user_api="blas")
        _blas_passes += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_passes -= 1
            if _blas_passes == 0:
                _blas_restore.restore_original_limits()
                _blas_restore = None


def split(fn: Callable[[slice], None], n: int, *, chunk: int | None = None, blas: bool = False) -> None:
    """Call ``fn(s)`` for contiguous slices ``s`` covering ``range(n)``, in parallel when n is large; returns
    when every slice is done (and re-raises the first error). With ``chunk``, each thread calls ``fn`` on
    consecutive pieces of its slice of at most ``chunk`` elements: a function running several passes then
    runs them on data still in cache. ``blas``: ``fn`` calls BLAS, which then runs on one thread while the
    slices run in parallel (``one_blas_thread``)."""
    slices = _slices(n)
    run = fn if chunk is None else _in_chunks(fn, int(chunk))
    if len(slices) == 1:
        run(slices[0])
        return
    if blas:
        with one_blas_thread():
            _run_parallel(run, slices)
    else:
        _run_parallel(run, slices)


def _run_parallel(run: Callable[[slice], None], slices: list[slice]) -> None:
    """Slice 0 here, the others in the pool; every slice has finished when this returns or raises."""
    futures = [_executor().submit(run, s) for s in slices[1:]]
    try:
        run(slices[0])
    finally:
        errors = [f.exception() for f in futures]  # waits for each
    for error in errors:
        if error is not None:
            raise error


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
