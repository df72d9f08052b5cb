"""The settings of a service that can run its heavy computation on a Dask cluster of its own (issue 36):
``backend``, the scheduler's address and the TLS files (``shared.distributed.cluster.connect``), or a
dask-gateway server that starts (or holds) the cluster (``shared.distributed.cluster.connect_gateway``).

Each organisation runs its own cluster (docs/scaling.md): the curator's holds raw rows, the modeler's the
GP loop's partitions; neither is ever reachable by the other side.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["DaskSettings"]


class DaskSettings(BaseSettings):
    """``POBO_<SERVICE>_BACKEND``, ``_DASK_ADDRESS``, ``_DASK_TLS_CA/_CERT/_KEY``,
    ``_DASK_LOCAL_WORKERS``, and ``_DASK_GATEWAY_*`` (a dask-gateway server instead of a scheduler
    address)."""

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
    dask_gateway_address: str | None = Field(
        default=None,
        description="A dask-gateway server, https://host:port (http:// only where nobody else can listen), "
        "that starts this service's cluster (or holds it: DASK_GATEWAY_CLUSTER); instead of DASK_ADDRESS. "
        "Needs pobo[dask-gateway]. The gateway must be this organisation's alone (docs/scaling.md).",
    )
    dask_gateway_proxy_address: str | None = Field(
        default=None,
        description="The gateway's scheduler proxy, tls://host:port. Unset: the gateway's host and port.",
    )
    dask_gateway_auth: Literal["kerberos", "jupyterhub", "basic"] = Field(
        default="kerberos",
        description="How this service authenticates to the gateway: kerberos (its ticket; needs "
        "dask-gateway[kerberos]), jupyterhub (DASK_GATEWAY_JUPYTERHUB_TOKEN or JUPYTERHUB_API_TOKEN) or "
        "basic (DASK_GATEWAY_USERNAME and DASK_GATEWAY_PASSWORD).",
    )
    dask_gateway_username: str | None = Field(default=None, description="The gateway user (auth basic).")
    dask_gateway_password: SecretStr | None = Field(
        default=None, description="The gateway user's password (auth basic); a secret file."
    )
    dask_gateway_jupyterhub_token: SecretStr | None = Field(
        default=None,
        description="A JupyterHub API token (auth jupyterhub); a secret file. Unset: JUPYTERHUB_API_TOKEN.",
    )
    dask_gateway_cluster: str | None = Field(
        default=None,
        description="The name of a running gateway cluster to connect to (left running when the service "
        "stops). Unset: each server process starts a cluster of DASK_GATEWAY_WORKERS workers through the "
        "gateway and shuts it down when it stops.",
    )
    dask_gateway_workers: int = Field(
        default=2, ge=1, le=1024, description="Workers of the cluster the service starts through the gateway."
    )
    dask_gateway_cluster_options: dict[str, Any] | None = Field(
        default=None,
        description="The cluster options of the cluster the service starts, a JSON object (e.g. "
        '{"worker_cores": 1, "image": "registry.example/pobo:0.2.0"}); which options exist is the '
        "gateway's configuration.",
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
        self._check_gateway(prefix, tls=bool(tls))
        return self

    def _check_gateway(self, prefix: str, *, tls: bool) -> None:
        gateway = self.dask_gateway_address
        if gateway is None:
            return
        if self.dask_address is not None:
            raise ValueError(
                f"{prefix}DASK_ADDRESS and {prefix}DASK_GATEWAY_ADDRESS are both set: the cluster is "
                "either a scheduler or a dask-gateway's, unset one of them"
            )
        if tls:
            raise ValueError(
                f"{prefix}DASK_TLS_* are for a scheduler at DASK_ADDRESS; a dask-gateway cluster's TLS comes "
                f"from the gateway: unset them with {prefix}DASK_GATEWAY_ADDRESS"
            )
        if not gateway.startswith(("https://", "http://")) or len(gateway.split("://", 1)[1].strip("/")) == 0:
            raise ValueError(
                f"{prefix}DASK_GATEWAY_ADDRESS must be the gateway's URL, https://host:port, got {gateway!r}"
            )
        proxy = self.dask_gateway_proxy_address
        if proxy is not None and not proxy.startswith(("tls://", "gateway://")):
            raise ValueError(
                f"{prefix}DASK_GATEWAY_PROXY_ADDRESS must be the gateway's scheduler proxy, tls://host:port, "
                f"got {proxy!r}"
            )
        if self.dask_gateway_auth == "basic":
            if not self.dask_gateway_username or self.dask_gateway_password is None:
                raise ValueError(
                    f"{prefix}DASK_GATEWAY_AUTH basic needs {prefix}DASK_GATEWAY_USERNAME and "
                    f"{prefix}DASK_GATEWAY_PASSWORD (a secret file)"
                )
        elif self.dask_gateway_auth == "jupyterhub":
            if self.dask_gateway_jupyterhub_token is None and not os.environ.get("JUPYTERHUB_API_TOKEN"):
                raise ValueError(
                    f"{prefix}DASK_GATEWAY_AUTH jupyterhub needs a JupyterHub API token: "
                    f"{prefix}DASK_GATEWAY_JUPYTERHUB_TOKEN (a secret file) or JUPYTERHUB_API_TOKEN"
                )
        if self.dask_gateway_cluster is not None and self.dask_gateway_cluster_options:
            raise ValueError(
                f"{prefix}DASK_GATEWAY_CLUSTER_OPTIONS apply to a cluster the service starts; with "
                f"{prefix}DASK_GATEWAY_CLUSTER it connects to a running one: unset one of them"
            )

    @property
    def dask_local_cluster(self) -> bool:
        """With backend dask: the cluster is a local one this process starts (no address, no gateway)."""
        return self.dask_address is None and self.dask_gateway_address is None

    def dask_client(self) -> Client:
        """A client of this service's cluster (``shared.distributed.cluster.connect``, or ``connect_gateway``
        with DASK_GATEWAY_ADDRESS), for the caller to close: closing it shuts down a cluster it started
        through the gateway, never one it connected to by name."""
        from shared.distributed.cluster import GatewayAuth, connect, connect_gateway

        if self.dask_gateway_address is not None:
            password, token = self.dask_gateway_password, self.dask_gateway_jupyterhub_token
            return connect_gateway(
                self.dask_gateway_address,
                proxy_address=self.dask_gateway_proxy_address,
                auth=GatewayAuth(
                    self.dask_gateway_auth,
                    username=self.dask_gateway_username,
                    password=None if password is None else password.get_secret_value(),
                    token=None if token is None else token.get_secret_value(),
                ),
                cluster_name=self.dask_gateway_cluster,
                n_workers=self.dask_gateway_workers,
                cluster_options=self.dask_gateway_cluster_options,
            )
        return connect(
            self.dask_address,
            tls_ca=self.dask_tls_ca,
            tls_cert=self.dask_tls_cert,
            tls_key=self.dask_tls_key,
            n_workers=self.dask_local_workers,
        )
