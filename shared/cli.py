"""The ``pobo`` command: serves both parties, runs the demo and the benchmarks.

This is the one module of ``shared`` that composes the services (it imports them lazily, inside the
commands, so that ``import shared`` never pulls in FastAPI or SQLAlchemy).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="pobo: privacy-preserving outsourced Bayesian optimization (PO-GP-UCB).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
curator_app = typer.Typer(help="The curator service (holds the sensitive rows).", no_args_is_help=True)
modeler_app = typer.Typer(help="The modeler service (runs the optimization).", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (utility and speed); not tests.", no_args_is_help=True)
audit_app = typer.Typer(help="Audits of pobo's own guarantees.", no_args_is_help=True)
docs_app = typer.Typer(help="The project's generated documentation.", no_args_is_help=True)
app.add_typer(curator_app, name="curator")
app.add_typer(audit_app, name="audit")
app.add_typer(docs_app, name="docs")
app.add_typer(modeler_app, name="modeler")
app.add_typer(bench_app, name="bench")
agent_app = typer.Typer(
    help="A federation agent (DP-FTS-DE), run next to a hospital's data.", no_args_is_help=True
)
app.add_typer(agent_app, name="agent")


@curator_app.command("serve")
def curator_serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default: setting or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: setting or 8001).")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="Worker processes (default: setting POBO_CURATOR_WORKERS or 1)."),
    ] = None,
) -> None:
    """Start the curator service (applies its database migrations first)."""
    from curator_service.main import serve

    serve(host=host, port=port, workers=workers)


@modeler_app.command("serve")
def modeler_serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default: setting or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: setting or 8002).")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="Worker processes (default: setting POBO_MODELER_WORKERS or 1)."),
    ] = None,
) -> None:
    """Start the modeler service (applies its database migrations first)."""
    from modeler_service.main import serve

    serve(host=host, port=port, workers=workers)


@bench_app.command("synthetic")
def bench_synthetic(
    runs: Annotated[int, typer.Option(min=1, help="Random runs per setting (paper: 50).")] = 50,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the Fig. 2a-style plot (PNG) here.")] = None,
    quick: Annotated[bool, typer.Option(help="A few runs of a few settings: a smoke test.")] = False,
    seed: Annotated[
        int, typer.Option(help="Benchmark seed (benchmarks only; never used in production).")
    ] = 0,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
    strategies: Annotated[
        str | None,
        typer.Option(
            help="Compare registry strategies instead (comma-separated, e.g. gp-ucb,gp-bucb,random): simple "
            "regret by query and by round."
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, max=1000, help="gp-bucb's batch size k (with --strategies).")
    ] = 5,
    queries: Annotated[
        int, typer.Option(min=1, help="Queries per study, initial row included (with --strategies).")
    ] = 50,
) -> None:
    """The paper's synthetic GP experiment (Fig. 2a, Tables 1-3) in `transfer` and `mle` modes; with
    --strategies, the modeler's registry strategies compared on the same functions."""
    from shared.bench.synthetic import main as run

    names = None
    if strategies is not None:
        from shared.bo.strategies import REGISTRY

        names = [s.strip() for s in strategies.split(",") if s.strip()]
        unknown = [s for s in names if s not in REGISTRY]
        if unknown or not names:
            raise typer.BadParameter(
                f"unknown strategy {unknown}: the registry has {', '.join(sorted(REGISTRY))}",
                param_hint="--strategies",
            )
    run(
        runs=runs,
        json_path=json_path,
        plot_path=plot,
        quick=quick,
        seed=seed,
        workers=workers,
        strategies=names,
        batch_size=batch_size,
        queries=queries,
    )


