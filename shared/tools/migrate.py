"""``pobo curator migrate`` and ``pobo modeler migrate``: move a service's database to an alembic revision.

The services upgrade their database to head at every start (``serve``); this command is for the rest of an
upgrade or a rollback (docs/deployment.md, "Upgrade and rollback"): show where a database stands, upgrade
it ahead of a start, or *downgrade* it to the revision an older pobo expects, on a copy first. It reads the
service's settings from the environment exactly as ``serve`` does, and runs the migrations with the same
helper (``shared.servicekit.migrations.run_migrations``: one transaction, PostgreSQL's advisory lock, SQLite's
foreign-key check), so a downgrade a migration refuses (it would drop data the older schema cannot hold)
changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["MigrateError", "Plan", "add_migrate_command", "migrate", "plan"]

#: The revision names ``--to`` takes besides a revision id.
HEAD, BASE = "head", "base"


class MigrateError(Exception):
    """A migration that cannot proceed; the message says why and what to do."""


@dataclass(frozen=True)
class Plan:
    """Where a database stands and where ``--to`` takes it (revisions are ids; ``None`` is no schema)."""

    service: str
    database: str
    current: str | None
    target: str | None
    head: str
    #: The service's revisions, oldest first.
    revisions: tuple[str, ...]

    @property
    def direction(self) -> str:
        """``upgrade``, ``downgrade`` or ``none``."""
        order = {rev: i for i, rev in enumerate(self.revisions)}
        current = -1 if self.current is None else order[self.current]
        target = -1 if self.target is None else order[self.target]
        return "none" if current == target else ("upgrade" if target > current else "downgrade")

    def label(self, revision: str | None) -> str:
        if revision is None:
            return "none (no schema)"
        return f"{revision} (head)" if revision == self.head else revision


def _migrations(service: str) -> Any:
    if service == "curator":
        from curator_service.db import MIGRATIONS as CURATOR

        return CURATOR
    from modeler_service.db import MIGRATIONS as MODELER

    return MODELER


def _sqlite_file(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return None if parsed.database.startswith("file:") else Path(parsed.database)


def _display(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def plan(service: str, url: str, to: str | None) -> Plan:
    """The service's database at ``url``: its current revision and, with ``to``, the target revision."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    migrations = _migrations(service)
    script = ScriptDirectory.from_config(migrations.config())
    revisions = tuple(reversed([rev.revision for rev in script.walk_revisions()]))
    head = revisions[-1]
    target: str | None = head
    if to is not None and to != HEAD:
        if to == BASE:
            target = None
        else:
            matches = [rev for rev in revisions if rev == to] or [
                rev for rev in revisions if rev.startswith(to)
            ]
            if len(matches) != 1:
                raise MigrateError(
                    f"--to {to!r} is not one revision of the {service}'s migrations; "
                    f"use one of {', '.join(revisions)}, {HEAD} or {BASE}"
                )
            target = matches[0]
    current: str | None = None
    sqlite_file = _sqlite_file(url)
    if sqlite_file is None or sqlite_file.exists():
        from sqlalchemy import create_engine

        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                context = MigrationContext.configure(conn, opts={"version_table": migrations.version_table})
                current = context.get_current_revision()
        finally:
            engine.dispose()
    if current is not None and current not in revisions:
        raise MigrateError(
            f"the {service}'s database is at revision {current}, which this pobo does not know (it knows "
            f"{revisions[0]}..{head}): a newer pobo migrated it. Run that version's migrate, or restore a "
            "backup taken before its upgrade"
        )
    return Plan(service, _display(url), current, target, head, revisions)


def migrate(service: str, url: str, to: str | None, echo: Callable[[str], object] = print) -> Plan:
    """Move the database at ``url`` to ``to`` (``None``: only report where it stands)."""
    from sqlalchemy.exc import SQLAlchemyError

    from shared.servicekit.db import make_engine
    from shared.servicekit.migrations import run_migrations

    steps = plan(service, url, to)
    echo(f"{service} database {steps.database}")
    echo(f"current revision: {steps.label(steps.current)}")
    if to is None:
        echo(f"head of this pobo: {steps.head} (revisions {', '.join(steps.revisions)})")
        return steps
    echo(f"target revision:  {steps.label(steps.target)}")
    direction = steps.direction
    if direction == "none":
        echo("nothing to do")
        return steps
    sqlite_file = _sqlite_file(url)
    if steps.current is None and sqlite_file is not None and not sqlite_file.exists():
        echo(f"no database at {sqlite_file} yet: creating it")
    migrations = _migrations(service)
    engine = make_engine(url)
    try:
        run_migrations(
            engine,
            migrations.config(),
            revision=BASE if steps.target is None else steps.target,
            downgrade=direction == "downgrade",
        )
    except (RuntimeError, SQLAlchemyError) as exc:
        raise MigrateError(
            f"the {direction} to {steps.label(steps.target)} failed and was rolled back (the database is "
            f"still at {steps.label(steps.current)}): {exc}"
        ) from exc
    finally:
        engine.dispose()
    done = plan(service, url, None)
    echo(f"{direction}d: the {service} database is now at {done.label(done.current)}")
    if direction == "downgrade":
        echo(
            f"note: this pobo's `pobo {service} serve` upgrades it to {steps.head} again at start; start the "
            "older pobo that expects this revision instead"
        )
    return done


def add_migrate_command(service_app: typer.Typer, service: str) -> None:
    """Register ``pobo <service> migrate [--to REVISION]`` on the service's command group."""

    def migrate_command(
        to: Annotated[
            str | None,
            typer.Option(
                "--to",
                metavar="REVISION",
                help=f"Target revision (an id such as 0007, '{HEAD}' or '{BASE}'); "
                "omitted: show the current one.",
            ),
        ] = None,
    ) -> None:
        from alembic.util.exc import CommandError
        from pydantic import ValidationError

        from shared.tools.backup import load_settings

        try:
            settings = load_settings(service)
            migrate(service, settings.resolved_database_url(), to, echo=typer.echo)
        except (MigrateError, CommandError, ValidationError, OSError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None

    migrate_command.__doc__ = (
        f"Show the {service}'s database revision, or upgrade or downgrade it to --to REVISION.\n\n"
        f"serve upgrades to head at every start; a downgrade is for a rollback to an older pobo: try it on a "
        f"copy first (docs/deployment.md, 'Upgrade and rollback'). Settings are read from the environment "
        f"exactly as serve reads them."
    )
    service_app.command("migrate")(migrate_command)
