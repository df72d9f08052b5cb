"""Writer turns for SQLite (``servicekit.sqlite_turns``): exclusion across processes, no turn outlives its
transaction, and the services' write transactions stay atomic under concurrent writers."""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, text

from shared.servicekit import sqlite_turns
from shared.servicekit.sqlite_turns import WriterTurns

BEGIN_OPTION = "test_begin"


def _hold_turns(lock_path: str, log_path: str, rounds: int) -> None:
    """In a spawned process: take the turn ``rounds`` times, logging (pid, start, end) of each hold."""
    import os

    turns = WriterTurns(Path(lock_path))
    with open(log_path, "a", encoding="utf-8") as log:
        for _ in range(rounds):
            assert turns.acquire()
            start = time.monotonic()
            time.sleep(0.002)
            end = time.monotonic()
            turns.release()
            log.write(f"{os.getpid()} {start} {end}\n")
            log.flush()


def test_turns_exclude_across_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # as uvicorn starts its workers
    lock, log = tmp_path / "db.writer-lock", tmp_path / "holds.log"
    procs = [ctx.Process(target=_hold_turns, args=(str(lock), str(log), 40)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    holds = sorted(
        (float(start), float(end), pid)
        for pid, start, end in (line.split() for line in log.read_text().splitlines())
    )
    assert len(holds) == 120 and len({pid for _, _, pid in holds}) == 3
    for (_, end, _), (start, _, _) in zip(holds, holds[1:], strict=False):
        assert start >= end  # no two processes ever held a turn at once


def test_a_turn_held_elsewhere_times_out_instead_of_hanging(tmp_path: Path) -> None:
    lock = tmp_path / "db.writer-lock"
    holder = WriterTurns(lock)
    ctx = multiprocessing.get_context("spawn")
    assert holder.acquire()
    try:
        with ctx.Pool(1) as pool:
            got = pool.apply(_try_acquire, (str(lock), 0.2))
        assert got is False
    finally:
        holder.release()
    with ctx.Pool(1) as pool:
        assert pool.apply(_try_acquire, (str(lock), 5.0)) is True


def _try_acquire(lock_path: str, timeout: float) -> bool:
    turns = WriterTurns(Path(lock_path), timeout=timeout)
    got = turns.acquire()
    if got:
        turns.release()
    return got


def _engine(path: Path, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    engine = create_engine(f"sqlite:///{path}", connect_args={"check_same_thread": False, "timeout": 60})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None
        dbapi_connection.execute("PRAGMA journal_mode=WAL")

    turns = WriterTurns.for_database(engine.url.database)
    turns.timeout = timeout
    sqlite_turns.install(engine, event.listen, turns, begin_option=BEGIN_OPTION)
    return engine, engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"}), turns


def test_read_then_write_transactions_stay_atomic(tmp_path: Path) -> None:
    engine, writer, _ = _engine(tmp_path / "t.db")
    with writer.begin() as conn:
        conn.execute(text("CREATE TABLE counter (v INTEGER)"))
        conn.execute(text("INSERT INTO counter VALUES (0)"))

    def bump(_: int) -> None:
        for _ in range(25):
            with writer.begin() as conn:
                v = conn.execute(text("SELECT v FROM counter")).scalar_one()
                conn.execute(text("UPDATE counter SET v = :v"), {"v": v + 1})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(bump, range(8)))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT v FROM counter")).scalar_one() == 200  # no lost update
    assert (tmp_path / "t.db.writer-lock").exists()


@pytest.mark.parametrize("ending", ["error", "invalidate", "close"])
def test_no_turn_outlives_its_transaction(tmp_path: Path, ending: str) -> None:
    """A transaction that ends by an error, an invalidated connection or a closed connection gives its
    turn back: the next writer gets in at once (a leaked turn would block every later write)."""
    _, writer, turns = _engine(tmp_path / "t.db", timeout=2.0)
    with writer.begin() as conn:
        conn.execute(text("CREATE TABLE t (v INTEGER)"))
    if ending == "error":
        with pytest.raises(ZeroDivisionError), writer.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (1)"))
            raise ZeroDivisionError
    elif ending == "invalidate":
        conn = writer.connect()
        trans = conn.begin()
        conn.execute(text("INSERT INTO t VALUES (1)"))
        conn.invalidate()  # the DBAPI connection is closed: SQLite ends its transaction, so must the turn
        assert turns.acquire()
        turns.release()
        trans.rollback()
        conn.close()
    else:
        conn = writer.connect()
        conn.begin()
        conn.execute(text("INSERT INTO t VALUES (1)"))
        conn.close()  # rolled back on return to the pool
    done = threading.Event()

    def write() -> None:
        with writer.begin() as c:
            c.execute(text("INSERT INTO t VALUES (2)"))
        done.set()

    started = time.monotonic()
    threading.Thread(target=write, daemon=True).start()
    assert done.wait(10)
    assert time.monotonic() - started < 1.0  # not after the 2 s turn time-out
    assert turns.acquire()  # and the turn is free again
    turns.release()
