"""``pobo demo``: the whole two-party loop on this machine, with both services as real processes.

1. Start the curator and the modeler (``python -m shared.cli <service> serve``) on free loopback ports, each
   with a temporary data dir and SQLite database; wait for ``/healthz``.
2. Curator (admin): upload the bundled synthetic hospital CSV (``shared/data/demo_hospital.csv``; the
   outcome column stays with the curator) with declared per-feature scales, read the privacy report (what
   the release protects, in clinical units), create the default Gaussian release (epsilon = 1,
   delta = 1e-5), grant a partner (the modeler) access with a query quota.
3. Modeler: create a GP-UCB study over the release, run it in the background, follow its progress.
4. Report: best patient found vs the true best (the demo generated the CSV, so it knows every outcome),
   simple regret, the regret random choice would have had, privacy spent, audit chain verified and
   reconciled with the curator's query log. Write ``plot.png`` and ``audit.csv``; stop both services.

``ServiceProcess`` and ``free_port`` are reused by ``pobo bench service`` and the end-to-end tests.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx
import numpy as np
import numpy.typing as npt

from shared.client import CuratorClient

__all__ = ["DEMO_CSV", "ServiceProcess", "expected_random_regret", "free_port", "run_demo", "service_pair"]

DEMO_CSV = Path(__file__).with_name("data") / "demo_hospital.csv"
#: Release parameters of the demo: the default Gaussian release at (epsilon, delta), all d = 7 features (no
#: projection). delta = 1e-5 is well below 1/n = 2.5e-4. In the declared units (e.g. 0.4 years of age) the
#: features spread over ~40 units, the noise (std 3.73) over ~4.
DEMO_EPSILON, DEMO_DELTA = 1.0, 1e-5

Kind = Literal["curator", "modeler"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServiceProcess:
    """One pobo service as a child process (``python -m shared.cli <kind> serve``), logging to a file.

    ``env`` holds the service's settings (``POBO_CURATOR_*`` / ``POBO_MODELER_*``); the child inherits the
    rest of this process's environment. Use as a context manager: it is stopped with SIGTERM on exit.
    """

    def __init__(
        self,
        kind: Kind,
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
        self._log_offset = 0

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self) -> ServiceProcess:
        cmd = [
            sys.executable,
            "-m",
            "shared.cli",
            self.kind,
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
        ]
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
                    if http.get(f"{self.url}/healthz").status_code == 200 and self._workers_started():
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"the {self.kind} did not become healthy in {timeout:.0f} s:\n{self.log_tail()}")

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
        self.proc.send_signal(signal.SIGTERM)  # a supervisor passes it on to its workers
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


def curator_env(data_dir: Path, admin_token: str, database_url: str | None = None) -> dict[str, str]:
    env = {"POBO_CURATOR_DATA_DIR": str(data_dir), "POBO_CURATOR_ADMIN_TOKEN": admin_token}
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
    **modeler_extra: str,
) -> tuple[ServiceProcess, ServiceProcess]:
    """A curator and a modeler (not started) on free loopback ports, data dirs and logs under ``tmp``;
    both on ``database_url`` (None: each its own SQLite file)."""
    curator = ServiceProcess(
        "curator",
        port=free_port(),
        env=curator_env(tmp / "curator", admin_token, database_url),
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


def expected_random_regret(y: npt.ArrayLike, k: int) -> float:
    """Exact E[max(y) - max of k rows drawn without replacement] (order statistics, no simulation).

    With y sorted descending, P(the best of the k rows is the j-th best) = C(n-j, k-1) / C(n, k).
    """
    ys = np.sort(np.asarray(y, dtype=np.float64))[::-1]
    n = ys.size
    k = min(max(int(k), 1), n)
    j = np.arange(1, n - k + 2)
    log_p = np.array([math.lgamma(n - jj + 1) - math.lgamma(k) - math.lgamma(n - jj - k + 2) for jj in j]) - (
        math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    )
    p = np.exp(log_p)
    return float(ys[0] - (p * ys[: j.size]).sum() / p.sum())


def _read_demo_csv(path: Path) -> tuple[list[str], npt.NDArray[np.float64]]:
    from shared.data.make_demo_dataset import OUTCOME

    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return [r["patient"] for r in rows], np.array([float(r[OUTCOME]) for r in rows])


def run_demo(output: Path = Path("pobo-demo-output"), iterations: int = 50) -> dict[str, Any]:
    """Run the demo end to end (see the module docstring); returns the numbers it printed."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from shared.data.make_demo_dataset import DP_UNITS, FEATURES, OUTCOME

    console = Console()
    started = time.monotonic()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    patients, outcome = _read_demo_csv(DEMO_CSV)
    admin_token, modeler_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="pobo-demo-") as tmp_name:
        tmp = Path(tmp_name)
        curator = ServiceProcess(
            "curator",
            port=free_port(),
            env=curator_env(tmp / "curator", admin_token),
            log_path=tmp / "curator.log",
        )
        modeler = ServiceProcess(
            "modeler",
            port=free_port(),
            env=modeler_env(tmp / "modeler", modeler_token),
            log_path=tmp / "modeler.log",
        )
        try:
            with console.status("starting the curator and the modeler ..."):
                curator.start()
                modeler.start()
                curator.wait_healthy()
                modeler.wait_healthy()
            console.print(
                f"[bold]curator[/] {curator.url}   [bold]modeler[/] {modeler.url}   (data in {tmp})"
            )
            result = _demo_flow(
                console,
                curator.url,
                modeler.url,
                admin_token,
                modeler_token,
                iterations,
                output,
                features=FEATURES,
                outcome_name=OUTCOME,
                scales=DP_UNITS,
                patients=patients,
                outcome=outcome,
                progress_cls=(Progress, TextColumn, BarColumn, MofNCompleteColumn, TimeElapsedColumn),
            )
        except Exception:
            console.print("[red]the demo failed[/]; curator log:\n" + curator.log_tail())
            console.print("modeler log:\n" + modeler.log_tail())
            raise
        finally:
            with console.status("stopping both services ..."):
                clean = curator.stop() & modeler.stop()
    result["runtime_s"] = time.monotonic() - started
    result["clean_shutdown"] = clean

    table = Table(title="pobo demo: private outsourced BO on a synthetic hospital dataset", show_header=True)
    table.add_column("", style="bold")
    table.add_column("value", justify="right")
    table.add_row("patients (n) / features (d)", f"{result['n']} / {len(FEATURES)}")
    guarantee = "[green]formal (epsilon, delta)-DP[/]" if result["formal_guarantee"] else "[red]none[/]"
    table.add_row(
        "release",
        f"{result['mechanism']}: epsilon = {DEMO_EPSILON:g}, delta = {DEMO_DELTA:g}, "
        f"noise std {result['noise_std']:.3g}, r = {result['r']}",
    )
    table.add_row("guarantee", guarantee)
    table.add_row("what is protected", result["protected"])
    table.add_row("outcomes", "disclosed to the modeler as measured (no output privacy yet)")
    table.add_row("curator queries (iterations)", str(result["iterations"]))
    table.add_row("best patient found", f"{result['best_patient']}  ({OUTCOME} {result['best_y']:.2f})")
    table.add_row(
        "true best patient", f"{result['true_best_patient']}  ({OUTCOME} {result['true_best_y']:.2f})"
    )
    table.add_row("simple regret (GP-UCB)", f"[green]{result['regret']:.2f}[/]")
    table.add_row(f"regret of random choice ({iterations} rows, expected)", f"{result['random_regret']:.2f}")
    table.add_row(
        "privacy spent (population budget)",
        f"epsilon {result['epsilon_spent']:g} of {result['epsilon_budget']:g}, "
        f"delta {result['delta_spent']:g} of {result['delta_budget']:g}",
    )
    table.add_row("audit chain verified", "[green]yes[/]" if result["audit_ok"] else "[red]NO[/]")
    table.add_row(
        "audit log = curator's query log", "[green]yes[/]" if result["reconciled"] else "[red]NO[/]"
    )
    table.add_row("output", f"{output / 'plot.png'}, {output / 'audit.csv'}")
    table.add_row("runtime", f"{result['runtime_s']:.1f} s")
    table.add_row("services stopped cleanly", "yes" if result["clean_shutdown"] else "[red]no (killed)[/]")
    console.print(table)
    return result


