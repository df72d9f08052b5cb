"""``pobo curator upload|release|partner|grant|queries|answer|ledger`` and
``pobo study create|run|watch|show|export|list``: the SDK (``pobo.Curator``, ``pobo.Modeler``) from a shell.

Every command reads its service's URL and token from the environment or the profile file
(``shared.tools.profile``), never from an argument. ``--json`` prints the API's answer as JSON (for
scripts); without it a table. A refusal of the service is printed with its own message on standard error,
exit status 1; a missing or unsafe profile, exit status 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shared.files import write_text_atomic
from shared.tools.profile import ProfileError, endpoint, partner_token

if TYPE_CHECKING:
    from pydantic import BaseModel

    import pobo

__all__ = ["add_curator_commands", "study_app"]

study_app = typer.Typer(
    help="Studies on the modeler (URL and token: POBO_MODELER_URL / POBO_MODELER_TOKEN or the profile).",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")]


@contextmanager
def _errors() -> Iterator[None]:
    """A service's refusal: its message and exit status 1; a configuration problem: exit status 2."""
    import pobo

    try:
        yield
    except ProfileError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except pobo.ApiError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _curator() -> pobo.Curator:
    import pobo

    side = endpoint("curator")
    return pobo.Curator(side.url, side.token)


def _modeler() -> pobo.Modeler:
    import pobo

    side = endpoint("modeler")
    return pobo.Modeler(side.url, side.token)


def _text(value: Any) -> str:
    """A field in a table cell: nothing for None, a list's items separated by commas."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _print(model: BaseModel, as_json: bool, title: str, fields: list[str]) -> None:
    """The whole answer as JSON, or a table of its ``fields``."""
    if as_json:
        typer.echo(model.model_dump_json(indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # a token or an id is copied from here: wrapped, never cut
    for name in fields:
        table.add_row(name, _text(getattr(model, name)))
    Console().print(table)


def _rows(as_json: bool, data: BaseModel, title: str, items: list[Any], fields: list[str]) -> None:
    """A list answer as JSON, or a table with one row per item."""
    if as_json:
        typer.echo(data.model_dump_json(indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    rows = [[_text(getattr(item, f)) for f in fields] for item in items]
    table = Table(title=title)
    for j, name in enumerate(fields):
        if name == "id":  # an id is copied from here: never cut or wrapped, however narrow the terminal
            table.add_column(name, no_wrap=True, min_width=max((len(row[j]) for row in rows), default=2))
        else:
            table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


# -- the curator ---------------------------------------------------------------------------------------
def add_curator_commands(curator_app: typer.Typer) -> None:
    """Add the admin's commands to ``pobo curator`` (beside ``serve``)."""
    for name, command in _CURATOR_COMMANDS.items():
        curator_app.command(name)(command)


