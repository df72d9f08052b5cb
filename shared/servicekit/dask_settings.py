"""The settings of a service that can run its heavy computation on a Dask cluster of its own (issue 36):
``backend``, the scheduler's address and the TLS files (``shared.distributed.cluster.connect``).

Each organisation runs its own cluster (docs/scaling.md): the curator's holds raw rows, the modeler's the
GP loop's partitions; neither is ever reachable by the other side.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["DaskSettings"]


class DaskSettings(BaseSettings):
    """``POBO_<SERVICE>_BACKEND``, ``_DASK_ADDRESS``, ``_DASK_TLS_CA/_CERT/_KEY``, ``_DASK_LOCAL_WORKERS``."""

    service: ClassVar[str]

    backend: Literal["local", "dask"] = Field(
        default="local",
        description="Where the heavy computation runs: local (this process, default) or dask (this "
        "organisation's own Dask cluster, with the same results bit for bit; docs/scaling.md). A cluster "
        "runs pickled code on what its workers hold: it must be this organisation's alone.",
    )
    dask_address: str | None = Field(
        default=None,
        description="The Dask scheduler, tls://host:port (with the three DASK_TLS_* files) or "
        "tcp://host:port (only for a scheduler nobody else can reach). Unset with backend dask: each server "
        "process starts a local cluster of DASK_LOCAL_WORKERS processes.",
    )
    dask_tls_ca: Path | None = Field(default=None, description="PEM: the CA of this service's Dask cluster.")
    dask_tls_cert: Path | None = Field(default=None, description="PEM: this service's client certificate.")
    dask_tls_key: Path | None = Field(default=None, description="PEM: the key of that certificate.")
    dask_local_workers: int = Field(
        default=2, ge=1, le=256, description="Worker processes of the local cluster (DASK_ADDRESS unset)."
    )

    @model_validator(mode="after")
    def _dask_connection(self) -> Any:
        prefix = f"POBO_{self.service.upper()}_"
        tls = [p for p in (self.dask_tls_ca, self.dask_tls_cert, self.dask_tls_key) if p is not None]
        if tls and len(tls) != 3:
            raise ValueError(f"{prefix}DASK_TLS_CA, _CERT and _KEY go together: set all three or none")
        address = self.dask_address
        if address is not None:
            if not address.startswith(("tls://", "tcp://")):
                raise ValueError(f"{prefix}DASK_ADDRESS must start with tls:// or tcp://, got {address!r}")
            if address.startswith("tls://") and not tls:
                raise ValueError(f"a tls:// {prefix}DASK_ADDRESS needs {prefix}DASK_TLS_CA, _CERT and _KEY")
            if address.startswith("tcp://") and tls:
                raise ValueError(f"{prefix}DASK_TLS_* are set for a tcp:// address: use tls://")
        return self

    def dask_client(self) -> Client:
        """A client of this service's cluster (``shared.distributed.cluster.connect``), for the caller to
        close."""
        from shared.distributed.cluster import connect

        return connect(
            self.dask_address,
            tls_ca=self.dask_tls_ca,
            tls_cert=self.dask_tls_cert,
            tls_key=self.dask_tls_key,
            n_workers=self.dask_local_workers,
        )
