"""Engine, session factories and start-up migrations.

SQLite (the embedded default) runs in WAL mode with foreign keys on. Its transactions are started by us
(the driver's own implicit BEGIN is switched off): sessions for requests that write use ``BEGIN
IMMEDIATE``, which takes the database write lock at the first statement, so a read-then-write transaction
(the privacy ledger's check-and-spend, the query quota) can neither interleave with another writer nor fail
with "database is locked" half-way. PostgreSQL uses row locks (``SELECT ... FOR UPDATE``) instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

import curator_service
from shared.servicekit import sqlite_turns
from shared.servicekit.migrations import run_migrations
from shared.servicekit.serving import create_private_file

#: alembic environment of this service: <repo>/migrations/curator (located from the package, not the cwd).
MIGRATIONS_DIR = Path(curator_service.__file__).resolve().parent.parent / "migrations" / "curator"
VERSION_TABLE = "alembic_version_curator"
_BEGIN_OPTION = "pobo_sqlite_begin"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:" and not database.startswith("file:"):
            create_private_file(Path(database))  # 0600 before SQLite creates it (and its WAL, SHM) 0644
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 60},
            pool_pre_ping=True,
            pool_size=10,
            max_overflow=40,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see _sqlite_begin)
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=60000")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.close()

        # BEGIN (IMMEDIATE for write sessions) emitted by us, each write transaction taken in turn.
        turns = sqlite_turns.WriterTurns.for_database(engine.url.database)
        sqlite_turns.install(engine, event.listen, turns, begin_option=_BEGIN_OPTION)
        return engine
    return create_engine(
        url,
        connect_args={"connect_timeout": 5},  # fail fast (503) rather than hang while the database is down
        pool_timeout=10,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=30,
    )


class Database:
    """The engine plus two session factories: ``read`` (plain BEGIN) and ``write`` (BEGIN IMMEDIATE)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        write_engine = (
            self.engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"}) if self.is_sqlite else (self.engine)
        )
        # expire_on_commit=False: services read attributes after an explicit commit without re-opening a
        # transaction (which, for a write session on SQLite, would take the write lock again).
        self.read = sessionmaker(bind=self.engine, expire_on_commit=False)
        self.write = sessionmaker(bind=write_engine, expire_on_commit=False)

    def session(self, *, write: bool) -> Session:
        return (self.write if write else self.read)()

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001 - any failure means "unreachable"
            return False

    def migrate(self) -> None:
        upgrade(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """``alembic upgrade head`` on this engine (idempotent; run at every start-up)."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise RuntimeError(
            f"the curator's alembic environment is missing at {MIGRATIONS_DIR}; install pobo from its source "
            "tree (pip install -e .) so that <source>/migrations/curator is present"
        )
    run_migrations(engine, alembic_config(), revision=revision)
