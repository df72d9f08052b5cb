"""Where a GP-UCB loop keeps its per-candidate state: in this process (``local``, the default) or on a
Dask cluster (``shared.bo.dask_gp``), chosen once per process (the modeler's ``backend`` setting).

A strategy asks ``make_gp`` for its GP; the choices and acquisition values are the same bit for bit either
way (``shared.bo.partition``), so the backend is an operational choice, never a statistical one.
"""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

from shared.bo.gp import GaussianProcess, Hyperparameters

__all__ = ["make_gp", "set_dask_backend", "uses_dask"]

_dask: tuple[Any, int | None] | None = None  # (distributed.Client, partitions) while the backend is dask


def set_dask_backend(client: Any | None, partitions: int | None = None) -> None:
    """Put the GP loops made from now on in this process on the cluster of ``client`` (``partitions`` per
    GP; None: one per worker); None goes back to the local backend."""
    global _dask
    _dask = None if client is None else (client, partitions)


def uses_dask() -> bool:
    return _dask is not None


def make_gp(
    Z: npt.ArrayLike, hyperparameters: Hyperparameters, *, distributable: bool = True, **options: Any
) -> GaussianProcess:
    """A GP over Z for a GP-UCB loop: a ``DaskGP`` when the process's backend is dask and the caller's loop
    runs on one (``distributable``; the float64 factor only), else a local ``GaussianProcess``."""
    if _dask is not None and distributable and options.get("factor_dtype", "float64") == "float64":
        from shared.bo.dask_gp import DaskGP

        client, partitions = _dask
        return DaskGP(Z, hyperparameters, client=client, partitions=partitions, **options)
    return GaussianProcess(Z, hyperparameters, **options)
