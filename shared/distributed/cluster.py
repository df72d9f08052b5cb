"""Connecting to a Dask cluster (``connect``): an in-process-managed local cluster, or a scheduler over TLS;
or to a cluster of a dask-gateway server (``connect_gateway``), started through it or found by name.

Isolation. A Dask cluster executes whatever pickled code its clients send, on the data its workers hold. The
curator's cluster holds raw rows (and a release's noise keys while it runs), so it belongs to the curator
alone: its scheduler must be reachable only by the curator's processes (TLS with client certificates from a
CA of the curator's own, ``require_encryption``), never by the modeler or a partner; the modeler runs a
cluster of its own for the GP loop. Each organisation runs its own cluster (docs/scaling.md).

Workers. ``WORKER_ENVIRON`` is what a worker process needs before it starts (set by the nanny: numpy's BLAS
and OpenMP pools at one thread, since Dask runs one task per thread and a pool per task would oversubscribe
the cores; glibc returning freed memory to the OS promptly, so a worker that drew a block's noise does not
keep its peak). These are Dask's defaults too, but a nanny lets the environment of the process that starts it
override them: a curator started with ``OPENBLAS_NUM_THREADS=8`` would give every worker 8 BLAS threads; so
``connect(None)`` sets them in its own environment while it starts the workers (``_worker_environ``).

Spilling. ``WORKER_CONFIG`` turns off Dask's spilling of worker memory to disk: a worker under memory
pressure would otherwise pickle task results (a release's noisy blocks, a partition's state) into files in
its local directory, outside the curator's data dir, its permissions and its erasure; pobo keeps large state
in its own memory-mapped storage, and a worker over its limit pauses (and is restarted past
``terminate``) instead. ``connect(None, ...)`` applies both to the local cluster it starts; an operator
starting ``dask worker`` processes sets them there (docs/scaling.md), and ``connect`` logs a warning when a
worker of an existing cluster spills.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from distributed import Client

__all__ = [
    "WORKER_CONFIG",
    "WORKER_ENVIRON",
    "GatewayAuth",
    "TlsFiles",
    "close_gateway",
    "connect",
    "connect_gateway",
    "worker_memory_settings",
]

logger = logging.getLogger(__name__)

#: Environment of every worker process, set by its nanny before the process starts (Dask's
#: ``distributed.nanny.pre-spawn-environ``; these are also Dask's defaults, set here explicitly so that a site
#: configuration cannot undo them).
WORKER_ENVIRON: dict[str, str | int] = {
    "MALLOC_TRIM_THRESHOLD_": 65536,
    "OMP_NUM_THREADS": 1,
    "MKL_NUM_THREADS": 1,
    "OPENBLAS_NUM_THREADS": 1,
}

#: Dask configuration of the workers: no spilling to disk (module docstring).
WORKER_CONFIG: dict[str, Any] = {
    "distributed.nanny.pre-spawn-environ": WORKER_ENVIRON,
    "distributed.worker.memory.target": False,
    "distributed.worker.memory.spill": False,
}


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a TLS client: the cluster's CA certificate, this client's certificate and its key."""

    ca: Path
    cert: Path
    key: Path


def _security(tls: TlsFiles) -> Any:
    from distributed import security as dask_security

    Security: Any = dask_security.Security  # distributed is untyped

    for name, path in (("CA certificate", tls.ca), ("certificate", tls.cert), ("key", tls.key)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"the Dask TLS {name} {str(path)!r} is not a file")
    return Security(
        tls_ca_file=str(tls.ca),
        tls_client_cert=str(tls.cert),
        tls_client_key=str(tls.key),
        require_encryption=True,
    )


