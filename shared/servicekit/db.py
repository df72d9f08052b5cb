"""The database engine, session factories and transaction scopes of both services, with one policy.

Both services store little but must not lose what they stored, so both run on the same settings:

SQLite (the embedded default)
    * ``journal_mode=WAL``: readers never wait for the writer, the writer never waits for readers.
    * ``synchronous=FULL``: every commit is fsync'd before it returns. The curator must have an answered
      query (and the budget it spent) on disk before the answer leaves, or a power cut could let the
      same question be answered twice with fresh noise. The modeler uses the same level: its writes are a
      handful per curator round trip (network-bound), so the fsync costs nothing a user could notice,
      and its write-ahead intent and audit log then survive a power cut as well as a process crash. One
      level for both means one thing to reason about; there is no knob.
    * Transactions are begun by us (the driver's implicit BEGIN is off): a write session emits ``BEGIN
      IMMEDIATE``, which takes the write lock at the first statement, so a read-then-write transaction
      (the privacy ledger's check-and-spend, a study's claim) cannot interleave with another writer nor
      fail half-way with "database is locked". Writers take turns (``sqlite_turns``), across threads and
      across uvicorn worker processes.
    * ``busy_timeout`` 60 s (and the driver's ``timeout``): a writer waits its turn rather than fail.
    * ``foreign_keys=ON``.
    * The database file is created 0600 before SQLite opens it (its -wal and -shm files take its mode).

Both backends
    * ``pool_size=10``, ``max_overflow=30``: at most 40 connections per process, the size of the thread
      pool that runs the services' synchronous routes (anyio's default): a burst of requests never waits
      for a connection, and no more are opened than threads could use. On PostgreSQL, allow for 40 per
      worker process of each service in ``max_connections``.

PostgreSQL only
    * ``pool_pre_ping``: a connection dropped while the database server was away is replaced at checkout,
      so the services recover by themselves once it is back. SQLite has no server and a file connection
      cannot be dropped, so it does without the ping (one statement less per transaction).
    * ``connect_timeout=5`` and ``pool_timeout=10``: while the database is down a request fails fast (the
      services answer 503) instead of hanging. Row locks (``SELECT ... FOR UPDATE``) do what ``BEGIN
      IMMEDIATE`` does on SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from shared.servicekit import sqlite_turns
from shared.servicekit.migrations import Migrations
from shared.servicekit.serving import create_private_file

__all__ = [
    "READ_METHODS",
    "Database",
    "ErrorFactory",
    "make_engine",
    "request_session",
    "storage_error",
    "transaction",
]

#: Execution option carrying the BEGIN mode of a SQLite connection (see ``sqlite_turns.install``).
_BEGIN_OPTION = "pobo_sqlite_begin"
#: Pool sizes and time-outs of the module docstring.
POOL_SIZE = 10
MAX_OVERFLOW = 30
SQLITE_BUSY_SECONDS = 60
PG_CONNECT_TIMEOUT_SECONDS = 5
PG_POOL_TIMEOUT_SECONDS = 10

#: HTTP methods served with a read session; every other method gets a write session.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: Builds the service's own error (e.g. the modeler's ``StorageError``) from a message.
ErrorFactory = Callable[[str], Exception]


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # BEGIN is emitted by sqlite_turns, not by the driver
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_SECONDS * 1000}")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for ``url`` (SQLite or PostgreSQL) set up as the module docstring says."""
    if not url.startswith("sqlite"):
        return create_engine(
            url,
            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS},
            pool_timeout=PG_POOL_TIMEOUT_SECONDS,
            pool_pre_ping=True,
            pool_size=POOL_SIZE,
            max_overflow=MAX_OVERFLOW,
        )
    database = make_url(url).database
    if database and database != ":memory:" and not database.startswith("file:"):
        create_private_file(Path(database))  # 0600 before SQLite creates it (and its WAL, SHM) 0644
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_SECONDS},
        pool_size=POOL_SIZE,
        max_overflow=MAX_OVERFLOW,
    )
    event.listen(engine, "connect", _sqlite_pragmas)
    turns = sqlite_turns.WriterTurns.for_database(engine.url.database)
    sqlite_turns.install(engine, event.listen, turns, begin_option=_BEGIN_OPTION)
    return engine


