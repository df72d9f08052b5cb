"""``pobo curator|modeler backup DIR``: an online, consistent snapshot of one service (``restore DIR`` is in
``shared.tools.restore``).

A snapshot is a directory::

    manifest.json        service, time, alembic revision, database kind, and every file's sha256 and size
    database.sqlite      the SQLite database (sqlite3's online backup API), or
    database.sql         the PostgreSQL tables of the service (``pg_dump``, plain SQL, in one snapshot)
    data/...             the data dir's files the database refers to (array files), its secrets
                         (the curator's admin-token; the modeler's token and secret.key) and the curator's
                         access-log archives (archive/)

Consistency: the database is copied first, in one snapshot (SQLite's backup API copies a consistent
state while the service writes; PostgreSQL's snapshot is exported and shared by ``pg_dump --snapshot`` and
the query listing the array files). The array files the snapshot refers to are copied next. They are
immutable once written: the curator writes each array under a new random name (``ArrayStore.new_relpath``,
then ``os.replace``) and never rewrites it; the modeler writes a study's ``releases/study-<id>.npy`` once,
when the study is created. Erasing a dataset (``erased_at``) deletes its files but keeps their paths: the
snapshot skips them. A file the snapshot refers to but which is gone by the time it is copied (its
dataset, release or study was deleted meanwhile) fails the backup: run it again. The snapshot is written
in a temporary directory beside DIR and renamed to DIR at the end, so DIR is complete or absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from shared.files import fsync_dir

__all__ = ["BackupError", "ServiceSpec", "backup", "load_settings", "service_spec", "sha256_file"]

MANIFEST = "manifest.json"
FORMAT = 1
SQLITE_FILE = "database.sqlite"
SQL_FILE = "database.sql"
DATA = "data"


class BackupError(Exception):
    """A backup or restore that cannot proceed; the message says why and what to do."""


@dataclass(frozen=True)
class ServiceSpec:
    """What a snapshot of one service holds."""

    service: str
    #: Tables of the service: its prefix (the services may share one PostgreSQL database) ...
    table_prefix: str
    #: ... and its alembic version table.
    version_table: str
    #: SQL listing every data-dir-relative file path the database refers to (NULLs ignored).
    referenced_sql: str
    #: Secret files kept in the data dir (copied when present).
    secret_files: tuple[str, ...]
    #: Directories of the data dir copied whole (their files but hidden ones: locks, temporary files).
    copied_dirs: tuple[str, ...] = ()


def service_spec(service: str) -> ServiceSpec:
    if service == "curator":
        from curator_service.config import ADMIN_TOKEN_FILE
        from curator_service.db import MIGRATIONS as CURATOR
        from curator_service.services.retention import ARCHIVE_DIR

        return ServiceSpec(
            "curator",
            "curator_",
            CURATOR.version_table,
            # an erased dataset or release keeps its paths (a tombstone) but its files are gone
            "SELECT features_path FROM curator_datasets WHERE erased_at IS NULL "
            "UNION SELECT outcomes_path FROM curator_datasets WHERE erased_at IS NULL "
            "UNION SELECT ids_path FROM curator_datasets WHERE erased_at IS NULL "
            "UNION SELECT z_path FROM curator_releases WHERE erased_at IS NULL",
            (ADMIN_TOKEN_FILE,),
            (ARCHIVE_DIR,),  # the access log's archives (retention): entries no longer in the database
        )
    if service == "modeler":
        from modeler_service.config import SECRET_KEY_FILE, TOKEN_FILE
        from modeler_service.db import MIGRATIONS as MODELER

        return ServiceSpec(
            "modeler",
            "modeler_",
            MODELER.version_table,
            "SELECT z_file FROM modeler_studies",
            (TOKEN_FILE, SECRET_KEY_FILE),
        )
    raise ValueError(f"unknown service {service!r}")


def load_settings(service: str) -> Any:
    """The service's settings, read from the environment exactly as ``pobo <service> serve`` reads them."""
    if service == "curator":
        from curator_service.config import Settings as CuratorSettings

        return CuratorSettings()
    from modeler_service.config import Settings as ModelerSettings

    return ModelerSettings()


# -- helpers


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sqlite_path(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
        raise BackupError(f"cannot back up the SQLite database {parsed.database!r}: use a file path")
    return Path(parsed.database)


def libpq(url: str) -> tuple[str, dict[str, str]]:
    """The libpq connection URI of a SQLAlchemy PostgreSQL URL (password passed as PGPASSWORD)."""
    parsed = make_url(url)
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    plain = parsed.set(drivername="postgresql", password=None)
    return plain.render_as_string(hide_password=False), env


def pg_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackupError(f"{name} is not on PATH: install the PostgreSQL client tools (same major version)")
    return path


def is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


@contextmanager
def staging(final: Path) -> Iterator[Path]:
    """A temporary directory beside ``final``, renamed to ``final`` on success, removed on failure.

    ``final`` may exist if it is empty (a mount point, such as a compose volume, cannot be replaced): the
    temporary directory is then made inside it and its entries moved up, ``manifest.json`` last; on
    failure ``final`` is emptied again."""
    if final.exists() and not is_empty_dir(final):
        raise BackupError(f"{final} exists and is not empty: choose a new directory")
    inside = final.exists()
    if inside:
        tmp = final / f".partial-{uuid.uuid4().hex[:12]}"
    else:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:12]}")
    tmp.mkdir(mode=0o700)
    try:
        yield tmp
        if inside:
            for name in sorted(os.listdir(tmp), key=lambda n: n == MANIFEST):
                os.rename(tmp / name, final / name)
            tmp.rmdir()
            fsync_dir(final)
        else:
            os.rename(tmp, final)
            fsync_dir(final.parent)
    except BaseException:
        if inside:
            for child in list(final.iterdir()):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def copy_private(src: Path, dst: Path) -> None:
    dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())


