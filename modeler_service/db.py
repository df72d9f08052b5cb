"""Engine, session factories and start-up migrations of the modeler service.

SQLite (the embedded default) runs in WAL mode with foreign keys on and ``synchronous=NORMAL``: a process
crash (even SIGKILL) loses no committed transaction; a power cut may lose the last few, which is harmless
here because every iteration is re-sent to the curator with the same Idempotency-Key and the curator
answers with the query it already made. Writes use ``BEGIN IMMEDIATE`` so that a read-then-write
transaction takes the write lock up front instead of failing with "database is locked" half-way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

import modeler_service
from shared.servicekit import sqlite_turns
from shared.servicekit.migrations import run_migrations
from shared.servicekit.serving import create_private_file

#: alembic environment of this service: <repo>/migrations/modeler (located from the package, not the cwd).
MIGRATIONS_DIR = Path(modeler_service.__file__).resolve().parent.parent / "migrations" / "modeler"
VERSION_TABLE = "alembic_version_modeler"
_BEGIN_OPTION = "pobo_sqlite_begin"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database and database != ":memory:" and not database.startswith("file:"):
            create_private_file(Path(database))  # 0600 before SQLite creates it (and its WAL, SHM) 0644
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see _sqlite_begin)
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=60000")
            cursor.execute("PRAGMA synchronous=NORMAL")
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
        max_overflow=20,
    )


class Database:
    """The engine plus two session factories: ``read`` (plain BEGIN) and ``write`` (BEGIN IMMEDIATE)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        write_engine = (
            self.engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"}) if self.is_sqlite else self.engine
        )
        self.read = sessionmaker(bind=self.engine, expire_on_commit=False)
        self.write = sessionmaker(bind=write_engine, expire_on_commit=False)

    def session(self, *, write: bool = True) -> Session:
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
    run_migrations(engine, alembic_config(), revision=revision)


@contextmanager
def transaction(db: Database, *, write: bool = True) -> Iterator[Session]:
    """One session, one transaction: commit on success, roll back on error, DB failure -> ``StorageError``."""
    from modeler_service.exceptions import StorageError

    session = db.session(write=write)
    try:
        with session.begin():
            yield session
    except OperationalError as exc:
        raise StorageError(f"the database is unavailable ({type(exc.orig).__name__})") from exc
    except SQLAlchemyError as exc:
        raise StorageError(f"database error ({type(exc).__name__})") from exc
    finally:
        session.close()
