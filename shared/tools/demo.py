"""``pobo demo``: the whole two-party loop on this machine, with both services as real processes.

1. Start the curator and the modeler (``python -m shared.tools.cli <service> serve``) on free loopback ports,
   each with a temporary data dir and SQLite database; wait for ``/healthz``.
2. Curator (admin): upload the bundled synthetic hospital CSV (``shared/tools/data/demo_hospital.csv``; the
   outcome column stays with the curator) with declared per-feature scales, read the privacy report (what
   the release protects, in clinical units), create the default Gaussian release (epsilon = 1,
   delta = 1e-5), grant a partner (the modeler) access with a query quota.
3. Modeler: create a GP-UCB study over the release, run it in the background, follow its progress.
4. Report: best patient found vs the true best (the demo generated the CSV, so it knows every outcome),
   simple regret, the regret random choice would have had, privacy spent, audit chain verified and
   reconciled with the curator's query log. Write ``plot.png`` and ``audit.csv``; stop both services.

The services run as ``shared.processes.ServiceProcess`` children (shared with the benchmarks and the
end-to-end tests).
"""

from __future__ import annotations

import csv
import math
import os
import secrets
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

from shared.processes import service_pair, stop_all
from shared.protocol.client import CuratorClient

__all__ = ["DEMO_CSV", "expected_random_regret", "progress_figure", "run_demo", "write_progress_plot"]

DEMO_CSV = Path(__file__).with_name("data") / "demo_hospital.csv"
#: Release parameters of the demo: the default Gaussian release at (epsilon, delta), all d = 7 features (no
#: projection). delta = 1e-5 is well below 1/n = 2.5e-4. In the declared units (e.g. 0.4 years of age) the
#: features spread over ~40 units, the noise (std 3.73) over ~4.
DEMO_EPSILON, DEMO_DELTA = 1.0, 1e-5


def progress_figure(ys: list[float], *, ylabel: str, true_best: float | None = None) -> Any:
    """Best outcome so far vs iteration (a matplotlib Figure), the y axis named after the objective column,
    with the true best as a dashed reference line when it is known (the demo made its data; a real modeler
    never knows it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    t = np.arange(1, len(ys) + 1)
    ax.step(t, np.maximum.accumulate(ys), where="post", lw=2, label="best found so far")
    ax.plot(t, ys, "o", ms=3, alpha=0.5, label="outcome of each query")
    if true_best is not None:
        ax.axhline(true_best, ls="--", color="grey", label=f"true best ({true_best:g})")
    ax.set_xlabel("iteration (curator query)")
    ax.set_ylabel(ylabel)
    ax.set_title(f"GP-UCB on the released rows: best {ylabel} so far")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def write_progress_plot(ys: list[float], path: Path, *, ylabel: str, true_best: float | None = None) -> None:
    """``progress_figure`` as a PNG, written atomically."""
    import matplotlib.pyplot as plt

    fig = progress_figure(ys, ylabel=ylabel, true_best=true_best)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    os.replace(tmp, path)


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
    from shared.tools.data.make_demo_dataset import OUTCOME

    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return [r["patient"] for r in rows], np.array([float(r[OUTCOME]) for r in rows])


def run_demo(
    output: Path = Path("pobo-demo-output"),
    iterations: int = 50,
    *,
    keep_running: bool = False,
    wait_forever: Callable[[dict[str, str]], None] | None = None,
) -> dict[str, Any]:
    """Run the demo end to end (see the module docstring); returns the numbers it printed.

    ``keep_running``: after the study, keep both services (and their consoles) up until Ctrl-C
    (``wait_forever({"curator": url, "modeler": url})``, by default a sleep loop ended by KeyboardInterrupt).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from shared.tools.data.make_demo_dataset import DP_UNITS, FEATURES, OUTCOME

    console = Console()
    started = time.monotonic()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    patients, outcome = _read_demo_csv(DEMO_CSV)
    admin_token, modeler_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="pobo-demo-") as tmp_name:
        tmp = Path(tmp_name)
        curator, modeler = service_pair(tmp, admin_token, modeler_token)
        try:
            with console.status("starting the curator and the modeler ..."):
                curator.start()
                modeler.start()
                curator.wait_healthy()
                modeler.wait_healthy()
            console.print(
                f"[bold]curator[/] {curator.url}   [bold]modeler[/] {modeler.url}   (data in {tmp})"
            )
            _print_consoles(console, curator.url, modeler.url, admin_token, modeler_token)
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
            if keep_running:
                _print_consoles(console, curator.url, modeler.url, admin_token, modeler_token)
                console.print("[bold]both services keep running[/]: press Ctrl-C to stop them")
                try:
                    (wait_forever or _sleep_forever)({"curator": curator.url, "modeler": modeler.url})
                except KeyboardInterrupt:
                    console.print("stopping ...")
        except Exception:
            console.print("[red]the demo failed[/]; curator log:\n" + curator.log_tail())
            console.print("modeler log:\n" + modeler.log_tail())
            raise
        finally:
            with console.status("stopping both services ..."):
                clean = stop_all(curator, modeler)
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


def _print_consoles(console: Any, curator_url: str, modeler_url: str, admin: str, modeler: str) -> None:
    """The two browser consoles and the tokens that sign in to them (this demo's throwaway tokens)."""
    console.print(  # one fact a line, never wrapped: a token must survive a copy from a narrow terminal
        f"[bold]curator console[/] (privacy officer): {curator_url}/console\n"
        f"  sign in with the admin token: [cyan]{admin}[/]\n"
        f"[bold]modeler console[/] (studies): {modeler_url}/console\n"
        f"  sign in with the token: [cyan]{modeler}[/]",
        soft_wrap=True,
    )


def _sleep_forever(_: dict[str, str]) -> None:
    """Until Ctrl-C or SIGTERM (both end the wait the same way, so the services are stopped cleanly; a shell
    starts a background job with SIGINT ignored, so ``kill`` is how such a demo is stopped)."""

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            time.sleep(3600)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
            write_progress_plot(
                [float(e["y"]) for e in entries],
                output / "plot.png",
                ylabel=outcome_name,
                true_best=float(np.max(outcome)),  # known here only because the demo made the data
            )
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
        "outcomes_seen": [float(e["y"]) for e in entries],
        "random_regret": expected_random_regret(outcome, iterations),
        "epsilon_spent": spent.epsilon_spent,
        "epsilon_budget": spent.epsilon_budget,
        "delta_spent": spent.delta_spent,
        "delta_budget": spent.delta_budget,
        "audit_ok": bool(verify["ok"]),
        "reconciled": reconciled,
    }