class Database:
    """The engine plus two session factories: ``read`` (plain BEGIN) and ``write`` (SQLite: BEGIN
    IMMEDIATE). A service subclasses it to name its ``migrations``."""

    #: The service's alembic environment (``migrate`` runs it to head).
    migrations: ClassVar[Migrations | None] = None

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        write_engine = (
            self.engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"}) if self.is_sqlite else self.engine
        )
        self.write_engine = write_engine
        # expire_on_commit=False: attributes stay readable after a commit without opening a transaction
        # again (which, for a write session on SQLite, would take the write lock again).
        self.read = sessionmaker(bind=self.engine, expire_on_commit=False)
        self.write = sessionmaker(bind=write_engine, expire_on_commit=False)

    def session(self, *, write: bool = True) -> Session:
        return (self.write if write else self.read)()

    @contextmanager
    def driver_transaction(self) -> Iterator[Any]:
        """A write transaction (begun, committed or rolled back by SQLAlchemy, as a write session's: on
        SQLite ``BEGIN IMMEDIATE`` in the writer's turn) whose statements the caller runs on the yielded
        DB-API cursor (``driver_sql.DriverStatement``). Commits when the block ends, rolls back if it
        raises."""
        with self.write_engine.connect() as conn, conn.begin():
            dbapi_connection = conn.connection.dbapi_connection
            assert dbapi_connection is not None
            cursor = dbapi_connection.cursor()
            try:
                yield cursor
            finally:
                cursor.close()

    @staticmethod
    @contextmanager
    def session_cursor(session: Session) -> Iterator[Any]:
        """The DB-API cursor of ``session``'s own transaction (pending ORM changes flushed first), so that a
        use case reading through the ORM writes with the same ``driver_sql`` statements as its fast path,
        in the same transaction. The ORM objects it loaded are not refreshed by what the cursor writes."""
        session.flush()
        dbapi_connection = session.connection().connection.dbapi_connection
        assert dbapi_connection is not None
        cursor = dbapi_connection.cursor()
        try:
            yield cursor
        finally:
            cursor.close()

    def ping(self) -> bool:
        """Whether the database answers ``SELECT 1`` (for ``/healthz``)."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001 - any failure means "unreachable"
            return False

    def migrate(self) -> None:
        """Upgrade the schema to head (idempotent; run at every start-up)."""
        if self.migrations is None:
            raise RuntimeError(f"{type(self).__name__} names no migrations")
        self.migrations.upgrade(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()


def storage_error(exc: SQLAlchemyError, error: ErrorFactory) -> Exception:
    """The service's error for a failed database call; names the failure's type, never its SQL or data."""
    if isinstance(exc, OperationalError):
        return error(f"the database is unavailable ({type(exc.orig).__name__})")
    return error(f"database error ({type(exc).__name__})")


def request_session(db: Database, *, write: bool, error: ErrorFactory | None = None) -> Iterator[Session]:
    """One session, one transaction: yields the session, commits afterwards, rolls back on any error.

    A generator, for FastAPI dependencies (``yield from``) and for :func:`transaction`. On rollback the
    callbacks a use case put in ``session.info["on_rollback"]`` run (e.g. deleting files written for the
    transaction). With ``error``, a database failure is raised as ``error(message)`` instead.
    """
    session = db.session(write=write)
    try:
        yield session
        session.commit()
    except BaseException as exc:
        session.rollback()
        for callback in session.info.pop("on_rollback", []):
            callback()
        if error is not None and isinstance(exc, SQLAlchemyError):
            raise storage_error(exc, error) from exc
        raise
    finally:
        session.info.pop("on_rollback", None)
        session.close()


@contextmanager
def transaction(db: Database, *, write: bool = True, error: ErrorFactory | None = None) -> Iterator[Session]:
    """``with transaction(db) as session:`` -- :func:`request_session` as a context manager."""
    yield from request_session(db, write=write, error=error)
