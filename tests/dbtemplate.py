"""Migrated databases for the in-process service tests, migrated once per test process instead of per test.

Every curator and modeler unit test starts on a fresh database at the head revision. Running the alembic
migrations for each of them took about half a second (SQLite rebuilds tables in batch mode; PostgreSQL runs a
hundred DDL statements), a third of the unit tests' time. Here the migrations run once per test process and
per service, through the service's own ``Database.migrate``:

* **SQLite**: into a template file, which each test then gets a byte copy of.
* **PostgreSQL**: in a template schema, with every statement the migrations sent to the server recorded
  (``before_cursor_execute``: the SQL and its parameters, as handed to the driver); each test gets a new,
  empty schema of its own and the same statements replayed in it, in one transaction. The migrations are
  deterministic on an empty schema, so the replay builds the same tables, indexes, constraints and version
  row.

Either way the app under test still runs ``migrate`` when it starts, which finds the database at head (and
upgrades it, should a test have stepped it back). Templates live in a temporary directory and a schema of
their own, removed when the process exits.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

__all__ = ["pg_schema_at_head", "sqlite_at_head"]

#: (service, kind) -> the template (a SQLite file, or the recorded PostgreSQL statements).
_SQLITE: dict[str, Path] = {}
_PG: dict[tuple[str, str], list[tuple[str, Any, bool]]] = {}


@dataclass
class _Recorder:
    statements: list[tuple[str, Any, bool]] = field(default_factory=list)

    def __call__(
        self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        self.statements.append((statement, parameters, many))


def _schema_url(base: str, schema: str) -> str:
    return (
        make_url(base)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )


def _psycopg_url(base: str) -> str:
    return make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)


def sqlite_at_head(service: str, database: Callable[[str], Any], dest: Path) -> str:
    """A SQLite file at ``dest`` holding ``service``'s schema at head; returns its URL. ``database(url)``
    builds the service's ``Database`` (whose ``migrate`` is run once, for the template)."""
    template = _SQLITE.get(service)
    if template is None:
        directory = Path(tempfile.mkdtemp(prefix=f"pobo-{service}-template-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        template = directory / "template.db"
        db = database(f"sqlite:///{template}")
        try:
            db.migrate()
            with db.engine.connect() as conn:  # everything in the main file: the copy needs no -wal
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.dispose()
        _SQLITE[service] = template
    dest.touch(mode=0o600)  # as the service creates its database file: private (copyfile keeps the mode)
    shutil.copyfile(template, dest)
    return f"sqlite:///{dest}"


def _recorded(service: str, database: Callable[[str], Any], base: str) -> list[tuple[str, Any, bool]]:
    key = (service, base)
    if key not in _PG:
        schema = f"pobo_{service}_template_{uuid.uuid4().hex[:10]}"
        admin = create_engine(base)
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))

        def drop() -> None:
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            admin.dispose()

        atexit.register(drop)
        db = database(_schema_url(base, schema))
        recorder = _Recorder()
        event.listen(db.engine, "before_cursor_execute", recorder)
        try:
            db.migrate()
        finally:
            event.remove(db.engine, "before_cursor_execute", recorder)
            db.dispose()
        _PG[key] = recorder.statements
    return _PG[key]


def pg_schema_at_head(
    service: str, database: Callable[[str], Any], base: str, schema: str, *, create: bool = True
) -> str:
    """Create ``schema`` (unless ``create`` is false: it exists) and build ``service``'s tables at head in it
    (the template's statements replayed); returns its URL (``base`` with ``search_path`` set to it). The
    caller drops the schema."""
    import psycopg

    statements = _recorded(service, database, base)
    with psycopg.connect(_psycopg_url(base)) as conn:  # one transaction: the schema and all of its tables
        if create:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET LOCAL search_path TO "{schema}"')
        with conn.cursor() as cursor:
            for statement, parameters, many in statements:
                if many:
                    cursor.executemany(statement, parameters)
                else:
                    cursor.execute(statement, parameters)
    return _schema_url(base, schema)
