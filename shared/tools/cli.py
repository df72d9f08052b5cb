"""The ``pobo`` command: serves both parties, runs the demo and the benchmarks.

This is the one module of ``shared`` that composes the services (it imports them lazily, inside the
commands, so that ``import shared`` never pulls in FastAPI or SQLAlchemy).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from shared.files import write_json_atomic
from shared.tools.bench.cli import bench_app
from shared.tools.migrate import add_migrate_command
from shared.tools.opscli import add_operations_commands
from shared.tools.sdkcli import add_curator_commands, study_app

app = typer.Typer(
    help="pobo: privacy-preserving outsourced Bayesian optimization (PO-GP-UCB).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
curator_app = typer.Typer(help="The curator service (holds the sensitive rows).", no_args_is_help=True)
modeler_app = typer.Typer(help="The modeler service (runs the optimization).", no_args_is_help=True)
audit_app = typer.Typer(help="Audits of pobo's own guarantees.", no_args_is_help=True)
docs_app = typer.Typer(help="The project's generated documentation.", no_args_is_help=True)
app.add_typer(curator_app, name="curator")
app.add_typer(audit_app, name="audit")
app.add_typer(docs_app, name="docs")
app.add_typer(modeler_app, name="modeler")
app.add_typer(bench_app, name="bench")  # shared/tools/bench/cli.py
agent_app = typer.Typer(
    help="A federation agent (DP-FTS-DE), run next to a hospital's data.", no_args_is_help=True
)
app.add_typer(agent_app, name="agent")
# the admin's and the modeler's everyday commands, on the SDK (shared/tools/sdkcli.py)
add_curator_commands(curator_app)
app.add_typer(study_app, name="study")


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

    _serve_then_exit(lambda: serve(host=host, port=port, workers=workers))


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

    _serve_then_exit(lambda: serve(host=host, port=port, workers=workers))


def _serve_then_exit(serve: Callable[[], None]) -> NoReturn:
    """Run a service until it has shut down, then end the process without the interpreter's teardown
    (``shared.servicekit.serving.exit_after_shutdown``), with the status a normal exit would have had."""
    from shared.servicekit.serving import exit_after_shutdown

    try:
        serve()
    except SystemExit as stop:  # SIGTERM after the graceful shutdown (0), or uvicorn's start-up failure (3)
        if stop.code is None or isinstance(stop.code, int):
            exit_after_shutdown(stop.code or 0)
        print(stop.code, file=sys.stderr)
        exit_after_shutdown(1)
    exit_after_shutdown(0)


# backup, restore and archive-access-log (shared/tools/opscli.py)
add_operations_commands(curator_app, "curator")
add_operations_commands(modeler_app, "modeler")

# `pobo curator migrate` / `pobo modeler migrate [--to REVISION]` (shared/tools/migrate.py)
add_migrate_command(curator_app, "curator")
add_migrate_command(modeler_app, "modeler")


@audit_app.command("privacy")
def audit_privacy(
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write one JSON row per mechanism, control and test here.")
    ] = None,
    trials: Annotated[
        int | None,
        typer.Option(min=100, help="Runs per dataset (D and D') after calibration. Default: per mechanism."),
    ] = None,
    calibration_trials: Annotated[
        int | None,
        typer.Option(min=100, help="Runs per dataset to choose the threshold (default trials / 5)."),
    ] = None,
    control_trials: Annotated[
        int | None,
        typer.Option(
            min=100,
            help="Runs per dataset of each control's rows (a planted error is gross: fewer runs catch it). "
            "Default: as --trials.",
        ),
    ] = None,
    mechanism: Annotated[
        list[str] | None, typer.Option(help="Audit only this mechanism (repeat the option). Default: all.")
    ] = None,
    controls: Annotated[
        bool, typer.Option(help="Also run each mechanism's controls (planted errors the audit must catch).")
    ] = True,
    seed: Annotated[
        int, typer.Option(help="Seed of the audit's runs (an audit is a test, not a release).")
    ] = 0,
) -> None:
    """Empirical privacy audit: run each mechanism many times on two neighbouring datasets, distinguish
    them (likelihood ratio; precision of the output's bits), and turn the error rates (Clopper-Pearson,
    99.9 %) into lower bounds on the claim's level (mu or epsilon) and on epsilon.

    Each mechanism with a guarantee is also run with two controls: noise for a 1.5x smaller sensitivity,
    and noise added in floating point. Exit status 1 when a mechanism that claims a guarantee exceeds its
    claim, or when a control is not caught.
    """

    from rich.console import Console
    from rich.table import Table

    from shared.bo.gibo.audit import GIBO_AUDITS
    from shared.federated.audit import FEDERATION_AUDITS
    from shared.privacy.audit import AUDITS, run_all

    console = Console()
    try:
        with console.status("auditing ...") as status:
            results = run_all(
                mechanism,
                trials=trials,
                calibration_trials=calibration_trials,
                control_trials=control_trials,
                seed=seed,
                controls=controls,
                progress=lambda name: status.update(f"auditing {name} ..."),
                registry={**AUDITS, **GIBO_AUDITS, **FEDERATION_AUDITS},
            )
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--mechanism") from None
    table = Table(title="pobo audit privacy (lower bounds, 99.9 %)")
    for column in (
        "mechanism",
        "control",
        "test",
        "claim",
        "trials",
        "FP/FN",
        "level >=",
        "eps >=",
        "verdict",
    ):
        table.add_column(column)
    for res in results:
        if res.control is not None:
            verdict = "[green]caught[/]" if res.caught else "[red]NOT CAUGHT[/]"
        elif res.within_claim:
            verdict = "[green]within claim[/]"
        elif res.perfect_distinguisher:
            verdict = "[red]unbounded[/]"
        else:
            verdict = "[red]EXCEEDS CLAIM[/]" if res.formal_guarantee else "[red]exceeds its label[/]"
        table.add_row(
            res.mechanism,
            res.control or "-",
            res.test,
            f"{res.level_name} {res.claimed_level:.3g}" if res.formal_guarantee else "none",
            str(res.trials),
            f"{res.false_positives}/{res.false_negatives}",
            f"{res.level_name} {res.level_lower_bound:.3f}",
            f"{res.empirical_epsilon_lower_bound:.3f}",
            verdict,
        )
    console.print(table)
    console.print(
        "claim: mu of a Gaussian mechanism (mu-GDP; Poisson-subsampled at a federation round with q < 1), "
        "epsilon of a pure one; 'level >=' is the 99.9 % lower bound on that level, 'eps >=' the one on "
        "epsilon at the claim's delta (--json has the claims in words)."
    )
    if any(r.perfect_distinguisher for r in results):
        console.print(
            "unbounded: no error in either direction, so the bound is limited only by the number of trials "
            "(it grows as ln(trials)); the mechanism tells the two datasets apart with certainty."
        )
    if json_path:
        write_json_atomic(json_path, [r.row() for r in results])
    failed = [r for r in results if r.failed]
    for res in failed:
        what = f"control {res.control!r} of {res.mechanism}" if res.control else res.mechanism
        problem = "was not caught" if res.control else "exceeds its claim"
        console.print(f"[red]FAILED[/]: {what} ({res.test} test) {problem}")
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
    from shared.tools.apidocs import main as generate

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
    sync: Annotated[
        bool,
        typer.Option(
            help="First have the modeler record the curator's supersessions it lacks "
            "(POST /v1/studies/{id}/audit/sync); --no-sync compares the audit log as it stands."
        ),
    ] = True,
) -> None:
    """Compare a study's audit log (modeler) with the curator's query log; print every mismatch.

    Exit status 0 when both hash chains verify and every query matches (id, row index, y; a value the
    curator superseded matches when the modeler's audit records the same supersession), 1 otherwise,
    2 when either service could not be asked (unreachable, wrong token, unknown study).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from shared.errors import PoboError
    from shared.tools.reconcile import reconcile

    console = Console()
    try:
        report = reconcile(
            curator_url=curator,
            curator_token=curator_token,
            modeler_url=modeler,
            modeler_token=modeler_token,
            study_id=study,
            verify=ca_bundle if ca_bundle is not None else True,
            sync=sync,
        )
    except PoboError as exc:  # CuratorError, ModelerApiError: the message names the side and its answer
        console.print(f"[red]cannot reconcile[/]: {escape(str(exc))}")
        raise typer.Exit(2) from None
    chains = (
        f"modeler audit chain {'ok' if report.modeler_chain_ok else 'BROKEN'}, "
        f"curator query chain {'ok' if report.curator_chain_ok else 'BROKEN'}"
    )
    for s in report.supersessions:  # recorded on both sides: reconciled, listed for the record
        console.print(
            f"superseded: query {s.query_id}, correction {s.correction_id}: y {s.previous_y!r} -> {s.y!r} "
            "(both values in both logs)"
        )
    if report.ok:
        extra = f" (+ {len(report.supersessions)} supersession(s))" if report.supersessions else ""
        console.print(
            f"[green]OK[/]: study {report.study_id} ({report.source}): "
            f"{report.modeler_entries} audit entries = {report.curator_entries} curator queries{extra}; "
            f"{chains}"
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
    keep_running: Annotated[
        bool,
        typer.Option(help="Keep both services and their browser consoles up after the study, until Ctrl-C."),
    ] = False,
) -> None:
    """Run the whole two-party loop locally: both services, a release, a partner, a study."""
    from shared.tools.demo import run_demo

    run_demo(output=output, iterations=iterations, keep_running=keep_running)


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
    debug: Annotated[bool, typer.Option(help="Show the traceback of an error (default: one line).")] = False,
) -> None:
    """Take part in a federation until it is done: evaluate the demo objective locally each round and
    submit only a posterior sample (omega) to the modeler; local observations never leave this process.

    Start it any time after the federation is created: it waits for the start, and joins (or, after a
    restart or an outage, rejoins) at the coordinator's current round without submitting a round twice.
    The final report lists the rounds that counted its submission, as the coordinator's receipts say.

    It first checks that --modeler is a pobo modeler (GET /healthz). An error is one line on stderr that
    says what to do, and the exit status is 1 (--debug: the traceback too). If another process runs with
    the same agent token, the modeler says so and the agent prints a warning."""
    from rich.console import Console

    from shared.federated.objectives import make_objective
    from shared.tools.agent import Agent
    from shared.tools.agent_checks import check_modeler, explain

    console = Console()

    def on_round(t: int, info: dict[str, object]) -> None:
        if info["y"] is None:  # the round closed before this agent could submit (it was down, or cut off)
            query = "no query of this agent (the round closed before it could submit)"
        else:
            query = f"query from {info['source']}, y = {info['y']:.4g}"
        counted = "counted" if info["accepted"] else "not counted"
        console.print(
            f"round {t}: closed, epsilon {info['epsilon_pld']:.4g} (PLD) / {info['epsilon_rdp']:.4g} (RDP); "
            f"{query}; this agent's submission {counted}"
        )

    def on_warning(message: str) -> None:
        typer.echo(f"warning: {message}", err=True)  # one line (rich would wrap it)

    verify: str | bool = str(ca_bundle) if ca_bundle is not None else True
    try:
        url = check_modeler(modeler, verify=verify)
        with Agent(
            url,
            federation,
            token,
            objective=lambda x: 0.0,  # replaced below, once the box is known
            wait_seconds=wait,
            retry_seconds=retry_seconds,
            verify=verify,
            on_round=on_round,
            on_warning=on_warning,
        ) as agent:
            params = agent.federation().params
            bounds = params["bounds"]
            lower, upper = [b[0] for b in bounds], [b[1] for b in bounds]
            agent.objective = make_objective(objective, lower, upper, perturbation=perturbation, seed=seed)
            report = agent.run()
    except KeyboardInterrupt:
        typer.echo("interrupted: the agent stopped (run it again to rejoin at the current round)", err=True)
        raise typer.Exit(130) from None
    except Exception as exc:
        if debug:
            raise
        typer.echo(f"error: {explain(exc, modeler, federation)}", err=True)
        raise typer.Exit(1) from None
    console.print(
        f"federation {report.federation_id} done ({report.stop_reason}): submitted in rounds "
        f"{report.submitted}, refused in {report.refused}; best y {report.best_y}; "
        f"epsilon {report.epsilon_pld:.4g} (PLD) / {report.epsilon_rdp:.4g} (RDP)"
    )


if __name__ == "__main__":  # pragma: no cover
    app()
