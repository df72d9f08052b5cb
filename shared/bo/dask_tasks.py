"""The tasks a ``shared.bo.dask_gp.DaskGP`` runs on the Dask workers: pure functions of a partition.

Each takes a ``shared.bo.partition.Partition`` (or a GP-BUCB round's
``shared.bo.hallucinated.HallucinatedPartition``) and returns a new version or values read from it; none
changes its argument, so Dask may run any of them again on another worker after a loss and get the same
bits. BLAS runs on one thread inside each (``shared.bo.parallel.one_blas_thread``), as the bit-exactness of
``shared.bo.partition`` requires.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shared.bo.hallucinated import HallucinatedPartition
from shared.bo.parallel import one_blas_thread
from shared.bo.partition import Partition, StepMessage

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "make",
    "advance",
    "rebuilt",
    "columns",
    "best",
    "posterior",
    "variance",
    "arrays",
    "covariance_inputs",
    "covariance",
    "round_start",
    "round_best",
    "round_row",
    "round_add",
]


def make(Z: FloatArray | tuple[str, int, int], start: int, s2: float, ls: Any, empirical: bool) -> Partition:
    """The first version of a partition: its rows of Z (an array, or a .npy file's row range), the prior."""
    if isinstance(Z, tuple):
        path, begin, end = Z
        Z = np.ascontiguousarray(np.load(path, mmap_mode="r")[begin:end], dtype=np.float64)
    with one_blas_thread():
        return Partition(Z, s2, ls, start=start, empirical=empirical, spill="never", reuse_memory=False)


def advance(part: Partition, msg: StepMessage) -> Partition:
    new = part.version()
    with one_blas_thread():
        new.update(msg)
    return new


def rebuilt(
    part: Partition, Z_obs: FloatArray, L: FloatArray, w: FloatArray, u: FloatArray, s2: float, ls: Any
) -> Partition:
    new = part.version(fresh_factor=True)
    with one_blas_thread():
        new.rebuild(Z_obs, L, w, u, s2, ls)
    return new


def columns(part: Partition, local: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
    """(columns of ``[Z/l; ...]`` [r + 1, p], rows of Z [p, r]) of the local indices."""
    return part.ST[:, local].copy(), part.Z[local].copy()


def best(
    part: Partition, c: float, m: float, excluded: npt.NDArray[np.int64]
) -> tuple[float, int, FloatArray, FloatArray, tuple[float, float]]:
    """The partition's first acquisition maximum: (value, global index, its column of ``[Z/l; ...]``, its
    row of Z, its posterior (mean, std)); what the driver needs of the winner comes back with it."""
    with one_blas_thread():
        value, i = part.best(c, m, excluded)
    return value, part.start + i, part.ST[:, i].copy(), part.Z[i].copy(), part.posterior_at(i, m)


def posterior(part: Partition, local: int, m: float) -> tuple[float, float]:
    return part.posterior_at(local, m)


def variance(part: Partition, local: int) -> float:
    return float(part.var[local])


def arrays(part: Partition, names: tuple[str, ...]) -> tuple[FloatArray, ...]:
    return tuple(getattr(part, name).copy() for name in names)


def covariance_inputs(
    part: Partition, local: npt.NDArray[np.int64]
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(columns of ``[Z/l]`` [r, p], their squared norms [p], columns of the factor [t, p]) of the local
    indices: what every partition needs of them for ``covariance_rows``."""
    return part.ST[:-1, local].copy(), part.sqnorm[local].copy(), part.A.columns(local)


def covariance(
    part: Partition, S_idx: FloatArray, sq_idx: FloatArray, A_idx: FloatArray, s2: float
) -> FloatArray:
    with one_blas_thread():
        return part.covariance_columns(S_idx, sq_idx, A_idx, s2)


def round_start(
    part: Partition, m: float, excluded: npt.NDArray[np.int64], capacity: int
) -> HallucinatedPartition:
    return HallucinatedPartition(part, m, excluded, capacity)


def round_best(state: HallucinatedPartition, scale: float) -> tuple[float, int, dict[str, Any]]:
    """The partition's first maximum (value, global index) and what the driver needs of that row."""
    value, i = state.best(scale)
    return value, state.part.start + i, state.row(i, scale)


def round_row(state: HallucinatedPartition, local: int, scale: float) -> dict[str, Any]:
    return state.row(local, scale)


def round_add(
    state: HallucinatedPartition,
    S_idx: FloatArray,
    sq_idx: FloatArray,
    A_idx: FloatArray,
    s2: float,
    b_j: FloatArray,
    denom: float,
    local: int | None,
) -> HallucinatedPartition:
    new = state.version()
    with one_blas_thread():
        new.add(S_idx, sq_idx, A_idx, s2, b_j, denom)
    if local is not None:
        new.exclude(local)
    return new
