"""The operations commands of both services: ``pobo curator|modeler backup DIR`` and ``restore DIR``, and
``pobo curator archive-access-log``. Each reads the service's settings from the environment exactly as
``serve`` does (docs/deployment.md, docs/operations.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

__all__ = ["add_operations_commands"]

BackupDir = Annotated[
    Path, typer.Argument(metavar="DIR", help="The snapshot's directory (new, or empty).", file_okay=False)
]
RestoreDir = Annotated[
    Path, typer.Argument(metavar="DIR", help="A snapshot written by backup.", exists=True, file_okay=False)
]

#: What a service's snapshot holds beside its database (the commands' help).
_HOLDS = {
    "curator": "database, array files, admin-token, manifest",
    "modeler": "database, release copies, token, secret.key, manifest",
}


def _backup(service: str, directory: Path) -> None:
    import sqlite3

    from sqlalchemy.exc import SQLAlchemyError

    from shared.tools.backup import BackupError, backup, load_settings

    try:
        manifest = backup(service, load_settings(service), directory)
    except (BackupError, OSError, sqlite3.Error, SQLAlchemyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    size = sum(f["size"] for f in manifest["files"].values())
    typer.echo(
        f"backed up the {service} to {directory}: {len(manifest['files'])} files, {size} bytes, "
        f"{manifest['database']['kind']} at alembic revision {manifest['alembic_revision']}"
    )


def _restore(service: str, directory: Path) -> None:
    import sqlite3

    from sqlalchemy.exc import SQLAlchemyError

    from shared.tools.backup import BackupError, load_settings
    from shared.tools.restore import restore

    try:
        manifest = restore(service, load_settings(service), directory)
    except (BackupError, OSError, sqlite3.Error, SQLAlchemyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"restored the {service} from {directory} (taken {manifest['created_at']}); "
        f"start it with pobo {service} serve"
    )


def _archive_access_log(
    older_than: Annotated[
        float | None,
        typer.Option(
            "--older-than",
            min=0,
            metavar="DAYS",
            help="Archive entries older than DAYS (default: POBO_CURATOR_ACCESS_LOG_RETENTION_DAYS).",
        ),
    ] = None,
) -> None:
    """Archive old access-log entries to <data dir>/archive (gzip JSON lines, sha256 sidecar), then delete
    them from the database. Settings are read from the environment exactly as serve reads them; see
    docs/operations.md#retention."""
    from sqlalchemy.exc import SQLAlchemyError

    from curator_service.config import Settings
    from curator_service.services.retention import ArchiveError, archive_with_settings

    try:
        result = archive_with_settings(Settings(), older_than)
    except (ArchiveError, OSError, SQLAlchemyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if result.skipped:
        typer.echo("another process is archiving the access log now; nothing done")
        return
    names = ", ".join(p.name for p in result.files) or "no new archive"
    typer.echo(f"archived {result.archived} access-log entries ({names}); deleted {result.deleted}")


def add_operations_commands(app: typer.Typer, service: Literal["curator", "modeler"]) -> None:
    """Register ``backup`` and ``restore`` (and, for the curator, ``archive-access-log``) on ``app``."""

    def backup_cmd(directory: BackupDir) -> None:
        _backup(service, directory)

    def restore_cmd(directory: RestoreDir) -> None:
        _restore(service, directory)

    backup_cmd.__doc__ = (
        f"Snapshot the running {service} into DIR ({_HOLDS[service]}).\n\n"
        "Settings are read from the environment exactly as serve reads them; see docs/deployment.md."
    )
    restore_cmd.__doc__ = (
        f"Restore a {service} snapshot into an empty data dir and database (checksums checked first).\n\n"
        "Settings are read from the environment exactly as serve reads them; see docs/deployment.md."
    )
    app.command("backup")(backup_cmd)
    app.command("restore")(restore_cmd)
    if service == "curator":
        app.command("archive-access-log")(_archive_access_log)
