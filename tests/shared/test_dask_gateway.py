"""A service's cluster through a dask-gateway server (``DASK_GATEWAY_*``, ``shared.distributed.cluster``).

The settings: a gateway and a scheduler address exclude each other, basic auth needs its credentials,
jupyterhub auth a token, the address is the gateway's URL. Then a real ``dask-gateway-server`` on this
machine (its local-process backend, simple password auth, the scheduler proxy on a port of its own): a
service's ``dask_client()`` starts a cluster through it, runs a task on it and shuts it down when the client
closes; a cluster it only connected to by name keeps running; a wrong password or an option the gateway
does not offer fails with a message that says so; the curator's ``ComputeBackend`` uses the same client.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

pytest.importorskip("distributed")

from curator_service.config import Settings as CuratorSettings  # noqa: E402
from modeler_service.config import Settings as ModelerSettings  # noqa: E402
from shared.distributed import cluster as cluster_module  # noqa: E402
from shared.distributed.cluster import (  # noqa: E402
    GatewayAuth,
    close_gateway,
    connect_gateway,
    worker_memory_settings,
)
from shared.processes import free_port  # noqa: E402

SERVICES = [("curator", CuratorSettings), ("modeler", ModelerSettings)]
GATEWAY = "https://gateway.example:443"
PASSWORD = "gateway-test-password"


@pytest.fixture(autouse=True)
def _no_pobo_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("POBO_") or key == "JUPYTERHUB_API_TOKEN":
            monkeypatch.delenv(key)


def _settings(cls: Any, tmp_path: Path, **values: Any) -> Any:
    return cls(data_dir=tmp_path / "data", backend="dask", **values)


# -- the settings


@pytest.mark.parametrize(("service", "cls"), SERVICES)
def test_a_gateway_and_a_scheduler_address_exclude_each_other(service: str, cls: Any, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=f"POBO_{service.upper()}_DASK_ADDRESS and .*are both set"):
        _settings(
            cls,
            tmp_path,
            dask_address="tcp://127.0.0.1:8786",
            dask_gateway_address=GATEWAY,
            dask_gateway_auth="basic",
            dask_gateway_username="pobo",
            dask_gateway_password=PASSWORD,
        )


@pytest.mark.parametrize(("service", "cls"), SERVICES)
def test_basic_auth_needs_a_username_and_a_password(service: str, cls: Any, tmp_path: Path) -> None:
    prefix = f"POBO_{service.upper()}_"
    for credentials in ({}, {"dask_gateway_username": "pobo"}, {"dask_gateway_password": PASSWORD}):
        with pytest.raises(ValidationError, match=f"{prefix}DASK_GATEWAY_USERNAME and {prefix}DASK_GATEWAY"):
            _settings(cls, tmp_path, dask_gateway_address=GATEWAY, dask_gateway_auth="basic", **credentials)
    settings = _settings(
        cls,
        tmp_path,
        dask_gateway_address=GATEWAY,
        dask_gateway_auth="basic",
        dask_gateway_username="pobo",
        dask_gateway_password=PASSWORD,
    )
    assert PASSWORD not in repr(settings)  # a SecretStr


@pytest.mark.parametrize(
    "address",
    ["gateway.example:443", "tls://gateway.example:8786", "gateway://gateway.example:8786", "https://"],
)
def test_the_gateway_address_is_its_url(address: str, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="DASK_GATEWAY_ADDRESS must be the gateway's URL, https://"):
        _settings(ModelerSettings, tmp_path, dask_gateway_address=address)
    assert _settings(
        ModelerSettings, tmp_path, dask_gateway_address="http://127.0.0.1:8000"
    ).dask_gateway_address


def test_the_proxy_address_is_a_tls_address(tmp_path: Path) -> None:
    with pytest.raises(
        ValidationError, match="DASK_GATEWAY_PROXY_ADDRESS must be the gateway's scheduler proxy"
    ):
        _settings(
            ModelerSettings,
            tmp_path,
            dask_gateway_address=GATEWAY,
            dask_gateway_proxy_address="https://gateway.example:8786",
        )


def test_jupyterhub_auth_needs_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"dask_gateway_address": GATEWAY, "dask_gateway_auth": "jupyterhub"}
    with pytest.raises(ValidationError, match="DASK_GATEWAY_JUPYTERHUB_TOKEN .*or JUPYTERHUB_API_TOKEN"):
        _settings(ModelerSettings, tmp_path, **values)
    assert _settings(ModelerSettings, tmp_path, **values, dask_gateway_jupyterhub_token="t0ken")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t0ken")
    assert _settings(ModelerSettings, tmp_path, **values)


def test_tls_files_and_cluster_options_that_do_not_apply_are_refused(tmp_path: Path) -> None:
    files = {f"dask_tls_{name}": tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    with pytest.raises(ValidationError, match="TLS comes from the gateway"):
        _settings(ModelerSettings, tmp_path, dask_gateway_address=GATEWAY, **files)
    with pytest.raises(ValidationError, match="it connects to a running one"):
        _settings(
            ModelerSettings,
            tmp_path,
            dask_gateway_address=GATEWAY,
            dask_gateway_cluster="prod.abc",
            dask_gateway_cluster_options={"worker_cores": 1},
        )


def test_the_settings_read_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POBO_CURATOR_DASK_GATEWAY_ADDRESS", GATEWAY)
    monkeypatch.setenv("POBO_CURATOR_DASK_GATEWAY_AUTH", "basic")
    monkeypatch.setenv("POBO_CURATOR_DASK_GATEWAY_USERNAME", "pobo")
    monkeypatch.setenv("POBO_CURATOR_DASK_GATEWAY_PASSWORD", PASSWORD)
    monkeypatch.setenv(
        "POBO_CURATOR_DASK_GATEWAY_CLUSTER_OPTIONS", '{"worker_cores": 1, "image": "pobo:0.2.0"}'
    )
    monkeypatch.setenv("POBO_CURATOR_DASK_GATEWAY_WORKERS", "3")
    settings = CuratorSettings(data_dir=tmp_path / "data")
    assert settings.dask_gateway_cluster_options == {"worker_cores": 1, "image": "pobo:0.2.0"}
    assert settings.dask_gateway_workers == 3 and settings.dask_gateway_auth == "basic"
    assert not settings.dask_local_cluster


def test_dask_client_connects_through_the_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(cluster_module, "connect_gateway", lambda address, **kw: calls.append((address, kw)))
    monkeypatch.setattr(
        cluster_module, "connect", lambda *a, **kw: pytest.fail("connect() instead of the gateway")
    )
    settings = _settings(
        ModelerSettings,
        tmp_path,
        dask_gateway_address=GATEWAY,
        dask_gateway_proxy_address="tls://gateway.example:8786",
        dask_gateway_auth="basic",
        dask_gateway_username="pobo",
        dask_gateway_password=PASSWORD,
        dask_gateway_workers=4,
        dask_gateway_cluster_options={"worker_cores": 1},
    )
    settings.dask_client()
    assert calls == [
        (
            GATEWAY,
            {
                "proxy_address": "tls://gateway.example:8786",
                "auth": GatewayAuth("basic", username="pobo", password=PASSWORD),
                "cluster_name": None,
                "n_workers": 4,
                "cluster_options": {"worker_cores": 1},
            },
        )
    ]
    assert PASSWORD not in repr(calls[0][1]["auth"])


def test_without_the_dask_gateway_package_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "dask_gateway", None)  # import fails
    with pytest.raises(ImportError, match=r"pip install 'pobo\[dask-gateway\]'"):
        connect_gateway(GATEWAY, auth=GatewayAuth("basic", username="pobo", password=PASSWORD))


def test_kerberos_auth_without_pykerberos_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kerberos", None)
    with pytest.raises(ImportError, match=r"dask-gateway\[kerberos\]"):
        GatewayAuth("kerberos").make(object())


# -- a real gateway


@dataclass(frozen=True)
class Gateway:
    address: str
    proxy_address: str
    log: Path


GATEWAY_CONFIG = """\
import sys
c.DaskGateway.address = "127.0.0.1:{api_port}"
c.DaskGateway.backend_class = "dask_gateway_server.backends.local.UnsafeLocalBackend"
c.DaskGateway.authenticator_class = "dask_gateway_server.auth.SimpleAuthenticator"
c.SimpleAuthenticator.password = {password!r}
c.Proxy.address = "127.0.0.1:{http_port}"
c.Proxy.tcp_address = "127.0.0.1:{tcp_port}"
c.LocalBackend.clusters_directory = {clusters!r}
c.DBBackendBase.stop_clusters_on_shutdown = True
# the scheduler and the workers: this interpreter (distributed has no dask-scheduler script any more)
c.LocalClusterConfig.scheduler_cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
c.LocalClusterConfig.worker_cmd = [sys.executable, "-m", "distributed.cli.dask_worker"]
c.LocalClusterConfig.worker_memory = "1 G"
c.LocalClusterConfig.worker_threads = 1
c.LocalClusterConfig.idle_timeout = 300
# what docs/scaling.md asks of every worker: no spilling to disk, one BLAS thread
c.LocalClusterConfig.environment = {{
    "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    pytest.importorskip("dask_gateway_server")
    directory = tmp_path_factory.mktemp("gateway")
    http_port, tcp_port, api_port = free_port(), free_port(), free_port()
    config = directory / "gateway_config.py"
    config.write_text(
        GATEWAY_CONFIG.format(
            api_port=api_port,
            http_port=http_port,
            tcp_port=tcp_port,
            password=PASSWORD,
            clusters=str(directory / "clusters"),
        ),
        encoding="utf-8",
    )
    log = directory / "gateway.log"
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "dask_gateway_server", "-f", str(config)],
            cwd=directory,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    address = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{address}/api/health", timeout=2) as answer:  # noqa: S310
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the gateway did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)
        yield Gateway(address, f"tls://127.0.0.1:{tcp_port}", log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _gateway_client(gateway: Gateway) -> Any:
    from dask_gateway import BasicAuth
    from dask_gateway import Gateway as GatewayClient

    return GatewayClient(
        gateway.address, proxy_address=gateway.proxy_address, auth=BasicAuth("pobo", PASSWORD)
    )


def _running(gateway: Gateway) -> set[str]:
    client = _gateway_client(gateway)
    try:
        return {report.name for report in client.list_clusters()}
    finally:
        close_gateway(client)


def _gateway_settings(cls: Any, gateway: Gateway, tmp_path: Path, **values: Any) -> Any:
    return _settings(
        cls,
        tmp_path,
        dask_gateway_address=gateway.address,
        dask_gateway_proxy_address=gateway.proxy_address,
        dask_gateway_auth="basic",
        dask_gateway_username="pobo",
        dask_gateway_password=PASSWORD,
        **values,
    )


@pytest.mark.slow
def test_a_service_starts_a_cluster_through_the_gateway_and_shuts_it_down(
    gateway: Gateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = _running(gateway)
    settings = _gateway_settings(ModelerSettings, gateway, tmp_path, dask_gateway_workers=1)
    client = settings.dask_client()
    try:
        started = _running(gateway) - before
        assert len(started) == 1
        assert client.scheduler.address.startswith("gateway://")  # TLS through the gateway's proxy
        assert len(client.scheduler_info()["workers"]) == 1  # dask_client() waited for the worker
        assert client.submit(pow, 7, 2).result(timeout=30) == 49
        settings_of = client.run(worker_memory_settings)  # the gateway's worker environment: no spilling
        assert settings_of and all(s == {"target": False, "spill": False} for s in settings_of.values())
        assert "may spill" not in caplog.text
    finally:
        client.close()
    deadline = time.monotonic() + 30
    while _running(gateway) & started and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not _running(gateway) & started, "the cluster the service started still runs after close()"
    client.close()  # closing twice is harmless


@pytest.mark.slow
def test_a_cluster_connected_to_by_name_keeps_running(gateway: Gateway, tmp_path: Path) -> None:
    owner = _gateway_client(gateway)
    cluster = owner.new_cluster(shutdown_on_close=False)
    try:
        cluster.scale(1)
        settings = _gateway_settings(CuratorSettings, gateway, tmp_path, dask_gateway_cluster=cluster.name)
        from curator_service.services.releases import ComputeBackend

        backend = ComputeBackend.from_settings(settings)  # the curator's: connects at first use
        try:
            assert backend.client().submit(pow, 3, 3).result(timeout=30) == 27
        finally:
            backend.close()  # the lifespan's shutdown
        assert cluster.name in _running(gateway)  # someone else's cluster: left running
    finally:
        cluster.shutdown()
        close_gateway(cluster.gateway)
        close_gateway(owner)


@pytest.mark.slow
def test_a_wrong_password_or_an_unknown_option_fails_plainly(gateway: Gateway, tmp_path: Path) -> None:
    before = _running(gateway)
    wrong = GatewayAuth("basic", username="pobo", password="not-the-password")
    with pytest.raises(Exception, match="(?i)unauthorized|401|authenticat"):
        connect_gateway(gateway.address, proxy_address=gateway.proxy_address, auth=wrong, worker_timeout=30)
    right = GatewayAuth("basic", username="pobo", password=PASSWORD)
    with pytest.raises(ValueError, match="cluster option worker_gpus=.*refused by the gateway"):
        connect_gateway(
            gateway.address,
            proxy_address=gateway.proxy_address,
            auth=right,
            cluster_options={"worker_gpus": 1},
            worker_timeout=30,
        )
    assert _running(gateway) == before  # nothing was started
