"""Where a GP loop keeps its per-candidate state: in this process (``local``, the default) or on a Dask
cluster (``shared.bo.dask_gp`` for GP-UCB, GP-BUCB and TGP; ``shared.bo.dask_nystrom`` for ATA and MoMA),
chosen once per process (the modeler's ``backend`` setting).

A strategy asks ``make_gp`` for its GP; the choices and acquisition values are the same bit for bit either
way (``shared.bo.partition``), so the backend is an operational choice, never a statistical one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shared.bo.gp import GaussianProcess, Hyperparameters

__all__ = ["make_gp", "npy_file", "set_dask_backend", "uses_dask"]

#: (distributed.Client, partitions, whether the workers read this process's files) while the backend is dask
_dask: tuple[Any, int | None, bool] | None = None


def set_dask_backend(
    client: Any | None, partitions: int | None = None, *, workers_read_files: bool = False
) -> None:
    """Put the GP loops made from now on in this process on the cluster of ``client`` (``partitions`` per
    GP; None: one per worker); None goes back to the local backend. ``workers_read_files``: the workers see
    this process's files at the same paths, so a Z memory-mapped from a .npy file goes to them as its path."""
    global _dask
    _dask = None if client is None else (client, partitions, bool(workers_read_files))


def uses_dask() -> bool:
    return _dask is not None


def make_gp(
    Z: npt.ArrayLike, hyperparameters: Hyperparameters, *, distributable: bool = True, **options: Any
) -> GaussianProcess:
    """A GP over Z for a GP-UCB loop: a ``DaskGP`` when the process's backend is dask and the caller's loop
    runs on one (``distributable``; the float64 factor only), else a local ``GaussianProcess``."""
    if _dask is not None and distributable and options.get("factor_dtype", "float64") == "float64":
        from shared.bo.dask_gp import DaskGP

        client, partitions, reads = _dask
        path = npy_file(Z) if reads else None
        return DaskGP(path or Z, hyperparameters, client=client, partitions=partitions, **options)
    return GaussianProcess(Z, hyperparameters, **options)


def npy_file(Z: Any) -> str | None:
    """The .npy file that Z is the whole of (``np.load(path, mmap_mode="r")``, or a view of all of it such as
    ``np.ascontiguousarray`` returns), else None: then a ``DaskGP``'s partitions can load their own rows."""
    x = Z
    while isinstance(x, np.ndarray) and not (isinstance(x, np.memmap) and not isinstance(x.base, np.ndarray)):
        x = x.base
    if not isinstance(x, np.memmap) or x.filename is None or x.mode != "r":
        return None
    whole = np.asarray(Z)
    same = (
        whole.shape == x.shape and whole.dtype == x.dtype == np.float64 and whole.ctypes.data == x.ctypes.data
    )
    return str(x.filename) if same and whole.flags.c_contiguous and x.flags.c_contiguous else None
