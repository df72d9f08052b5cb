"""``pobo bench load``: many concurrent studies against the curator and the modeler under uvicorn workers.

For each database (SQLite files, PostgreSQL) and each worker count (the baseline, one process per service,
and ``--workers``), both services start as real processes on loopback (``pobo <service> serve --workers
W``, fresh data dirs; on PostgreSQL a fresh schema, dropped afterwards). The curator gets a synthetic
dataset, one release and a partner; the modeler gets ``studies`` studies over that release. Then
``studies`` client threads, one per study, each on its own keep-alive connection, step their study
``iterations`` times with ``POST /v1/studies/{id}/step`` (suggest -> curator query -> observe), all at once.

Measured per configuration: throughput (iterations per second of wall clock, first step sent to last
answer), per-iteration latency p50/p99 as the client sees it, errors (a non-200 answer or a transport
error; target 0), and the peak resident memory of each service: the largest sum of RSS over the service's
processes (supervisor + workers), sampled every 0.2 s. Afterwards every study is checked as an auditor
would: all iterations recorded, and ``pobo reconcile`` (both hash chains verify, every query matches
by id, row and y), and the curator charged exactly one query per iteration (no double charge).
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import psutil

from shared.bo.gp import median_distance
from shared.processes import ServiceProcess, service_pair
from shared.protocol.client import CuratorClient
from shared.tools.bench.report import publish
from shared.tools.reconcile import reconcile

Database = Literal["sqlite", "postgresql"]

#: Where ``--postgres-url`` comes from when not given (the test suite's variable is the fallback).
POSTGRES_ENV = ("POBO_BENCH_POSTGRES_URL", "POBO_TEST_DATABASE_URL")


class LoadBenchError(RuntimeError):
    """The benchmark cannot run as asked (e.g. PostgreSQL unreachable); the message says why."""


def default_postgres_url() -> str | None:
    for name in POSTGRES_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return None


def _write_csv(path: Path, n: int, d: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(0.0, 1.0, (n, d))
    y = np.exp(-0.5 * ((X - 0.5) ** 2).sum(1) / d)
    header = ",".join([*(f"x{j}" for j in range(d)), "objective"])
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header=header, comments="", fmt="%.6f")


@contextmanager
def _postgres_schema(url: str) -> Iterator[str]:
    """A fresh schema for one configuration; yields the services' URL (search_path set), drops it after."""
    import psycopg

    conninfo = re.sub(r"^postgresql\+\w+://", "postgresql://", url)
    schema = f"pobo_load_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.Error as exc:
        raise LoadBenchError(f"cannot create a schema in the PostgreSQL database: {exc}") from None
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


class ResourceSampler:
    """Every ``period`` s: the summed RSS of each service's processes (the peak is kept, bytes); and the
    CPU seconds each service used between entering and leaving the block (user + system)."""

    def __init__(self, services: dict[str, ServiceProcess], period: float = 0.2) -> None:
        self.services = services
        self.period = period
        self.peak: dict[str, int] = dict.fromkeys(services, 0)
        self.processes: dict[str, int] = dict.fromkeys(services, 0)
        self.cpu_seconds: dict[str, float] = dict.fromkeys(services, 0.0)
        self._cpu_start: dict[int, float] = {}
        self._cpu_last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pobo-resource-sampler", daemon=True)

    def sample(self) -> None:
        for name, svc in self.services.items():
            total = 0
            pids = svc.pids()
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    total += proc.memory_info().rss
                    times = proc.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                cpu = times.user + times.system
                self._cpu_start.setdefault(pid, cpu)
                self._cpu_last[pid] = (name, cpu)
            self.peak[name] = max(self.peak[name], total)
            self.processes[name] = max(self.processes[name], len(pids))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def __enter__(self) -> ResourceSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
        for pid, (name, cpu) in self._cpu_last.items():
            self.cpu_seconds[name] += cpu - self._cpu_start[pid]