@bench_app.command("ldp")
def bench_ldp(
    runs: Annotated[int, typer.Option(min=1, help="Random runs (functions) per setting (paper: 10).")] = 10,
    T: Annotated[int, typer.Option("--T", min=2, help="Queries per study (paper: 1000).")] = 1000,
    combined_T: Annotated[
        int, typer.Option("--combined-T", min=2, help="Queries per study in the combined setting.")
    ] = 200,
    settings: Annotated[
        str, typer.Option(help="Comma-separated settings: se, matern, student-t, combined.")
    ] = "se,matern,student-t,combined",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the cumulative-regret plot (PNG) here.")] = None,
    seed: Annotated[
        int, typer.Option(help="Benchmark seed (benchmarks only; never used in production).")
    ] = 0,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
    beta_multiplier: Annotated[
        float, typer.Option(min=0.0, help="The six strategies' factor on the theorems' beta (1 = as stated).")
    ] = 1.0,
) -> None:
    """The LDP-BO paper's synthetic experiments (Zhou & Tan 2021, Fig. 2a/2d, Fig. 3a): cumulative regret of
    the LDP and heavy-tailed GP-UCB strategies under CTL(eps) or Student-t noise, and output privacy on top of
    the Gaussian release (combined)."""
    from shared.bench.ldp import SETTINGS
    from shared.bench.ldp import main as run

    chosen = [s.strip() for s in settings.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SETTINGS]
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown setting {unknown}: choose from {', '.join(SETTINGS)}")
    run(
        runs=runs,
        T=T,
        combined_T=combined_T,
        settings=list(dict.fromkeys(chosen)),
        seed=seed,
        workers=workers,
        json_path=json_path,
        plot_path=plot,
        beta_multiplier=beta_multiplier,
    )


def _pick(text: str, known: Sequence[str], what: str) -> list[str]:
    """A comma-separated choice among ``known`` (in the order given, repeats dropped); else a usage error."""
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown {what} {unknown}: choose from {', '.join(known)}")
    return list(dict.fromkeys(chosen))


@bench_app.command("gibo")
def bench_gibo(
    runs: Annotated[int, typer.Option(min=1, help="Independent runs (data draws) per example.")] = 4,
    examples: Annotated[
        str,
        typer.Option(help="Comma-separated examples: normal-location, huber-regression, gp-lengthscales."),
    ] = "normal-location,huber-regression,gp-lengthscales",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the error-path plot (PNG) here.")] = None,
    seed: Annotated[
        int, typer.Option(help="Benchmark seed (benchmarks only; never used in production).")
    ] = 0,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
) -> None:
    """The DP-GIBO paper's Section 4 examples (Scalable DP Bayesian optimisation, Algorithm 1, Fig. 1-2, 4):
    normal location (4.1), Huber regression vs noisy GD (4.2), GP length-scale tuning vs random search and
    GP-UCB (4.3)."""
    from shared.bench.gibo import EXAMPLES
    from shared.bench.gibo import main as run

    run(
        runs=runs,
        examples=_pick(examples, EXAMPLES, "example"),
        seed=seed,
        workers=workers,
        json_path=json_path,
        plot_path=plot,
    )


@bench_app.command("fed")
def bench_fed(
    runs: Annotated[int, typer.Option(min=1, help="Independent runs per curve.")] = 10,
    settings: Annotated[
        str, typer.Option(help="Comma-separated settings: synthetic, svm-shards.")
    ] = "synthetic,svm-shards",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the regret-curve plot (PNG) here.")] = None,
    seed: Annotated[
        int, typer.Option(help="Benchmark seed (benchmarks only; never used in production).")
    ] = 0,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
) -> None:
    """DP-FTS-DE's Section 5 (federated DP Thompson sampling, Algorithms 1-2, Fig. 2-3): TS vs FTS vs FTS-DE
    and the impact of S, q and z with epsilon (PLD / RDP) beside each DP curve, on a synthetic GP federation
    and on SVM tuning over dataset shards."""
    from shared.bench.fed import SETTINGS
    from shared.bench.fed import main as run

    run(
        runs=runs,
        settings=_pick(settings, SETTINGS, "setting"),
        seed=seed,
        workers=workers,
        json_path=json_path,
        plot_path=plot,
    )


@bench_app.command("perf")
def bench_perf(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    n_release: Annotated[int, typer.Option(help="Rows of the release benchmark.")] = 1_000_000,
    n_gp: Annotated[int, typer.Option(help="Candidates of the GP-UCB loop benchmark.")] = 100_000,
    seed: Annotated[int, typer.Option(help="Benchmark seed.")] = 0,
) -> None:
    """Streaming release vs direct SVD, incremental GP-UCB vs refitting scikit-learn's GPR."""
    from shared.bench.perf import main as run

    run(json_path=json_path, n_release=n_release, n_gp=n_gp, seed=seed)


