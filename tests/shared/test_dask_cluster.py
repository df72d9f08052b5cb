"""Connecting to the curator's Dask cluster (``shared.distributed.cluster.connect``) over TLS.

A scheduler and a worker process on this machine with certificates of a test CA (``write_certificates``),
encryption required: a client with a certificate of that CA runs a task; a client without a certificate, with
a certificate of another CA, or without TLS is refused within seconds. Also: the local cluster
``connect(None)`` starts has the workers' environment and no spilling to disk.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

from shared.distributed.cluster import (  # noqa: E402
    WORKER_CONFIG,
    WORKER_ENVIRON,
    connect,
    worker_memory_settings,
)
from shared.distributed.testing import ClusterCertificates, cluster_security, write_certificates  # noqa: E402

REFUSED = (OSError, TimeoutError)  # a failed TLS handshake, a closed connection, or no answer in time


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> ClusterCertificates:
    return write_certificates(tmp_path_factory.mktemp("dask-ca"))


@pytest.fixture(scope="module")
def tls_cluster(certs: ClusterCertificates) -> Iterator[Any]:
    import dask

    with dask.config.set(WORKER_CONFIG):
        cluster = LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            security=cluster_security(certs),
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        )
    try:
        yield cluster
    finally:
        cluster.close()


def square(x: int) -> int:
    return x * x


def test_the_cluster_speaks_tls_only(tls_cluster: Any) -> None:
    assert tls_cluster.scheduler_address.startswith("tls://")
    assert all(w.startswith("tls://") for w in tls_cluster.scheduler_info["workers"])


def test_a_client_with_a_certificate_of_the_cluster_ca_runs_tasks(
    tls_cluster: Any, certs: ClusterCertificates
) -> None:
    client = connect(
        tls_cluster.scheduler_address, tls_ca=certs.ca, tls_cert=certs.cert, tls_key=certs.key, timeout=10
    )
    try:
        assert client.submit(square, 7).result(timeout=10) == 49
        settings = client.run(worker_memory_settings)  # the cluster's workers do not spill to disk
        assert settings and all(s == {"target": False, "spill": False} for s in settings.values())
    finally:
        client.close()


def test_a_certificate_of_another_ca_is_refused(
    tls_cluster: Any, certs: ClusterCertificates, tmp_path: Path
) -> None:
    other = write_certificates(tmp_path / "other-ca", name="intruder")
    started = time.monotonic()
    with pytest.raises(REFUSED):
        connect(
            tls_cluster.scheduler_address, tls_ca=other.ca, tls_cert=other.cert, tls_key=other.key, timeout=3
        )
    # the cluster's CA on our side does not help a certificate the cluster's CA did not sign
    with pytest.raises(REFUSED):
        connect(
            tls_cluster.scheduler_address, tls_ca=certs.ca, tls_cert=other.cert, tls_key=other.key, timeout=3
        )
    assert time.monotonic() - started < 20


def test_no_certificate_or_no_tls_is_refused(tls_cluster: Any, certs: ClusterCertificates) -> None:
    address = tls_cluster.scheduler_address
    with pytest.raises(ValueError, match="TLS address"):  # connect() refuses to try
        connect(address, timeout=3)
    from distributed.security import Security

    # only the CA: no client certificate to present (distributed builds no TLS context without one)
    with pytest.raises((*REFUSED, TypeError, ValueError)):
        Client(address, security=Security(tls_ca_file=str(certs.ca), require_encryption=True), timeout=3)
    # plain TCP to the TLS port
    with pytest.raises(REFUSED):
        Client(address.replace("tls://", "tcp://"), timeout=3)


def worker_environ() -> dict[str, str | None]:
    import os

    return {name: os.environ.get(name) for name in WORKER_ENVIRON}


def test_the_local_cluster_has_the_workers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """One BLAS thread per worker even when this process's environment says otherwise (a nanny would let it
    override its defaults), and no spilling to disk."""
    import os

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    client = connect(None, n_workers=1)
    try:
        assert client.scheduler.address.startswith("tls://")  # in-memory certificates: nobody else joins
        expected = {name: str(value) for name, value in WORKER_ENVIRON.items()}
        assert all(env == expected for env in client.run(worker_environ).values())
        assert os.environ["OPENBLAS_NUM_THREADS"] == "3"  # this process's own is restored
        assert all(
            s == {"target": False, "spill": False} for s in client.run(worker_memory_settings).values()
        )
        assert client.submit(square, 3).result(timeout=10) == 9
    finally:
        cluster = client.cluster
        client.close()
    assert cluster.status.name == "closed"
