"""DP-GIBO's private gradient oracle on a Dask cluster: the same released gradient as
``shared.bo.gibo.oracle.oracle_gradient``, bit for bit.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 lines 5-8 and Lemma 3.1; the mechanism is
``shared.bo.gibo.private_gradient``'s. What is distributed is the per-row part, lines 6-7: the losses of the
design on each row (``safe_loss_matrix``), each row's gradient ``W L[:, i]`` (``per_user_gradients``) and its
clipping (``clip_rows``), for a block of rows per task. Each task returns the block's sum of the clipped
gradients snapped to the public lattice h Z^d as int64 (``shared.privacy.lattice.exact_sum``'s first step,
with the h of all n rows). Integer sums do not depend on their order or grouping, and a row's clipped
gradient depends on that row alone, computed the same in any block (the same numpy operations on the same
values, verified by the tests), so the driver's total is the local one exactly; the driver then divides by n
and adds the noise exactly (line 8, ``shared.privacy.lattice.add_lattice_noise``), with the generator the
local oracle would use. The row blocks therefore affect the time only, never the answer.

The schedule does not depend on the rows: the blocks are fixed by n and the row width, every block is one
task whatever its rows hold, and a row whose loss fails counts as 0 as in the local oracle. A loss is sent to
the workers as a factory (``builtin_loss_factory``, ``plugin_loss_factory``): a plug-in loss is pickled by
name, so its module must be importable on the workers.
"""

from __future__ import annotations

import math
import uuid
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.gp import DEFAULT_JITTER, GradientGP
from shared.bo.gibo.kernels import GradKernel
from shared.bo.gibo.oracle import (
    LossMatrix,
    builtin_loss_matrix,
    check_step,
    plugin_loss_matrix,
    safe_loss_matrix,
)
from shared.bo.gibo.private_gradient import clip_rows, noise_std, per_user_gradients, step_mechanism
from shared.errors import InputDataError
from shared.privacy.gaussian import noise_blocks
from shared.privacy.lattice import add_lattice_noise, sum_step
from shared.privacy.rng import os_entropy_rng
from shared.privacy.rows import FloatArray, read_block

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "LossFactory",
    "builtin_loss_factory",
    "gradient_block_task",
    "oracle_gradient_dask",
    "plugin_loss_factory",
]

#: ``factory(rows [b, w], outcomes [b] or None) -> loss_matrix`` over those rows (picklable: sent to workers).
LossFactory = Callable[[FloatArray, FloatArray | None], LossMatrix]
#: An operator's plug-in loss: ``fn(theta_batch [b, p], rows [m, w]) -> [m, b]``.
PluginFn = Callable[[FloatArray, FloatArray], npt.ArrayLike]


def _builtin(
    loss: str,
    intercept: bool,
    delta_huber: float,
    weight_clip: float,
    X: FloatArray,
    y: FloatArray | None,
) -> LossMatrix:
    return builtin_loss_matrix(
        loss, X, y, intercept=intercept, delta_huber=delta_huber, weight_clip=weight_clip
    )


def builtin_loss_factory(
    loss: str, *, intercept: bool = False, delta_huber: float = 1.0, weight_clip: float = 2.0
) -> LossFactory:
    """A built-in loss (``shared.bo.gibo.oracle.BUILTIN_LOSSES``) over a block of rows."""
    return partial(_builtin, loss, bool(intercept), float(delta_huber), float(weight_clip))


def _plugin(fn: PluginFn, X: FloatArray, y: FloatArray | None) -> LossMatrix:
    rows = np.asarray(X, dtype=np.float64)
    if y is not None:  # the outcome column after the features, as the local oracle's rows
        rows = np.hstack([rows, np.asarray(y, dtype=np.float64)[:, None]])
    return plugin_loss_matrix(fn, rows)


def plugin_loss_factory(fn: PluginFn) -> LossFactory:
    """An operator's plug-in loss ``fn(theta_batch, rows)`` (one row per call: ``plugin_loss_matrix``) over a
    block of rows (and its outcomes, appended as the last column, when given)."""
    return partial(_plugin, fn)