@bench_app.command("service")
def bench_service(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    n: Annotated[int, typer.Option(min=10, help="Rows of the synthetic release.")] = 10_000,
    iterations: Annotated[int, typer.Option(min=2, help="Iterations per study (t <= this).")] = 50,
    studies: Annotated[int, typer.Option(min=1, help="Studies (each a fresh t = 1..iterations).")] = 3,
) -> None:
    """One HTTP iteration (suggest + curator query + observe) on loopback, beyond the GP arithmetic."""
    from shared.bench.service import main as run

    run(json_path=json_path, n=n, iterations=iterations, studies=studies)


@bench_app.command("load")
def bench_load(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    studies: Annotated[int, typer.Option(min=1, help="Concurrent studies (one client thread each).")] = 20,
    iterations: Annotated[int, typer.Option(min=1, help="Iterations per study.")] = 50,
    workers: Annotated[
        int, typer.Option(min=1, max=64, help="uvicorn workers of each service (try the number of cores).")
    ] = 2,
    baseline_workers: Annotated[
        int, typer.Option(min=0, help="Also measure this worker count as the baseline (0: none).")
    ] = 1,
    database: Annotated[
        list[str] | None,
        typer.Option(help="sqlite and/or postgresql (repeat the option). Default: both."),
    ] = None,
    postgres_url: Annotated[
        str | None,
        typer.Option(
            help="SQLAlchemy URL of a PostgreSQL database to create throwaway schemas in. "
            "Default: env POBO_BENCH_POSTGRES_URL, else POBO_TEST_DATABASE_URL."
        ),
    ] = None,
    n: Annotated[int, typer.Option(min=10, help="Rows of the synthetic release.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Benchmark seed (synthetic data, initial rows).")] = 0,
) -> None:
    """Concurrent studies x iterations against both services under uvicorn workers: throughput,
    p50/p99 latency, errors, peak RSS; every study reconciled afterwards. Exit 1 on any error."""
    from shared.bench.load import LoadBenchError, LoadConfig, default_postgres_url
    from shared.bench.load import main as run

    chosen = database or ["sqlite", "postgresql"]
    unknown = sorted(set(chosen) - {"sqlite", "postgresql"})
    if unknown:
        raise typer.BadParameter(
            f"unknown database {unknown}: use sqlite and/or postgresql", param_hint="--database"
        )
    url = postgres_url or default_postgres_url()
    if database and "postgresql" in database and not url:
        raise typer.BadParameter(
            "PostgreSQL needs a database to create throwaway schemas in: pass --postgres-url "
            "postgresql+psycopg://user@host:5432/db (or set POBO_BENCH_POSTGRES_URL)",
            param_hint="--postgres-url",
        )
    config = LoadConfig(
        databases=chosen,  # type: ignore[arg-type]
        postgres_url=url,
        workers=workers,
        baseline_workers=baseline_workers or None,
        studies=studies,
        iterations=iterations,
        n=n,
        seed=seed,
    )
    try:
        report = run(config, json_path=json_path)
    except LoadBenchError as exc:
        typer.echo(f"pobo bench load: {exc}", err=True)
        raise typer.Exit(2) from None
    if not report["ok"]:
        raise typer.Exit(1)