def upload(
    csv: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The CSV file (header row).")],
    name: Annotated[str, typer.Option(help="The dataset's name.")],
    objective: Annotated[
        str | None, typer.Option(help="The outcome column (omit for a lab's dataset).")
    ] = None,
    features: Annotated[
        str | None, typer.Option(help="Comma-separated feature columns (default: all).")
    ] = None,
    scaling: Annotated[
        str | None, typer.Option(help='none, max_norm:<c>, or a JSON object {"column": scale}.')
    ] = None,
    objective_mode: Annotated[str | None, typer.Option(help="column or manual.")] = None,
    epsilon_budget: Annotated[float | None, typer.Option(help="The population's epsilon budget.")] = None,
    delta_budget: Annotated[float | None, typer.Option(help="The population's delta budget.")] = None,
    population: Annotated[str | None, typer.Option(help="The population these people belong to.")] = None,
    id_column: Annotated[
        str | None, typer.Option(help="The column of sample ids (kept by the curator).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a CSV as a new dataset."""
    form: dict[str, Any] = {
        "features": features,
        "scaling": scaling,
        "objective_mode": objective_mode,
        "epsilon_budget": epsilon_budget,
        "delta_budget": delta_budget,
        "population": population,
        "id_column": id_column,
    }
    with _errors(), _curator() as curator:
        dataset = curator.upload(
            csv, name=name, objective=objective, **{k: v for k, v in form.items() if v is not None}
        )
    _print(dataset, as_json, f"dataset {dataset.id}", ["id", "name", "n", "d", "features", "objective_mode"])


def release(
    dataset_id: Annotated[int, typer.Argument(help="The dataset.")],
    epsilon: Annotated[float, typer.Option(help="epsilon of the release.")],
    delta: Annotated[float, typer.Option(help="delta of the release.")],
    r: Annotated[int | None, typer.Option(help="Project to r < d columns (optional).")] = None,
    mechanism: Annotated[str, typer.Option(help="gaussian (default) or po-gp-ucb.")] = "gaussian",
    as_json: JsonOpt = False,
) -> None:
    """Spend (epsilon, delta) of the population's budget on a release."""
    with _errors(), _curator() as curator:
        made = curator.release(dataset_id, epsilon=epsilon, delta=delta, r=r, mechanism=mechanism)
    _print(
        made, as_json, f"release {made.id}", ["id", "dataset_id", "n", "r", "epsilon", "delta", "mechanism"]
    )


def partner(
    name: Annotated[str, typer.Option(help="The modeler organisation's name.")],
    release: Annotated[list[int], typer.Option("--release", help="A release it may query (repeatable).")],
    max_queries: Annotated[int, typer.Option(help="Its query quota.")],
    as_json: JsonOpt = False,
) -> None:
    """Create a partner; its token is printed once (give it to the modeler by a private channel)."""
    with _errors(), _curator() as curator:
        created = curator.create_partner(name=name, release_ids=release, max_queries=max_queries)
    _print(created, as_json, f"partner {created.id} (the token is shown only now)", ["id", "name", "token"])


def grant(
    partner_id: Annotated[int, typer.Argument(help="The partner.")],
    release: Annotated[list[int], typer.Option("--release", help="A release to grant (repeatable).")],
    as_json: JsonOpt = False,
) -> None:
    """Grant a partner more releases."""
    with _errors(), _curator() as curator:
        updated = curator.grant(partner_id, release)
    _print(updated, as_json, f"partner {updated.id}", ["id", "name", "release_ids"])


def queries(
    release: Annotated[int | None, typer.Option("--release", help="Only this release's queries.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The queries waiting for a measurement, oldest first."""
    filters = {} if release is None else {"release_id": release}
    with _errors(), _curator() as curator:
        pending = curator.pending_queries(**filters)
    fields = ["id", "release_id", "dataset_name", "index", "sample_id"]
    _rows(as_json, pending, f"{pending.count} pending queries", pending.data, fields)


def answer(
    query_id: Annotated[int | None, typer.Argument(help="The query (with Y).")] = None,
    y: Annotated[float | None, typer.Argument(help="Its measured outcome.")] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            exists=True, dir_okay=False, help="A CSV of results: y and query_id, sample_id or index."
        ),
    ] = None,
    release: Annotated[
        int | None, typer.Option("--release", help="With --file: the release of its rows.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Post a measured outcome (QUERY_ID Y), or a CSV of them in one transaction (--file)."""
    if (file is None) == (query_id is None or y is None):
        typer.echo("error: give QUERY_ID and Y, or --file RESULTS.csv", err=True)
        raise typer.Exit(2)
    with _errors(), _curator() as curator:
        if file is not None:
            posted = curator.post_results(file, release_id=release)
            if as_json:
                typer.echo(posted.model_dump_json(indent=2))
            else:
                typer.echo(f"posted {posted.count} results")
            return
        assert query_id is not None and y is not None
        done = curator.post_result(query_id, y)
    _print(done, as_json, f"query {done.id}", ["id", "release_id", "index", "status", "y"])


def ledger(
    dataset_id: Annotated[int, typer.Argument(help="A dataset of the population.")],
    as_json: JsonOpt = False,
) -> None:
    """The privacy ledger of a dataset's population: budget, spent, every charge."""
    with _errors(), _curator() as curator:
        book = curator.ledger(dataset_id)
    if as_json:
        typer.echo(book.model_dump_json(indent=2))
        return
    _print(
        book,
        False,
        f"population {book.population_id}",
        ["epsilon_budget", "epsilon_spent", "delta_budget", "delta_spent"],
    )
    fields = ["id", "dataset_id", "release_id", "mechanism", "epsilon", "delta"]
    _rows(False, book, "charges", book.entries, fields)


_CURATOR_COMMANDS: dict[str, Callable[..., None]] = {
    "upload": upload,
    "release": release,
    "partner": partner,
    "grant": grant,
    "queries": queries,
    "answer": answer,
    "ledger": ledger,
}


# -- studies -------------------------------------------------------------------------------------------
STUDY_FIELDS = [
    "id",
    "name",
    "tags",
    "status",
    "strategy",
    "release_id",
    "iterations_done",
    "iterations_total",
    "best",
    "error",
]


@study_app.command("create")
def study_create(
    release: Annotated[int, typer.Option("--release", help="The curator's release.")],
    iterations: Annotated[int, typer.Option(help="The study's budget of curator queries.")],
    strategy: Annotated[str, typer.Option(help="A strategy of `GET /v1/strategies`.")] = "gp-ucb",
    params: Annotated[str | None, typer.Option(help="strategy_params as a JSON object.")] = None,
    curator_url: Annotated[
        str | None, typer.Option(help="The curator as the modeler reaches it (default: the curator's URL).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="A name for people (1-200 characters).")] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(help="A tag (1-50 letters, digits, -_.:); repeat it for several (at most 20)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a study over a release. The partner token comes from POBO_PARTNER_TOKEN or the profile's
    [modeler] partner_token, else it is asked for without echo."""
    with _errors():
        url = curator_url or endpoint("curator").url
        token = partner_token() or typer.prompt("partner token", hide_input=True)
        try:
            options: dict[str, Any] = {} if params is None else {"strategy_params": json.loads(params)}
            if name is not None:
                options["name"] = name
            if tag:
                options["tags"] = list(tag)
        except ValueError as exc:
            typer.echo(f"error: --params is not a JSON object: {exc}", err=True)
            raise typer.Exit(2) from None
        with _modeler() as modeler:
            study = modeler.create_study(
                curator_url=url, release_id=release, curator_token=token, strategy=strategy,
                iterations=iterations, **options,
            )  # fmt: skip
    _print(study, as_json, f"study {study.id}", STUDY_FIELDS)


@study_app.command("run")
def study_run(
    study_id: Annotated[str, typer.Argument(help="The study.")],
    iterations: Annotated[int | None, typer.Option(help="How many more (default: the rest).")] = None,
    watch: Annotated[bool, typer.Option(help="Wait for the run to end (as `pobo study watch`).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Start a run in the background (with --watch: and wait for it)."""
    with _errors(), _modeler() as modeler:
        accepted = modeler.run(study_id, iterations)
        if watch:
            _watch(modeler, study_id, None, as_json)
            return
    if as_json:
        typer.echo(accepted.model_dump_json(indent=2))
    else:
        typer.echo(f"study {study_id} is running; follow it with: pobo study watch {study_id}")


def _watch(modeler: pobo.Modeler, study_id: str, timeout: float | None, as_json: bool) -> None:
    study = modeler.wait(study_id, timeout, progress=not as_json and sys.stdout.isatty())
    _print(study, as_json, f"study {study.id}", STUDY_FIELDS)
    if study.status == "failed":
        raise typer.Exit(1)


@study_app.command("watch")
def study_watch(
    study_id: Annotated[str, typer.Argument(help="The study.")],
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds (exit 3).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Follow a run until it ends (a progress bar in a terminal); exit status 1 if the study failed."""
    with _errors(), _modeler() as modeler:
        try:
            _watch(modeler, study_id, timeout, as_json)
        except TimeoutError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(3) from None


@study_app.command("show")
def study_show(study_id: Annotated[str, typer.Argument(help="The study.")], as_json: JsonOpt = False) -> None:
    """A study: status, progress, best row."""
    with _errors(), _modeler() as modeler:
        study = modeler.study(study_id)
    _print(study, as_json, f"study {study.id}", STUDY_FIELDS)


@study_app.command("list")
def study_list(
    name: Annotated[
        str | None, typer.Option(help="Only studies whose name contains this, ignoring case.")
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(help="Only studies with this tag, ignoring case; repeat it: studies with every one."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Every study, or those found by name and tags."""
    with _errors(), _modeler() as modeler:
        studies = modeler.studies(name=name, tag=tag or None)
    rows = [  # the table's columns (--json: the API's answer, every field)
        SimpleNamespace(
            id=s.id,
            name=s.name,
            tags=s.tags,
            status=s.status,
            strategy=s.strategy,
            progress=f"{s.iterations_done}/{s.iterations_total}",
        )  # fmt: skip
        for s in studies.data
    ]
    fields = ["id", "name", "tags", "status", "strategy", "progress"]
    _rows(as_json, studies, f"{studies.count} studies", rows, fields)


@study_app.command("export")
def study_export(
    study_id: Annotated[str, typer.Argument(help="The study.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The file to write.")],
    fmt: Annotated[str, typer.Option("--format", help="csv or json (the whole audit log).")] = "csv",
) -> None:
    """Write a study's audit log to a file (CSV, or the API's JSON)."""
    if fmt not in ("csv", "json"):
        typer.echo(f"error: --format is csv or json, not {fmt!r}", err=True)
        raise typer.Exit(2)
    with _errors(), _modeler() as modeler:
        if fmt == "csv":
            text = modeler.audit_csv(study_id).decode("utf-8")
        else:
            text = modeler.audit(study_id).model_dump_json(indent=2) + "\n"
    write_text_atomic(output, text)
    typer.echo(f"wrote {output}")
