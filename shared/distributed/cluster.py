"""Connecting to a Dask cluster (``connect``): an in-process-managed local cluster, or a scheduler over TLS.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["WORKER_CONFIG", "WORKER_ENVIRON", "TlsFiles", "connect", "worker_memory_settings"]

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
    return client