@audit_app.command("privacy")
def audit_privacy(
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write one JSON row per mechanism here.")
    ] = None,
    trials: Annotated[
        int, typer.Option(min=100, help="Runs per dataset (D and D') after calibration.")
    ] = 50_000,
    calibration_trials: Annotated[
        int | None,
        typer.Option(min=100, help="Runs per dataset to choose the threshold (default trials / 5)."),
    ] = None,
    mechanism: Annotated[
        list[str] | None, typer.Option(help="Audit only this mechanism (repeat the option). Default: all.")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the audit's runs (an audit is a test, not a release).")
    ] = 0,
) -> None:
    """Empirical privacy audit: run each mechanism many times on two neighbouring datasets, distinguish
    them, and turn the error rates (Clopper-Pearson, 95 %) into a lower bound on epsilon.

    Exit status 1 when a mechanism that claims a formal guarantee exceeds its claimed epsilon.
    """
    import json
    import os

    from rich.console import Console
    from rich.table import Table

    from shared.bo.gibo.audit import GIBO_AUDITS
    from shared.privacy.audit import AUDITS, run_all

    console = Console()
    try:
        with console.status("auditing ...") as status:
            results = run_all(
                mechanism,
                trials=trials,
                calibration_trials=calibration_trials,
                seed=seed,
                progress=lambda name: status.update(f"auditing {name} ({trials} runs on each dataset) ..."),
                registry=AUDITS | GIBO_AUDITS,
            )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--mechanism") from None
    table = Table(title="pobo audit privacy (lower bounds on epsilon, 95 %)")
    for column in ("mechanism", "guarantee", "claimed", "delta", "trials", "FP/FN", "eps >=", "verdict"):
        table.add_column(column)
    failed = False
    for res in results:
        if res.within_claim:
            verdict = "[green]within claim[/]"
        elif res.perfect_distinguisher:
            verdict = "[red]unbounded[/]"
        else:
            verdict = "[red]EXCEEDS CLAIM[/]"
        failed |= res.formal_guarantee and not res.within_claim
        table.add_row(
            res.mechanism,
            "formal" if res.formal_guarantee else "none",
            f"{res.claimed_epsilon:g}",
            f"{res.delta:g}",
            str(res.trials),
            f"{res.false_positives}/{res.false_negatives}",
            f"{res.empirical_epsilon_lower_bound:.3f}",
            verdict,
        )
    console.print(table)
    if any(r.perfect_distinguisher for r in results):
        console.print(
            "unbounded: no error in either direction, so the bound is limited only by the number of trials "
            "(it grows as ln(trials)); the mechanism tells the two datasets apart with certainty."
        )
    if json_path:
        tmp = json_path.with_name(json_path.name + ".tmp")
        tmp.write_text(json.dumps([r.row() for r in results], indent=1))
        os.replace(tmp, json_path)
    if failed:
        raise typer.Exit(1)


@docs_app.command("api")
def docs_api(
    check: Annotated[
        bool, typer.Option(help="Exit 1 (with a diff) when docs/api.md is out of date.")
    ] = False,
    stdout: Annotated[bool, typer.Option(help="Print the document instead of writing docs/api.md.")] = False,
) -> None:
    """Generate docs/api.md, the HTTP reference of both services, from their OpenAPI documents."""
    from shared.apidocs import main as generate

    generate(["--check"] if check else [] if stdout else ["--write"])