@contextmanager
def _worker_environ() -> Iterator[None]:
    """``WORKER_ENVIRON`` in this process's environment while a local cluster's nannies start (each reads it,
    and lets it override ``distributed.nanny.pre-spawn-environ``); the previous values are restored after.
    (A nanny sets its values in this process's environment again when it restarts a worker.)"""
    saved = {name: os.environ.get(name) for name in WORKER_ENVIRON}
    os.environ.update({name: str(value) for name, value in WORKER_ENVIRON.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def worker_memory_settings() -> dict[str, Any]:
    """The spilling settings of the process it runs in (``client.run`` runs it on every worker)."""
    import dask

    return {
        "target": dask.config.get("distributed.worker.memory.target"),
        "spill": dask.config.get("distributed.worker.memory.spill"),
    }


def connect(
    address: str | None,
    *,
    tls_ca: Path | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    n_workers: int = 2,
    timeout: float = 30.0,
) -> Client:
    """A Dask client, for the caller to ``close()``.

    ``address`` None: a ``LocalCluster`` of ``n_workers`` worker processes with one thread each, owned by the
    client (closing the client stops it), with ``WORKER_CONFIG``, and TLS with a key and self-signed
    certificate made in memory for it (``Security.temporary()``: no other process can join or submit work,
    though it listens on a local port); tests and one-machine deployments. ``tls_*`` are then ignored.

    ``address`` "tls://host:port": an existing scheduler, with this client's certificate and key and the
    cluster's CA (all three required; the scheduler refuses clients without a certificate of its CA).
    "tcp://host:port" (no encryption, no authentication) is accepted only without TLS files, for a scheduler
    reachable by nobody else. ``timeout``: seconds to wait for the scheduler.
    """
    import distributed

    make_client: Any = distributed.Client  # distributed is untyped

    if address is None:
        import dask

        if isinstance(n_workers, bool) or int(n_workers) < 1:
            raise ValueError(f"n_workers must be an integer >= 1, got {n_workers!r}")
        with dask.config.set(WORKER_CONFIG), _worker_environ():
            local: Client = make_client(
                n_workers=int(n_workers),
                threads_per_worker=1,
                processes=True,
                security=True,  # Security.temporary(), shared by the scheduler, the workers and this client
                dashboard_address="127.0.0.1:0",  # the scheduler's HTTP server (health, metrics): loopback
                set_as_default=False,
                timeout=timeout,
            )
            return local

    given = [p for p in (tls_ca, tls_cert, tls_key) if p is not None]
    if given and len(given) != 3:
        raise ValueError("a TLS connection needs all three: the CA certificate, the certificate and the key")
    scheme = address.split("://", 1)[0] if "://" in address else ""
    if scheme not in ("tls", "tcp"):
        raise ValueError(f"the Dask scheduler address must start with tls:// or tcp://, got {address!r}")
    if scheme == "tls" and not given:
        raise ValueError(f"{address!r} is a TLS address: give the CA certificate, certificate and key")
    if scheme == "tcp" and given:
        raise ValueError(f"TLS files were given for the unencrypted address {address!r}: use tls://")
    security = None
    if tls_ca is not None and tls_cert is not None and tls_key is not None:
        security = _security(TlsFiles(tls_ca, tls_cert, tls_key))
    client: Client = make_client(address, security=security, timeout=timeout, set_as_default=False)
    _warn_if_spilling(client)
    return client


def _warn_if_spilling(client: Any) -> None:
    try:
        spilling = {
            worker: memory
            for worker, memory in client.run(worker_memory_settings).items()
            if memory["target"] is not False or memory["spill"] is not False
        }
    except Exception:  # pragma: no cover - a worker that cannot answer: the release will find out
        spilling = {}
    if spilling:
        logger.warning(
            "Dask workers %s may spill task results to their local disk (distributed.worker.memory.target / "
            "spill are not false); start them with DASK_DISTRIBUTED__WORKER__MEMORY__TARGET=False and "
            "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False (docs/scaling.md)",
            ", ".join(sorted(spilling)),
        )


# -- dask-gateway


@dataclass(frozen=True)
class GatewayAuth:
    """How to authenticate to a dask-gateway server: ``kerberos`` (this process's Kerberos ticket; the
    ``pykerberos`` package, ``dask-gateway[kerberos]``), ``jupyterhub`` (``token``, else the environment's
    ``JUPYTERHUB_API_TOKEN``) or ``basic`` (``username`` and ``password``)."""

    kind: Literal["kerberos", "jupyterhub", "basic"] = "kerberos"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    def make(self, module: Any) -> Any:
        """The ``dask_gateway`` auth object (``module``: the imported ``dask_gateway``)."""
        if self.kind == "basic":
            if not self.username or self.password is None:
                raise ValueError("dask-gateway basic auth needs a username and a password")
            return module.BasicAuth(username=self.username, password=self.password)
        if self.kind == "jupyterhub":
            token = self.token or os.environ.get("JUPYTERHUB_API_TOKEN")
            if not token:
                raise ValueError(
                    "dask-gateway jupyterhub auth needs a JupyterHub API token (the setting, or the "
                    "JUPYTERHUB_API_TOKEN environment variable)"
                )
            return module.JupyterHubAuth(api_token=token)
        if self.kind == "kerberos":
            try:
                import kerberos  # noqa: F401  # what KerberosAuth uses
            except ImportError as exc:
                raise ImportError(
                    "dask-gateway kerberos auth needs the pykerberos package: pip install "
                    "'dask-gateway[kerberos]' (and a Kerberos ticket for this service, kinit), or use auth "
                    "basic or jupyterhub"
                ) from exc
            return module.KerberosAuth()
        raise ValueError(f"unknown dask-gateway auth {self.kind!r}: kerberos, jupyterhub or basic")


def _import_dask_gateway() -> Any:
    try:
        import dask_gateway
    except ImportError as exc:
        raise ImportError(
            "a dask-gateway cluster needs the dask-gateway client: pip install 'pobo[dask-gateway]' (in the "
            "service's image or virtualenv), or unset DASK_GATEWAY_ADDRESS"
        ) from exc
    return dask_gateway


@cache
def _gateway_client_class() -> type[Any]:
    """A ``distributed.Client`` that closes its gateway cluster object when it is closed (a plain client of
    a cluster object leaves it open): shutting the cluster down if this process started it."""
    import distributed

    base: Any = distributed.Client  # distributed is untyped

    class GatewayClient(base):  # type: ignore[misc]
        _pobo_gateway_cluster: Any = None
        _pobo_shutdown: bool = False

        def close(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().close(*args, **kwargs)
            finally:
                cluster, self._pobo_gateway_cluster = self._pobo_gateway_cluster, None
                if cluster is not None:
                    _close_gateway_cluster(cluster, shutdown=self._pobo_shutdown)

    return GatewayClient


def _close_gateway_cluster(cluster: Any, *, shutdown: bool) -> None:
    try:
        cluster.close(shutdown=shutdown)
    except Exception:  # pragma: no cover - the gateway is gone: its idle timeout will stop the cluster
        logger.warning(
            "could not close the dask-gateway cluster %s", getattr(cluster, "name", "?"), exc_info=True
        )
    finally:
        gateway = getattr(cluster, "gateway", None)
        if gateway is not None:
            _forget_loop(gateway)


def close_gateway(gateway: Any) -> None:
    """Close a ``dask_gateway.Gateway`` for good. Its ``__del__`` closes it again, and a second close raises
    (distributed's loop runner refuses a stopped loop) wherever the garbage collector happens to run it,
    even in the middle of an import; so the closed client forgets its loop runner (``__del__`` then does
    nothing)."""
    try:
        gateway.close()
    finally:
        _forget_loop(gateway)


def _forget_loop(gateway: Any) -> None:
    vars(gateway).pop("_loop_runner", None)


def connect_gateway(
    address: str,
    *,
    proxy_address: str | None = None,
    auth: GatewayAuth | None = None,
    cluster_name: str | None = None,
    n_workers: int = 2,
    cluster_options: dict[str, Any] | None = None,
    timeout: float = 30.0,
    worker_timeout: float = 600.0,
) -> Client:
    """A Dask client of a cluster of the dask-gateway server at ``address`` (https://host:port), for the
    caller to ``close()``.

    ``cluster_name`` None: a new cluster started through the gateway with ``cluster_options`` (checked
    against the options the gateway offers) and scaled to ``n_workers``; closing the client shuts it down.
    ``cluster_name`` given: that running cluster; closing the client leaves it running (whoever started it
    stops it). Either way the client waits up to ``worker_timeout`` seconds for the workers (``n_workers``
    of a new cluster, one of an existing one), since the GP loops partition over the workers they see.
    ``proxy_address``: the gateway's scheduler proxy (tls://host:port; default the gateway's host and port).
    The connection to the scheduler is TLS with the credentials the gateway issues for the cluster.
    """
    dask_gateway = _import_dask_gateway()
    if not address.startswith(("https://", "http://")):
        raise ValueError(f"the dask-gateway address must be its URL, https://host:port, got {address!r}")
    if isinstance(n_workers, bool) or int(n_workers) < 1:
        raise ValueError(f"n_workers must be an integer >= 1, got {n_workers!r}")
    gateway = dask_gateway.Gateway(
        address=address, proxy_address=proxy_address, auth=(auth or GatewayAuth()).make(dask_gateway)
    )
    started = cluster_name is None
    cluster: Any = None
    try:
        if started:
            options = gateway.cluster_options()
            for key, value in (cluster_options or {}).items():
                try:
                    options[key] = value
                except (AttributeError, KeyError, TypeError, ValueError) as exc:
                    raise ValueError(
                        f"dask-gateway cluster option {key}={value!r} is refused by the gateway ({exc}); "
                        f"it offers: {', '.join(sorted(options)) or 'none'}"
                    ) from exc
            cluster = gateway.new_cluster(cluster_options=options, shutdown_on_close=True)
            logger.info("started the dask-gateway cluster %s at %s", cluster.name, address)
            cluster.scale(int(n_workers))
        else:
            cluster = gateway.connect(cluster_name, shutdown_on_close=False)
        client: Any = _gateway_client_class()(
            cluster, security=cluster.security, set_as_default=False, timeout=timeout, loop=cluster.loop
        )
        client._pobo_gateway_cluster = cluster
        client._pobo_shutdown = started
    except BaseException:
        if cluster is not None:
            _close_gateway_cluster(cluster, shutdown=started)
        close_gateway(gateway)
        raise
    close_gateway(gateway)  # the cluster object has a gateway client of its own
    try:
        client.wait_for_workers(int(n_workers) if started else 1, timeout=worker_timeout)
    except BaseException:
        client.close()
        raise
    _warn_if_spilling(client)
    result: Client = client
    return result
