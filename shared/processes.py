"""The pobo services as child processes on loopback (``python -m shared.tools.cli <service> serve``): used by
``pobo demo``, ``pobo bench service`` / ``bench load`` and the end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Literal

import httpx

__all__ = ["Kind", "ServiceProcess", "curator_env", "free_port", "modeler_env", "service_pair", "stop_all"]

Kind = Literal["curator", "modeler"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServiceProcess:
    """One pobo service as a child process (``python -m shared.tools.cli <kind> serve``), logging to a file.

    ``kind`` is ``"curator"`` or ``"modeler"`` (a subclass overriding ``command`` names its own). ``env``
    holds the service's settings (``POBO_CURATOR_*`` / ``POBO_MODELER_*``); the child inherits the rest of
    this process's environment. Use as a context manager: it is stopped with SIGTERM on exit.
    """

    def __init__(
        self,
        kind: str,
        *,
        port: int,
        env: Mapping[str, str],
        log_path: Path,
        host: str = "127.0.0.1",
        scheme: Literal["http", "https"] = "http",
        verify: ssl.SSLContext | bool = True,
        workers: int = 1,
    ) -> None:
        self.kind = kind
        self.workers = workers  # uvicorn worker processes (``--workers``); > 1: a supervisor and its workers
        self.host = host
        self.scheme = scheme  # "https" when env carries the service's TLS_CERTFILE / TLS_KEYFILE settings
        self.verify = verify  # how wait_healthy checks the service's certificate (https only)
        self.port = port
        self.env = dict(env)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._terminated = False
        self._log_offset = 0

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The child's command line (a subclass serves another app the same way)."""
        return [
            sys.executable,
            "-m",
            "shared.tools.cli",
            self.kind,
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
        ]

    def start(self) -> ServiceProcess:
        cmd = self.command()
        self._terminated = False
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0  # this start's lines
        with open(self.log_path, "ab") as log:
            # A session of its own: kill() reaches the worker processes too, as a crash of the host would.
            self.proc = subprocess.Popen(  # noqa: S603
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def pids(self) -> list[int]:
        """The service's processes: the supervisor (or the single process) first, then its workers."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        import psutil

        try:
            parent = psutil.Process(self.proc.pid)
            return [parent.pid, *(c.pid for c in parent.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Poll ``GET /healthz`` until 200 (and, with several workers, until all have started); raise (with
        the log's tail) if the process dies or times out."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0, verify=self.verify) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the {self.kind} exited with code {self.proc.returncode}:\n{self.log_tail()}"
                    )
                try:
                    if (
                        http.get(f"{self.url}/healthz").status_code == 200
                        and self._listens()
                        and self._workers_started()
                    ):
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"the {self.kind} did not become healthy in {timeout:.0f} s:\n{self.log_tail()}")

    def _listens(self) -> bool:
        """The port is held by this service's own processes. ``free_port`` cannot reserve a port, so another
        service started at the same moment can take it first: its ``/healthz`` answers while this one fails
        to bind, and a caller would talk to the wrong service."""
        import psutil

        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                for conn in psutil.Process(pid).net_connections(kind="tcp"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == self.port:
                        return True
        return False

    def _workers_started(self) -> bool:
        """With several workers: every one has finished its start-up (so none is still importing when the
        first requests arrive). One process: already true when ``/healthz`` answers."""
        if self.workers <= 1:
            return True
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            return False
        return text.count("Application startup complete.") >= self.workers

    def stop(self, timeout: float = 15.0) -> bool:
        """SIGTERM (a graceful uvicorn shutdown), then SIGKILL if it does not exit within ``timeout``.

        True when the process shut down cleanly: uvicorn finishes its shutdown and then re-raises the
        signal it caught, so a clean exit is status 0 or -SIGTERM (anything but our SIGKILL).
        """
        if self.proc is None:
            return True
        if self.proc.poll() is not None:
            self.kill()  # workers a dead supervisor may have left behind
            return self.proc.returncode in (0, -signal.SIGTERM)
        self.terminate()
        return self._wait_stopped(timeout)

    def terminate(self) -> None:
        """SIGTERM, once (a second one would make uvicorn skip the rest of its graceful shutdown); a
        supervisor passes it on to its workers. ``stop`` then waits."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def _wait_stopped(self, timeout: float) -> bool:
        assert self.proc is not None
        try:
            clean = self.proc.wait(timeout) in (0, -signal.SIGTERM)
        except subprocess.TimeoutExpired:
            clean = False
        self.kill()  # whatever is left of the process group (nothing, after a clean shutdown)
        return clean

    def kill(self) -> None:
        """SIGKILL to the whole process group: no shutdown code runs (what a crash looks like)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def __enter__(self) -> ServiceProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def stop_all(*services: ServiceProcess, timeout: float = 15.0) -> bool:
    """Stop several services at once (SIGTERM to each, then wait for each, as ``stop``): their graceful
    shutdowns overlap. True when every one shut down cleanly."""
    for service in services:
        service.terminate()
    clean = [service.stop(timeout) for service in services]  # every one waited for, even after a failure
    return all(clean)


def curator_env(
    data_dir: Path, admin_token: str, database_url: str | None = None, **extra: str
) -> dict[str, str]:
    env = {"POBO_CURATOR_DATA_DIR": str(data_dir), "POBO_CURATOR_ADMIN_TOKEN": admin_token, **extra}
    if database_url:
        env["POBO_CURATOR_DATABASE_URL"] = database_url
    return env


def modeler_env(data_dir: Path, token: str, database_url: str | None = None, **extra: str) -> dict[str, str]:
    env = {"POBO_MODELER_DATA_DIR": str(data_dir), "POBO_MODELER_TOKEN": token, **extra}
    if database_url:
        env["POBO_MODELER_DATABASE_URL"] = database_url
    return env


def service_pair(
    tmp: Path,
    admin_token: str,
    modeler_token: str,
    database_url: str | None = None,
    *,
    workers: int = 1,
    curator_extra: Mapping[str, str] | None = None,
    **modeler_extra: str,
) -> tuple[ServiceProcess, ServiceProcess]:
    """A curator and a modeler (not started) on free loopback ports, data dirs and logs under ``tmp``;
    both on ``database_url`` (None: each its own SQLite file). ``curator_extra`` / ``modeler_extra``:
    more settings of each (``POBO_CURATOR_*`` / ``POBO_MODELER_*``)."""
    curator = ServiceProcess(
        "curator",
        port=free_port(),
        env=curator_env(tmp / "curator", admin_token, database_url, **(curator_extra or {})),
        log_path=tmp / "curator.log",
        workers=workers,
    )
    modeler = ServiceProcess(
        "modeler",
        port=free_port(),
        env=modeler_env(tmp / "modeler", modeler_token, database_url, **modeler_extra),
        log_path=tmp / "modeler.log",
        workers=workers,
    )
    return curator, modeler