@app.command("reconcile")
def reconcile_cmd(
    curator: Annotated[str, typer.Option("--curator", help="Curator base URL, e.g. https://curator:8001")],
    modeler: Annotated[str, typer.Option("--modeler", help="Modeler base URL, e.g. https://modeler:8002")],
    study: Annotated[str, typer.Option("--study", help="Study id (on the modeler).")],
    curator_token: Annotated[
        str,
        typer.Option(
            envvar="POBO_CURATOR_TOKEN",
            help="Curator token: the admin token, or the study's partner token. Env POBO_CURATOR_TOKEN.",
        ),
    ],
    modeler_token: Annotated[
        str, typer.Option(envvar="POBO_MODELER_TOKEN", help="Modeler API token. Env POBO_MODELER_TOKEN.")
    ],
    ca_bundle: Annotated[
        Path | None, typer.Option(help="PEM bundle to verify HTTPS certificates (default: system store).")
    ] = None,
) -> None:
    """Compare a study's audit log (modeler) with the curator's query log; print every mismatch.

    Exit status 0 when both hash chains verify and every query matches (id, row index, y), 1 otherwise,
    2 when either service could not be asked (unreachable, wrong token, unknown study).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from shared.errors import PoboError
    from shared.reconcile import reconcile

    console = Console()
    try:
        report = reconcile(
            curator_url=curator,
            curator_token=curator_token,
            modeler_url=modeler,
            modeler_token=modeler_token,
            study_id=study,
            verify=ca_bundle if ca_bundle is not None else True,
        )
    except PoboError as exc:  # CuratorError, ModelerError: the message names the side and its answer
        console.print(f"[red]cannot reconcile[/]: {escape(str(exc))}")
        raise typer.Exit(2) from None
    chains = (
        f"modeler audit chain {'ok' if report.modeler_chain_ok else 'BROKEN'}, "
        f"curator query chain {'ok' if report.curator_chain_ok else 'BROKEN'}"
    )
    if report.ok:
        console.print(
            f"[green]OK[/]: study {report.study_id} ({report.source}): "
            f"{report.modeler_entries} audit entries = {report.curator_entries} curator queries; {chains}"
        )
        return
    table = Table(title=f"study {report.study_id} ({report.source}): {len(report.mismatches)} mismatch(es)")
    for column in ("query id", "round", "mismatch", "curator", "modeler"):
        table.add_column(column)
    for m in report.mismatches:
        table.add_row(
            "-" if m.query_id is None else str(m.query_id),
            m.at or "-",
            m.kind,
            m.curator,
            m.modeler,
        )
    console.print(table)
    console.print(
        f"[red]MISMATCH[/]: {report.modeler_entries} audit entries, "
        f"{report.curator_entries} curator queries; {chains}"
    )
    raise typer.Exit(1)


@app.command("demo")
def demo(
    output: Annotated[Path, typer.Option(help="Where the plot and the audit CSV go.")] = Path(
        "pobo-demo-output"
    ),
    iterations: Annotated[int, typer.Option(min=1, help="GP-UCB iterations.")] = 50,
) -> None:
    """Run the whole two-party loop locally: both services, a release, a partner, a study."""
    from shared.demo import run_demo

    run_demo(output=output, iterations=iterations)


@agent_app.command("run")
def agent_run(
    modeler: Annotated[
        str, typer.Option(help="The modeler's base URL, e.g. https://modeler.example.org:8002.")
    ],
    federation: Annotated[str, typer.Option(help="The federation id.")],
    token: Annotated[
        str, typer.Option(envvar="POBO_AGENT_TOKEN", help="This agent's token (or env POBO_AGENT_TOKEN).")
    ],
    objective: Annotated[str, typer.Option(help="A built-in demo objective: sphere or branin.")] = "sphere",
    perturbation: Annotated[
        float, typer.Option(min=0.0, help="Std of this agent's random shift of its optimum (unit cube).")
    ] = 0.05,
    seed: Annotated[int | None, typer.Option(help="Seed of the perturbation (default: random).")] = None,
    wait: Annotated[float, typer.Option(min=1.0, help="Seconds per long-poll while a round is open.")] = 30.0,
    retry_seconds: Annotated[
        float, typer.Option(min=1.0, help="How long to retry an unreachable modeler before giving up.")
    ] = 120.0,
    ca_bundle: Annotated[
        Path | None, typer.Option(help="PEM bundle of the CA that signed the modeler's certificate.")
    ] = None,
) -> None:
    """Take part in a federation until it is done: evaluate the demo objective locally each round and
    submit only a posterior sample (omega) to the modeler; local observations never leave this process."""
    from rich.console import Console

    from shared.errors import InputDataError
    from shared.federated.agent import Agent, AgentError
    from shared.federated.objectives import make_objective

    console = Console()

    def on_round(t: int, info: dict[str, object]) -> None:
        console.print(
            f"round {t}: closed, epsilon {info['epsilon_pld']:.4g} (PLD) / {info['epsilon_rdp']:.4g} (RDP); "
            f"query from {info['source']}, y = {info['y']:.4g}"
        )

    try:
        with Agent(
            modeler,
            federation,
            token,
            objective=lambda x: 0.0,  # replaced below, once the box is known
            wait_seconds=wait,
            retry_seconds=retry_seconds,
            verify=str(ca_bundle) if ca_bundle is not None else True,
            on_round=on_round,
        ) as agent:
            params = agent.federation()["params"]
            bounds = params["bounds"]
            lower, upper = [b[0] for b in bounds], [b[1] for b in bounds]
            agent.objective = make_objective(objective, lower, upper, perturbation=perturbation, seed=seed)
            report = agent.run()
    except (AgentError, InputDataError) as exc:
        console.print(f"[red]error[/]: {exc}")
        raise typer.Exit(1) from None
    console.print(
        f"federation {report.federation_id} done ({report.stop_reason}): submitted in rounds "
        f"{report.submitted}, refused in {report.refused}; best y {report.best_y}; "
        f"epsilon {report.epsilon_pld:.4g} (PLD) / {report.epsilon_rdp:.4g} (RDP)"
    )


if __name__ == "__main__":  # pragma: no cover
    app()
