"""``pobo curator|modeler restore DIR``: a snapshot written by ``shared.tools.backup`` back into an empty
service.

Restore refuses a data dir that is not empty and a database that already holds the service's tables,
verifies every checksum of the manifest before writing anything, then writes the data dir (through a
temporary sibling renamed into place) and the database (SQLite: a temporary file renamed; PostgreSQL:
``psql --single-transaction``). The service then starts on it as usual (``serve`` migrates it to head).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from shared.tools.backup import (
    DATA,
    FORMAT,
    MANIFEST,
    SQL_FILE,
    SQLITE_FILE,
    BackupError,
    ServiceSpec,
    copy_private,
    is_empty_dir,
    libpq,
    pg_tool,
    service_spec,
    sha256_file,
    sqlite_path,
    staging,
)

__all__ = ["restore", "verify"]


def verify(source: Path, service: str) -> dict[str, Any]:
    """The snapshot's manifest, after checking it is ``service``'s and every file's size and sha256."""
    try:
        manifest: dict[str, Any] = json.loads((source / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BackupError(f"{source} has no {MANIFEST}: not a pobo backup (or an incomplete copy)") from None
    except ValueError as exc:
        raise BackupError(f"{source / MANIFEST} is not valid JSON ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{source}: backup format {manifest.get('format')!r}, this pobo reads {FORMAT}")
    if manifest.get("service") != service:
        raise BackupError(
            f"{source} is a backup of the {manifest.get('service')}, not of the {service}: "
            f"use pobo {manifest.get('service')} restore"
        )
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    bad = []
    for rel, meta in files.items():
        path = source / rel
        if not path.is_file():
            bad.append(f"{rel}: missing")
        elif path.stat().st_size != meta["size"]:
            bad.append(f"{rel}: size {path.stat().st_size}, manifest {meta['size']}")
        elif sha256_file(path) != meta["sha256"]:
            bad.append(f"{rel}: sha256 differs from the manifest")
    if manifest["database"]["file"] not in files:
        bad.append(f"{manifest['database']['file']}: not in the manifest")
    if bad:
        raise BackupError(
            "the backup is damaged, nothing was restored: " + "; ".join(bad[:5]) + " (use another backup)"
        )
    _check_revision(service, manifest.get("alembic_revision"))
    return manifest


def _check_revision(service: str, revision: str | None) -> None:
    from alembic.script import ScriptDirectory

    from curator_service.db import MIGRATIONS as CURATOR
    from modeler_service.db import MIGRATIONS as MODELER

    migrations = CURATOR if service == "curator" else MODELER
    if revision is None:
        return
    try:
        ScriptDirectory.from_config(migrations.config()).get_revision(revision)
    except Exception:  # noqa: BLE001 - alembic raises several kinds for an unknown revision
        raise BackupError(
            f"the backup's database is at alembic revision {revision}, which this pobo does not know "
            "(a backup of a newer pobo): restore with that version"
        ) from None


def _pg_has_tables(url: str, spec: ServiceSpec) -> tuple[str, list[str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            schema = str(conn.execute(text("SELECT current_schema()")).scalar_one())
            names = conn.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = :s "
                    "AND (starts_with(tablename, :p) OR tablename = :v)"
                ),
                {"s": schema, "p": spec.table_prefix, "v": spec.version_table},
            ).scalars()
            return schema, sorted(names)
    finally:
        engine.dispose()


def restore(service: str, settings: Any, source: Path) -> dict[str, Any]:
    """Restore the snapshot at ``source`` into the (empty) data dir and database of ``settings``."""
    spec = service_spec(service)
    source = source.resolve()
    manifest = verify(source, service)
    data_dir = Path(settings.data_dir).resolve()
    url = settings.resolved_database_url()
    db_file = sqlite_path(url)
    kind = manifest["database"]["kind"]
    env_name = f"POBO_{service.upper()}"
    if data_dir.exists() and not is_empty_dir(data_dir):
        raise BackupError(
            f"the data dir {data_dir} is not empty: restore only into a new or empty data dir "
            f"(set {env_name}_DATA_DIR to one, or move this one aside first)"
        )
    if (db_file is None) != (kind == "postgresql"):
        raise BackupError(
            f"the backup holds a {kind} database but {env_name}_DATABASE_URL points to "
            f"{'SQLite' if db_file is not None else 'PostgreSQL'}: set it to a {kind} database"
        )
    schema = None
    if db_file is not None:
        if db_file.exists():
            raise BackupError(f"{db_file} exists: restore only into an empty database (move it aside first)")
    else:
        schema, tables = _pg_has_tables(url, spec)
        if tables:
            raise BackupError(
                f"the database already holds {service} tables in schema {schema} ({', '.join(tables[:3])}"
                f"{', ...' if len(tables) > 3 else ''}): restore only into an empty database"
            )
        if schema != manifest["database"].get("schema"):
            raise BackupError(
                f"the backup's tables are in schema {manifest['database'].get('schema')!r} but "
                f"{env_name}_DATABASE_URL uses schema {schema!r}: create that schema and put it first in the "
                "URL's search_path (options=-csearch_path%3D<schema>)"
            )
    # The data dir: a temporary sibling renamed into place.
    with staging(data_dir) as tmp:
        for rel in manifest["files"]:
            if rel.startswith(f"{DATA}/"):
                copy_private(source / rel, tmp / rel.removeprefix(f"{DATA}/"))
        if db_file is not None and db_file.resolve().parent == data_dir:
            copy_private(source / SQLITE_FILE, tmp / db_file.name)
    if db_file is not None and db_file.resolve().parent != data_dir:
        staged = db_file.with_name(f".{db_file.name}.tmp-{uuid.uuid4().hex[:12]}")
        copy_private(source / SQLITE_FILE, staged)
        os.replace(staged, db_file)
    elif db_file is None:
        psql = pg_tool("psql")
        dbname, env = libpq(url)
        done = subprocess.run(  # noqa: S603 - fixed arguments, no shell
            [
                psql,
                "--no-psqlrc",
                "--quiet",
                "--set",
                "ON_ERROR_STOP=1",
                "--single-transaction",
                "--dbname",
                dbname,
                "--file",
                str(source / SQL_FILE),
            ],
            capture_output=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            shutil.rmtree(data_dir, ignore_errors=True)  # ours: it was empty before
            raise BackupError(
                f"psql failed (nothing restored): {done.stderr.decode(errors='replace').strip()[-2000:]}"
            )
    return manifest
