"""The Gaussian release on a Dask cluster: the same blocks as ``shared.privacy.gaussian.gaussian_release``, as
tasks, with the same Z bit for bit.

The mechanism is the one of ``shared.privacy.gaussian`` (the Gaussian mechanism with Balle & Wang's analytic
calibration, ICML 2018, Thm. 8, noise added exactly on a lattice: ``shared.privacy.lattice``). The driver (the
curator's process) draws what the master generator draws, in the same order: the projection M first, then
two keys per noise block (``noise_keys``). Each noise block (``noise_blocks``: boundaries from (n, d) only,
never from X's chunks) is one task, ``release_block(rows, start, calibration, keys, B)``, a pure function: a
task run twice (Dask recomputes the results of a lost worker) returns the same bits. The driver adds the
blocks' column sums in block order, assembles Z and centres it, exactly as the local release does.

What travels to the cluster: the rows (already the cluster's, when X is a dask array), the public
calibration, B, and each block's two keys (curator-private: whoever holds a block's keys can subtract its
noise). The cluster is the curator's own, reached over TLS (``shared.distributed.cluster``); task names are
random, never derived from the keys.

Bit for bit, assuming the driver and the workers run the same numpy (and BLAS, when projecting) build: the
same container image. Floating point is deterministic for the same operations in the same order; the
column sums are made so (C-contiguous float64 blocks, one ``sum(axis=0)`` per block, added in block order).
"""

from __future__ import annotations

import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError
from shared.privacy.gaussian import (
    GaussianCalibration,
    GaussianRelease,
    NoiseKeys,
    calibrate,
    check_release_r,
    noise_blocks,
    noise_keys,
    release_block,
    release_projection_matrix,
)
from shared.privacy.rng import os_entropy_rng
from shared.privacy.rows import FloatArray, check_matrix, read_block

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["gaussian_release_dask", "is_dask_array", "release_block_task"]


def is_dask_array(X: object) -> bool:
    """True for a ``dask.array.Array`` (without importing dask when it is not installed)."""
    try:
        import dask.array as da
    except ImportError:  # pragma: no cover - pobo without the dask extra
        return False
    return isinstance(X, da.Array)


def release_block_task(
    Xb: Any, start: int, calibration: GaussianCalibration, keys: NoiseKeys, B: FloatArray | None
) -> tuple[FloatArray, FloatArray] | InputDataError:
    """``release_block`` as a task: a refused block (a non-finite value, one beyond the lattice) returns its
    InputDataError (raised by the driver) instead of raising on the worker, where Dask would log the failed
    task with its arguments: the rows and the keys."""
    try:
        return release_block(Xb, start, calibration, keys, B)
    except InputDataError as exc:
        return exc


def _check_dask_matrix(X: Any) -> tuple[int, int]:
    """check_matrix's rules for a dask array (shape and dtype; the values are checked by the tasks)."""
    if X.ndim != 2:
        raise InputDataError(f"X must be 2-D (n rows x d features), got {X.ndim} dimension(s)")
    if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
        raise InputDataError(f"X must hold real numbers, got dtype {X.dtype}")
    n, d = X.shape
    if not (isinstance(n, int | np.integer) and isinstance(d, int | np.integer)) or np.isnan(float(n)):
        raise InputDataError("X must have a known number of rows (compute its chunk sizes first)")
    if n < 2:
        raise InputDataError(f"X needs at least 2 rows, got {n}")
    if d < 1:
        raise InputDataError("X needs at least 1 column, got 0")
    return int(n), int(d)


def gaussian_release_dask(
    X: npt.ArrayLike | Any,
    *,
    epsilon: float,
    delta: float,
    r: int | None = None,
    rng: np.random.Generator | None = None,
    client: Client,
    window: int | None = None,
) -> GaussianRelease:
    """``gaussian_release(X, epsilon=, delta=, r=, rng=)`` computed on ``client``'s cluster: the same Z, bit
    for bit, for the same master generator (``rng``; default a fresh ``os_entropy_rng()``, production).

    ``X``: a dask array (rechunked to the noise blocks; its own chunking does not matter) or a numpy array
    or memmap (read block by block here and sent with the block's task, at most ``window`` blocks in
    flight: default twice the cluster's threads, so neither this process nor the scheduler holds all of X).
    The blocks' results are collected in block order; a block's InputDataError (a non-finite value, a value
    beyond the lattice) is raised here, naming rows, and the other blocks are cancelled.
    """
    dask_input = is_dask_array(X)
    Xd: Any = X  # a dask array (untyped), or the checked numpy array below
    if dask_input:
        n, d = _check_dask_matrix(Xd)
    else:
        Xd = check_matrix(X)
        n, d = Xd.shape
    cluster: Any = client  # distributed is untyped
    cal = calibrate(epsilon, delta, d)
    r = check_release_r(r, d)
    rng = rng if rng is not None else os_entropy_rng()
    B = release_projection_matrix(rng, d, r)
    blocks = noise_blocks(n, d)
    keys = noise_keys(rng, len(blocks))
    bounds = [(start, min(n, start + blocks.step)) for start in blocks]
    Z: FloatArray = np.empty((n, d if B is None else B.shape[1]))
    colsum = np.zeros(d)
    run = uuid.uuid4().hex  # task names: random, never derived from the keys

    def collect(i: int, future: Any) -> None:
        nonlocal colsum
        result = future.result()
        if isinstance(result, InputDataError):
            raise result
        Zb, part = result
        start, stop = bounds[i]
        Z[start:stop] = Zb
        colsum += part  # in block order: the local release's additions, in its order
        future.release()

    futures: list[Any] = []  # distributed.Future
    try:
        if dask_input:
            from dask.delayed import delayed as dask_delayed

            delayed: Any = dask_delayed
            chunked = Xd.rechunk(chunks=(tuple(stop - start for start, stop in bounds), (d,)))
            parts = chunked.to_delayed().ravel()
            tasks = [
                delayed(release_block_task, pure=False)(
                    part, start, cal, key, B, dask_key_name=f"pobo-release-{run}-{i}"
                )
                for i, (part, (start, _), key) in enumerate(zip(parts, bounds, keys, strict=True))
            ]
            futures = list(cluster.compute(tasks))
            for i, future in enumerate(futures):
                collect(i, future)
        else:
            threads = sum(cluster.nthreads().values()) or 1
            limit = max(2, int(window) if window is not None else 2 * threads)
            pending: deque[tuple[int, Any]] = deque()
            for i, ((start, stop), key) in enumerate(zip(bounds, keys, strict=True)):
                future = cluster.submit(
                    release_block_task,
                    read_block(Xd, start, stop),
                    start,
                    cal,
                    key,
                    B,
                    key=f"pobo-release-{run}-{i}",
                    pure=False,
                )
                futures.append(future)
                pending.append((i, future))
                if len(pending) >= limit:
                    collect(*pending.popleft())
            while pending:
                collect(*pending.popleft())
    except BaseException:
        cluster.cancel([f for f in futures if not f.done()])
        raise
    mean = colsum / n
    Z -= mean if B is None else mean @ B
    return GaussianRelease(Z=Z, calibration=cal, projected=B is not None)