def _demo_flow(
    console: Any,
    curator_url: str,
    modeler_url: str,
    admin_token: str,
    modeler_token: str,
    iterations: int,
    output: Path,
    *,
    features: list[str],
    outcome_name: str,
    scales: dict[str, float],
    patients: list[str],
    outcome: npt.NDArray[np.float64],
    progress_cls: tuple[Any, ...],
) -> dict[str, Any]:
    Progress, TextColumn, BarColumn, MofNCompleteColumn, TimeElapsedColumn = progress_cls
    with CuratorClient(curator_url, admin_token) as admin:
        dataset = admin.upload_dataset(
            DEMO_CSV,
            name="demo hospital (synthetic)",
            features=features,
            objective=outcome_name,
            scaling=scales,
            epsilon_budget=10.0,
            delta_budget=1e-3,
        )
        console.print(
            f"curator: uploaded dataset {dataset.id} ({dataset.n} synthetic patients, {dataset.d} features)"
        )
        report = admin.privacy_report(dataset.id, epsilon=DEMO_EPSILON, delta=DEMO_DELTA, r_max=1)
        covered = ", ".join(f"{f.feature} by {f.covered_change:g}" for f in report.features[:3])
        console.print(
            f"curator: privacy report at epsilon={DEMO_EPSILON:g}, delta={DEMO_DELTA:g}: a Gaussian release "
            f"adds noise of std {report.noise_std:.3g} (declared units) and protects one patient's row "
            f"moving by norm <= 1 in those units, e.g. {covered} alone"
        )
        release = admin.create_release(dataset.id, epsilon=DEMO_EPSILON, delta=DEMO_DELTA)
        protected = f"one patient's row moving by norm <= 1 in declared units (e.g. {covered} alone)"
        partner = admin.create_partner("demo modeler", release_ids=[release.id], max_queries=iterations + 10)
        console.print(
            f"curator: release {release.id} ready; partner '{partner.name}' granted {iterations + 10} queries"
        )

        with httpx.Client(
            base_url=modeler_url, headers={"Authorization": f"Bearer {modeler_token}"}, timeout=60.0
        ) as modeler:
            resp = modeler.post(
                "/v1/studies",
                json={
                    "curator_url": curator_url,
                    "release_id": release.id,
                    "curator_token": partner.token,
                    "strategy": "gp-ucb",
                    "iterations": iterations,
                    "hyperparameters": "mle",
                    "initial_points": 1,
                },
            )
            resp.raise_for_status()
            study = resp.json()
            console.print(
                f"modeler: study {study['id']} over Z ({study['n']} x {study['r']}), sha256 verified"
            )
            modeler.post(f"/v1/studies/{study['id']}/run").raise_for_status()
            columns = (TextColumn("[bold]GP-UCB[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            with Progress(*columns, TextColumn("{task.fields[best]}"), console=console) as progress:
                task = progress.add_task("run", total=iterations, best="")
                while True:
                    study = modeler.get(f"/v1/studies/{study['id']}").json()
                    best = study["best"]
                    progress.update(
                        task,
                        completed=study["iterations_done"],
                        best=f"best {outcome_name} {best['y']:.2f}" if best else "",
                    )
                    if study["status"] in ("done", "failed"):
                        break
                    time.sleep(0.1)
            if study["status"] != "done":
                raise RuntimeError(f"the study failed: {study['error']}")
            verify = modeler.get(f"/v1/studies/{study['id']}/audit/verify").json()
            entries = modeler.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
            (output / "audit.csv").write_text(
                modeler.get(f"/v1/studies/{study['id']}/audit", params={"format": "csv"}).text,
                encoding="utf-8",
            )
            (output / "plot.png").write_bytes(modeler.get(f"/v1/studies/{study['id']}/plot.png").content)
        queries = admin.list_queries(release.id).queries
        reconciled = [(q.id, q.index, q.y) for q in queries] == [
            (e["curator_query_id"], e["index"], e["y"]) for e in entries
        ]
        spent = admin.get_dataset(dataset.id)
    best_index = int(study["best"]["index"])
    true_best = int(np.argmax(outcome))
    return {
        "n": int(study["n"]),
        "r": int(study["r"]),
        "mechanism": release.mechanism,
        "formal_guarantee": release.formal_guarantee,
        "noise_std": release.noise_std,
        "protected": protected,
        "iterations": int(study["iterations_done"]),
        "best_index": best_index,
        "best_patient": patients[best_index],
        "best_y": float(study["best"]["y"]),
        "true_best_patient": patients[true_best],
        "true_best_y": float(outcome[true_best]),
        "regret": float(outcome[true_best] - study["best"]["y"]),
        "random_regret": expected_random_regret(outcome, iterations),
        "epsilon_spent": spent.epsilon_spent,
        "epsilon_budget": spent.epsilon_budget,
        "delta_spent": spent.delta_spent,
        "delta_budget": spent.delta_budget,
        "audit_ok": bool(verify["ok"]),
        "reconciled": reconciled,
    }