# -- backup


def _copy_dir(data_dir: Path, name: str, out: Path) -> None:
    """The regular files of ``data_dir/name`` (not hidden ones) to ``out/name``, if it exists."""
    source = data_dir / name
    if not source.is_dir():
        return
    for path in sorted(source.iterdir()):
        if path.name.startswith(".") or not path.is_file() or path.is_symlink():
            continue
        try:
            copy_private(path, out / name / path.name)
        except FileNotFoundError:  # removed meanwhile: an incomplete archive of an interrupted run
            continue


def _snapshot_sqlite(db_file: Path, spec: ServiceSpec, out: Path) -> tuple[str | None, set[str]]:
    if not db_file.is_file():
        raise BackupError(f"no database at {db_file}: is this the service's data dir (settings)?")
    source = sqlite3.connect(db_file, timeout=60)  # WAL: readers never block the service's writer
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        target = sqlite3.connect(out)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
            revision, referenced = _read_state(target, spec)
        finally:
            target.close()
    finally:
        source.close()
    return revision, referenced


def _read_state(conn: Any, spec: ServiceSpec) -> tuple[str | None, set[str]]:
    """(alembic revision, referenced file paths) read on a DB-API connection to the snapshot."""
    cur = conn.cursor()
    cur.execute(f"SELECT version_num FROM {spec.version_table}")  # noqa: S608 - a fixed table name
    row = cur.fetchone()
    cur.execute(spec.referenced_sql)
    referenced = {str(r[0]) for r in cur.fetchall() if r[0]}
    cur.close()
    return (str(row[0]) if row else None), referenced


def _snapshot_postgresql(url: str, spec: ServiceSpec, out: Path) -> tuple[str | None, set[str], str]:
    pg_dump = pg_tool("pg_dump")
    engine = create_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            level = conn.exec_driver_sql("SHOW transaction_isolation").scalar_one()
            if level != "repeatable read":  # pragma: no cover - the option above sets it
                raise BackupError(f"could not open a repeatable-read snapshot (isolation {level})")
            schema = str(conn.execute(text("SELECT current_schema()")).scalar_one())
            snapshot = str(conn.execute(text("SELECT pg_export_snapshot()")).scalar_one())
            dbapi = conn.connection.dbapi_connection
            revision, referenced = _read_state(dbapi, spec)
            dbname, env = libpq(url)
            quoted = '"' + schema.replace('"', '""') + '"'
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                done = subprocess.run(  # noqa: S603 - fixed arguments, no shell
                    [
                        pg_dump,
                        "--dbname",
                        dbname,
                        "--snapshot",
                        snapshot,
                        "--no-owner",
                        "--no-privileges",
                        "--format",
                        "plain",
                        "--table",
                        f"{quoted}.{spec.table_prefix}*",
                        "--table",
                        f"{quoted}.{spec.version_table}",
                    ],
                    stdout=fh,
                    stderr=subprocess.PIPE,
                    env=env,
                    check=False,
                )
            conn.rollback()  # read only: the snapshot is released once pg_dump is done
    finally:
        engine.dispose()
    if done.returncode != 0:
        raise BackupError(f"pg_dump failed: {done.stderr.decode(errors='replace').strip()}")
    return revision, referenced, schema


def backup(service: str, settings: Any, target: Path) -> dict[str, Any]:
    """Write a snapshot of ``service`` (its ``settings``) to ``target``; returns the manifest."""
    spec = service_spec(service)
    data_dir = Path(settings.data_dir).resolve()
    url = settings.resolved_database_url()
    db_file = sqlite_path(url)
    target = target.resolve()
    if target == data_dir or data_dir in target.parents:
        raise BackupError("write the backup outside the service's data dir")
    with staging(target) as tmp:
        database: dict[str, Any]
        if db_file is not None:
            revision, referenced = _snapshot_sqlite(db_file, spec, tmp / SQLITE_FILE)
            database = {"kind": "sqlite", "file": SQLITE_FILE}
        else:
            revision, referenced, schema = _snapshot_postgresql(url, spec, tmp / SQL_FILE)
            database = {"kind": "postgresql", "file": SQL_FILE, "schema": schema}
        # Array files after the database: every file the snapshot refers to (immutable once written).
        for rel in sorted(referenced):
            src = (data_dir / rel).resolve()
            if data_dir not in src.parents:
                raise BackupError(f"the database refers to {rel!r}, outside the data dir")
            if not src.is_file():
                raise BackupError(
                    f"{rel} is referenced by the database snapshot but missing from {data_dir} (deleted "
                    "after the snapshot, or lost): run the backup again; if it fails again, the data dir "
                    "is damaged"
                )
            copy_private(src, tmp / DATA / rel)
        # Archives after the database: an entry deleted from the snapshot was archived before it was
        # deleted, so its archive is there now (archives are written once and never removed).
        for name in spec.copied_dirs:
            _copy_dir(data_dir, name, tmp / DATA)
        secrets_copied = []
        for name in spec.secret_files:
            if (data_dir / name).is_file():
                copy_private(data_dir / name, tmp / DATA / name)
                secrets_copied.append(name)
        files = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            rel = path.relative_to(tmp).as_posix()
            files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
        manifest = {
            "format": FORMAT,
            "service": service,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "alembic_revision": revision,
            "database": database,
            "secrets": secrets_copied,
            "files": files,
        }
        fd = os.open(tmp / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
    return manifest
