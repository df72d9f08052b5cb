"""Fair turns for SQLite writers, within a process and across worker processes.

SQLite allows one writer at a time. A connection that finds the write lock taken sleeps and retries (1, 2,
5, ... then every 100 ms), so under load a writer that has waited long keeps losing to new arrivals
(seconds of tail latency), and the lock sits idle while the waiters sleep. ``WriterTurns`` queues the
writers instead: the threads of a process on a ``threading.Lock``, the processes (uvicorn workers) on an
``flock`` of a file beside the database. A turn is held from ``BEGIN IMMEDIATE`` to the commit or
rollback -- the very span SQLite holds its own write lock -- so it never makes anyone wait longer than
SQLite would; it only hands the lock over as soon as it is free.

``install`` wires it into an engine through the caller's ``sqlalchemy.event.listen`` (``shared`` does not
import SQLAlchemy itself).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HOLDS_TURN = "pobo_holds_write_turn"


class WriterTurns:
    """One writer at a time: a thread lock, plus an ``flock`` on ``lock_path`` shared by processes."""

    def __init__(
        self, lock_path: Path | None, *, timeout: float = 60.0, poll_seconds: float = 0.0005
    ) -> None:
        self.lock_path = lock_path
        self.timeout = timeout
        self.poll_seconds = poll_seconds
        self._thread_lock = threading.Lock()
        self._fd: int | None = None
        self._pid = -1

    @classmethod
    def for_database(cls, database: str | None) -> WriterTurns:
        """Turns for the SQLite file ``database`` (``engine.url.database``): the lock file sits beside it.
        In-memory databases get thread turns only."""
        if not database or database == ":memory:" or database.startswith("file::memory:"):
            return cls(None)
        return cls(Path(database).with_name(Path(database).name + ".writer-lock"))

    def _file(self) -> int | None:
        if self.lock_path is None:
            return None
        if self._pid != os.getpid():  # opened in this process: an inherited descriptor would not exclude
            self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
        return self._fd

    def acquire(self) -> bool:
        """Wait for the turn (at most ``timeout`` s); False on time-out (then SQLite's own wait decides)."""
        deadline = time.monotonic() + self.timeout
        if not self._thread_lock.acquire(timeout=self.timeout):
            return False
        try:
            fd = self._file()
            while fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        self._thread_lock.release()
                        return False
                    time.sleep(self.poll_seconds)
        except BaseException:
            self._thread_lock.release()
            raise
        return True

    def release(self) -> None:
        try:
            if self._fd is not None and self._pid == os.getpid():
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()


def install(engine: Any, listen: Callable[..., None], turns: WriterTurns, *, begin_option: str) -> None:
    """Emit ``BEGIN <mode>`` ourselves (mode from the execution option ``begin_option``, default
    DEFERRED) and take a turn around every ``BEGIN IMMEDIATE`` transaction of ``engine``."""

    def begin(conn: Any) -> None:
        mode = conn.get_execution_options().get(begin_option, "DEFERRED")
        if mode == "IMMEDIATE" and turns.acquire():
            conn.info[_HOLDS_TURN] = True
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                end_turn(conn.info)
                raise
            return
        conn.exec_driver_sql(f"BEGIN {mode}")

    def end_turn(info: dict[str, Any]) -> None:
        if info.pop(_HOLDS_TURN, False):
            turns.release()

    def end_of_connection(connection_record: Any) -> None:
        if connection_record is not None:
            end_turn(connection_record.info)

    # (the pool's listeners take their documented arguments: SQLAlchemy inspects the signature)
    def reset(dbapi_connection: Any, connection_record: Any, reset_state: Any) -> None:
        end_of_connection(connection_record)

    def invalidate(dbapi_connection: Any, connection_record: Any, exception: Any) -> None:
        end_of_connection(connection_record)

    def checkin(dbapi_connection: Any, connection_record: Any) -> None:
        end_of_connection(connection_record)

    def end_of_transaction(conn: Any) -> None:
        if not conn.invalidated:  # (``info`` of an invalidated connection would try to reconnect; its
            end_turn(conn.info)  # turn ended with the invalidation)

    listen(engine, "begin", begin)
    listen(engine, "commit", end_of_transaction)
    listen(engine, "rollback", end_of_transaction)
    # A connection that leaves mid-transaction (reset on return, invalidated, checked in, closed) ends
    # its turn too, so that a turn can never outlive the SQLite transaction it stands for.
    listen(engine, "reset", reset)
    listen(engine, "invalidate", invalidate)
    listen(engine, "checkin", checkin)
    listen(engine, "close", checkin)
