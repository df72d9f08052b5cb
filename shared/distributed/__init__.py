"""pobo on a Dask cluster: the connection (``cluster``) and the curator's Gaussian release (``release``).

Dask is optional (``pip install pobo[dask]``): it is imported inside the functions, so importing this package
works without it. Each organisation runs its own cluster: the curator's holds raw rows and runs pickled code,
so only the curator's own processes may reach it (docs/scaling.md).
"""

from __future__ import annotations

from shared.distributed.cluster import WORKER_CONFIG, WORKER_ENVIRON, TlsFiles, connect
from shared.distributed.release import gaussian_release_dask

__all__ = ["WORKER_CONFIG", "WORKER_ENVIRON", "TlsFiles", "connect", "gaussian_release_dask"]