@dataclass
class StudyRun:
    """What one client thread saw while stepping its study."""

    study_id: str
    latencies_ms: list[float] = field(default_factory=list)
    server_ms: dict[str, list[float]] = field(default_factory=lambda: {"gp": [], "curator": [], "db": []})
    errors: list[str] = field(default_factory=list)


def _step_study(
    url: str, token: str, run: StudyRun, iterations: int, start: threading.Barrier
) -> tuple[float, float]:
    """Step one study ``iterations`` times; returns (first send, last answer) on the monotonic clock."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        http.get("/healthz")  # open the connection before the clock starts
        start.wait()
        first = time.perf_counter()
        for _ in range(iterations):
            t0 = time.perf_counter()
            try:
                resp = http.post(f"/v1/studies/{run.study_id}/step")
            except httpx.HTTPError as exc:
                run.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            run.latencies_ms.append((time.perf_counter() - t0) * 1e3)
            if resp.status_code != 200:
                run.errors.append(f"{resp.status_code}: {resp.text[:200]}")
                continue
            timings = resp.json()["timings"]
            for key in ("gp", "curator", "db"):
                run.server_ms[key].append(float(timings[f"{key}_ms"]))
        return first, time.perf_counter()


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def measure(
    *,
    database: Database = "sqlite",
    postgres_url: str | None = None,
    workers: int = 2,
    studies: int = 20,
    iterations: int = 50,
    n: int = 10_000,
    d: int = 10,
    r: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """One configuration: start both services, run the load, check every study, stop. Returns the numbers."""
    if database == "postgresql" and not postgres_url:
        raise ValueError("PostgreSQL needs --postgres-url (or POBO_BENCH_POSTGRES_URL)")
    admin_token, modeler_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="pobo-load-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        db_url = None
        if database == "postgresql" and postgres_url:
            db_url = stack.enter_context(_postgres_schema(postgres_url))  # dropped after the services stop
        curator, modeler = service_pair(
            tmp, admin_token, modeler_token, db_url, workers=workers, POBO_MODELER_ACCESS_LOG="false"
        )
        with curator, modeler:
            curator.wait_healthy()
            modeler.wait_healthy()
            return _run_load(
                curator,
                modeler,
                admin_token,
                modeler_token,
                database,
                workers,
                studies,
                iterations,
                n,
                d,
                r,
                seed,
                tmp,
            )


def _run_load(
    curator: ServiceProcess,
    modeler: ServiceProcess,
    admin_token: str,
    modeler_token: str,
    database: Database,
    workers: int,
    studies: int,
    iterations: int,
    n: int,
    d: int,
    r: int,
    seed: int,
    tmp: Path,
) -> dict[str, Any]:
    csv = tmp / "load.csv"
    _write_csv(csv, n, d, seed)
    with CuratorClient(curator.url, admin_token) as admin:
        dataset = admin.upload_dataset(csv, name="load", objective="objective")
        # the default Gaussian release (projected to r dimensions when r < d)
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-6, r=r if r < d else None)
        partner = admin.create_partner("load", release_ids=[release.id], max_queries=studies * iterations + 1)
    with CuratorClient(curator.url, partner.token) as as_partner:
        lengthscale = median_distance(as_partner.release_rows(release.id))
    body = {
        "curator_url": curator.url,
        "release_id": release.id,
        "curator_token": partner.token,
        "iterations": iterations,
        "hyperparameters": {"lengthscale": lengthscale, "signal_variance": 1.0, "noise_variance": 1e-4},
        "initial_points": 1,
    }
    runs: list[StudyRun] = []
    with httpx.Client(
        base_url=modeler.url, headers={"Authorization": f"Bearer {modeler_token}"}, timeout=120
    ) as http:
        for k in range(studies):
            resp = http.post("/v1/studies", json={**body, "seed": seed + k})
            resp.raise_for_status()
            runs.append(StudyRun(resp.json()["id"]))
    start = threading.Barrier(studies)
    psutil.cpu_percent()  # starts the machine-wide CPU measurement
    with ResourceSampler({"curator": curator, "modeler": modeler}) as resources:
        with ThreadPoolExecutor(studies) as pool:
            spans = list(
                pool.map(lambda run: _step_study(modeler.url, modeler_token, run, iterations, start), runs)
            )
    machine_cpu = psutil.cpu_percent()
    wall = max(end for _, end in spans) - min(begin for begin, _ in spans)
    checks = _check(curator, modeler, admin_token, modeler_token, release.id, partner.id, runs, iterations)
    latencies = [v for run in runs for v in run.latencies_ms]
    completed = sum(len(run.server_ms["gp"]) for run in runs)
    errors = [e for run in runs for e in run.errors]
    return {
        "database": database,
        "workers": workers,
        "studies": studies,
        "iterations": iterations,
        "n": n,
        "d": d,
        "r": r,
        "iterations_completed": completed,
        "wall_s": wall,
        "throughput_per_s": completed / wall if wall > 0 else float("nan"),
        "latency_ms": {
            "p50": _pct(latencies, 50),
            "p99": _pct(latencies, 99),
            "mean": float(np.mean(latencies)) if latencies else float("nan"),
            "max": max(latencies, default=float("nan")),
        },
        "server_p50_ms": {
            key: _pct([v for run in runs for v in run.server_ms[key]], 50) for key in ("gp", "curator", "db")
        },
        "errors": len(errors),
        "error_samples": errors[:5],
        "peak_rss_mib": {name: peak / 2**20 for name, peak in resources.peak.items()},
        "processes": resources.processes,
        "cpu_ms_per_iteration": {
            name: 1e3 * cpu / completed if completed else float("nan")
            for name, cpu in resources.cpu_seconds.items()
        },
        "machine_cpu_percent": machine_cpu,
        "checks": checks,
    }


def _check(
    curator: ServiceProcess,
    modeler: ServiceProcess,
    admin_token: str,
    modeler_token: str,
    release_id: int,
    partner_id: int,
    runs: list[StudyRun],
    iterations: int,
) -> dict[str, Any]:
    """Every study complete and reconciled; the curator charged one query per recorded iteration."""
    complete = reconciled = recorded = 0
    with httpx.Client(
        base_url=modeler.url, headers={"Authorization": f"Bearer {modeler_token}"}, timeout=60
    ) as http:
        for run in runs:
            done = int(http.get(f"/v1/studies/{run.study_id}").json()["iterations_done"])
            recorded += done
            complete += done == iterations
            report = reconcile(
                curator_url=curator.url,
                curator_token=admin_token,
                modeler_url=modeler.url,
                modeler_token=modeler_token,
                study_id=run.study_id,
            )
            reconciled += report.ok
    with CuratorClient(curator.url, admin_token) as admin:
        charged = admin.get_partner(partner_id).queries_used
        queries = len(admin.list_queries(release_id).queries)
    return {
        "studies_complete": complete,
        "studies_reconciled": reconciled,
        "iterations_recorded": recorded,
        "queries_charged": charged,
        "queries_at_curator": queries,
        "ok": complete == len(runs) == reconciled and charged == queries == recorded,
    }


@dataclass(frozen=True)
class LoadConfig:
    """What ``pobo bench load`` runs: every database x (baseline workers, workers)."""

    databases: list[Database]
    postgres_url: str | None = None
    workers: int = 2
    baseline_workers: int | None = 1
    studies: int = 20
    iterations: int = 50
    n: int = 10_000
    seed: int = 0


def run_benchmark(config: LoadConfig, on_result: Any = None) -> dict[str, Any]:
    """Every (database, worker count) configuration, baseline first; ratios against the baseline."""
    load_before = list(os.getloadavg())
    baseline = config.baseline_workers
    counts = [w for w in dict.fromkeys([baseline, config.workers]) if w is not None]
    results: list[dict[str, Any]] = []
    for database in config.databases:
        for w in counts:
            result = measure(
                database=database,
                postgres_url=config.postgres_url,
                workers=w,
                studies=config.studies,
                iterations=config.iterations,
                n=config.n,
                seed=config.seed,
            )
            results.append(result)
            if on_result is not None:
                on_result(result)
    for result in results:
        base = next(
            (b for b in results if b["database"] == result["database"] and b["workers"] == baseline), None
        )
        if base is not None and base is not result:
            result["vs_baseline"] = {
                "baseline_workers": baseline,
                "throughput_ratio": result["throughput_per_s"] / base["throughput_per_s"],
                "p50_ratio": result["latency_ms"]["p50"] / base["latency_ms"]["p50"],
                "p99_ratio": result["latency_ms"]["p99"] / base["latency_ms"]["p99"],
            }
    setup = {k: v for k, v in asdict(config).items() if k != "postgres_url"}  # a URL may hold a password
    return {
        "setup": {**setup, "cpu_count": os.cpu_count(), "load_average_before": load_before},
        "results": results,
        "ok": all(r["errors"] == 0 and r["checks"]["ok"] for r in results),
    }


def main(config: LoadConfig, json_path: Path | None = None) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 120))  # the table has eleven columns: wider than 80
    if "postgresql" in config.databases and not config.postgres_url:
        console.print("[yellow]no PostgreSQL URL (--postgres-url or POBO_BENCH_POSTGRES_URL): SQLite only[/]")
        config = replace(config, databases=[db for db in config.databases if db != "postgresql"])

    def progress(result: dict[str, Any]) -> None:
        console.print(
            f"  {result['database']}, {result['workers']} worker(s): "
            f"{result['throughput_per_s']:.1f} it/s, errors {result['errors']}"
        )

    studies, iterations, n = config.studies, config.iterations, config.n
    with console.status(
        f"{studies} concurrent studies x {iterations} iterations on {', '.join(config.databases)} ..."
    ):
        report = run_benchmark(config, on_result=progress)
    table = Table(title=f"{studies} concurrent studies x {iterations} iterations, n = {n}")
    headers = (
        "db",
        "workers",
        "it/s",
        "vs 1",
        "p50 ms",
        "p99 ms",
        "errors",
        "RSS MiB c/m",
        "CPU ms/it c/m",
        "CPU %",
        "audit",
    )
    for column in headers:
        table.add_column(column, justify="left" if column in ("db", "audit") else "right")
    for res in report["results"]:
        ratio = res.get("vs_baseline", {}).get("throughput_ratio")
        rss, cpu, c = res["peak_rss_mib"], res["cpu_ms_per_iteration"], res["checks"]
        table.add_row(
            "PostgreSQL" if res["database"] == "postgresql" else "SQLite",
            str(res["workers"]),
            f"{res['throughput_per_s']:.1f}",
            "-" if ratio is None else f"{ratio:.2f}x",
            f"{res['latency_ms']['p50']:.0f}",
            f"{res['latency_ms']['p99']:.0f}",
            str(res["errors"]),
            f"{rss['curator']:.0f}/{rss['modeler']:.0f}",
            f"{cpu['curator']:.1f}/{cpu['modeler']:.1f}",
            f"{res['machine_cpu_percent']:.0f}",
            "[green]ok[/]" if c["ok"] else "[red]FAILED[/]",
        )
    legend = (
        "c/m: curator/modeler. RSS: peak of the sum over a service's processes (supervisor + workers). "
        "CPU ms/it: the service's CPU time per iteration; CPU %: the whole machine's use during the load (a "
        "figure near 100 means the machine, not the services, sets the pace). audit: every study complete "
        f"and reconciled, one charge per iteration. {os.cpu_count()} CPU(s), load average before "
        f"{report['setup']['load_average_before'][0]:.1f}."
    )
    errors = [
        f"[red]error[/] ({res['database']}, {res['workers']} workers): {sample}"
        for res in report["results"]
        for sample in res["error_samples"]
    ]
    return publish(
        console, report, show=[table, legend, *errors], json_path=json_path, indent=2, announce=True
    )