def gradient_block_task(
    Xb: Any,
    yb: Any,
    factory: LossFactory,
    design: FloatArray,
    W: FloatArray,
    clip: float,
    step: float,
    row_width: int,
) -> npt.NDArray[np.int64] | InputDataError:
    """sum over the block's rows of rint(Pi_B(W L[:, i]) / h), as int64 [d] (h = ``step``); a refusal (a loss
    returning the wrong shape) is returned, not raised (Dask would log the task's arguments: the rows)."""
    try:
        rows = np.asarray(Xb, dtype=np.float64)
        outcomes = None if yb is None else np.asarray(yb, dtype=np.float64)
        L = safe_loss_matrix(factory(rows, outcomes), design, int(rows.shape[0]), row_width)
        Gc = clip_rows(per_user_gradients(W, L), clip)
        total: npt.NDArray[np.int64] = np.rint(Gc / step).astype(np.int64).sum(axis=0)
        return total
    except InputDataError as exc:
        return exc


def oracle_gradient_dask(
    factory: LossFactory,
    X: npt.ArrayLike,
    y: npt.ArrayLike | None = None,
    *,
    n: int,
    row_width: int,
    theta: npt.ArrayLike,
    design: npt.ArrayLike,
    bounds: npt.ArrayLike,
    kernel: GradKernel,
    clip: float,
    steps: int,
    mu: float,
    rng: np.random.Generator | None = None,
    noise_var: float = 0.0,
    jitter: float = DEFAULT_JITTER,
    client: Client,
    window: int | None = None,
) -> FloatArray:
    """``oracle_gradient(factory(X, y), n=, ...)`` with the rows' part on ``client``'s cluster (module
    docstring): the same released gradient, bit for bit, for the same ``rng`` (None: a fresh OS-keyed AES-CTR
    generator, production). ``X`` [n, w] and ``y`` [n] are numpy arrays or memmaps, read here block by block
    (at most ``window`` blocks in flight: default twice the cluster's threads). Everything that can fail on
    the inputs fails before a row is read, as in the local oracle.
    """
    if not (math.isfinite(noise_var) and noise_var >= 0):
        raise InputDataError(f"noise_var must be a finite number >= 0, got {noise_var!r}")
    noise_std(clip, steps, n, mu)  # validates B, T, n and mu now, not after the rows were read
    t, D, _ = check_step(theta, design, bounds)
    W = GradientGP(kernel, D, noise_var=noise_var, jitter=jitter).grad_weights(t)
    if not np.isfinite(W).all():
        raise InputDataError("the GP's gradient weights are not finite for this design and kernel")
    rows = np.asarray(X) if not isinstance(X, np.ndarray) else X
    if rows.ndim != 2 or rows.shape[0] < 1:
        raise InputDataError(f"the rows must be a 2-D array with at least one row, got shape {rows.shape}")
    outcomes = None if y is None else (np.asarray(y) if not isinstance(y, np.ndarray) else y)
    count = int(rows.shape[0])
    d = max(1, int(W.shape[0]))
    mechanism = step_mechanism(clip, steps, count, mu, d)  # as private_gradient: n = the rows' count
    h = sum_step(count, clip)  # exact_sum(Gc, B)'s lattice
    blocks = noise_blocks(count, max(1, int(rows.shape[1]) + (0 if outcomes is None else 1)))
    cluster: Any = client  # distributed is untyped
    threads = sum(cluster.nthreads().values()) or 1
    limit = max(2, int(window) if window is not None else 2 * threads)
    run = uuid.uuid4().hex
    total = np.zeros(d, dtype=np.int64)
    futures: list[Any] = []
    pending: deque[Any] = deque()

    def collect(future: Any) -> None:
        nonlocal total
        part = future.result()
        if isinstance(part, InputDataError):
            raise part
        total = total + part  # int64: exact in any order (n |entries| / h < 2^62, sum_step)
        future.release()

    try:
        for i, start in enumerate(blocks):
            stop = min(count, start + blocks.step)
            yb = None if outcomes is None else np.asarray(outcomes[start:stop], dtype=np.float64)
            future = cluster.submit(
                gradient_block_task,
                read_block(rows, start, stop),
                yb,
                factory,
                D,
                W,
                clip,
                h,
                row_width,
                key=f"pobo-gradient-{run}-{i}",
                pure=False,
            )
            futures.append(future)
            pending.append(future)
            if len(pending) >= limit:
                collect(pending.popleft())
        while pending:
            collect(pending.popleft())
    except BaseException:
        cluster.cancel([f for f in futures if not f.done()])
        raise
    avg: FloatArray = np.asarray(total.astype(np.float64) * h / float(count), dtype=np.float64)
    if mechanism is None:
        return avg.copy()
    return add_lattice_noise(mechanism, avg, rng if rng is not None else os_entropy_rng())
