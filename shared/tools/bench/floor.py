"""The floor of one HTTP iteration: the hops it cannot avoid, with nothing of pobo in them (issue 18).

One pobo iteration is a client calling the modeler, which calls the curator over HTTP; the curator
records the answered query durably and answers. This module builds that path bare:

* ``back``: a minimal FastAPI app whose ``POST /query`` runs one SQLite ``INSERT`` in a ``BEGIN IMMEDIATE``
  transaction on the same settings as pobo's engine (``journal_mode=WAL``, ``synchronous=FULL``: the row
  is fsync'd before the answer leaves) and answers JSON with a value;
* ``front``: a minimal FastAPI app whose ``POST /step`` takes a JSON body, calls ``back`` through a
  persistent ``httpx.Client`` and answers the client.

Both are synchronous routes (run in anyio's thread pool, like pobo's) served by real single-process
uvicorn processes on loopback, without access logs. :func:`measure_floor` starts them, warms up, then
times sequential requests of a persistent ``httpx.Client`` and returns p50/p90/mean in milliseconds;
:class:`FloorPath` keeps both apps up for a caller that interleaves floor requests with its own.

Serve one by hand with ``python -m shared.tools.bench.floor back --port P --db PATH`` or
``python -m shared.tools.bench.floor front --port P --back-url URL``.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from pydantic import BaseModel

from shared.processes import ServiceProcess, free_port

__all__ = ["FloorPath", "FloorProcess", "back_app", "front_app", "measure_floor", "open_database", "summary"]

#: The pragmas of ``shared.servicekit.db._sqlite_pragmas`` that decide durability and locking.
PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA busy_timeout=60000")


class Query(BaseModel):
    """The request of either hop."""

    x: int


class Answer(BaseModel):
    """The answer of either hop: the row's id and the value recorded in it."""

    id: int
    y: float


def open_database(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` on pobo's SQLite settings (autocommit driver: we emit BEGIN ourselves),
    with the table of answered queries created."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    for pragma in PRAGMAS:
        conn.execute(pragma)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS answers (id INTEGER PRIMARY KEY, x INTEGER NOT NULL, y REAL NOT NULL)"
    )
    return conn


def back_app(db_path: Path) -> Any:
    """The second hop: ``POST /query {"x": int}`` inserts one row, commits (fsync), answers ``{"id", "y"}``.
    One connection shared by the thread pool, one writer at a time (pobo: ``sqlite_turns``)."""
    from fastapi import FastAPI

    conn = open_database(db_path)
    lock = threading.Lock()  # one writer at a time (pobo: sqlite_turns), one connection for all threads
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/query")
    def query(body: Query) -> Answer:
        y = float(np.sin(body.x))
        with lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                cursor = conn.execute("INSERT INTO answers (x, y) VALUES (?, ?)", (body.x, y))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return Answer(id=int(cursor.lastrowid or 0), y=y)

    return app


def front_app(back_url: str) -> Any:
    """The first hop: ``POST /step {"x": int}`` asks ``back`` (persistent client), answers ``{"id", "y"}``."""
    from fastapi import FastAPI

    http = httpx.Client(base_url=back_url, timeout=60)
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/step")
    def step(body: Query) -> Answer:
        resp = http.post("/query", json={"x": body.x})
        resp.raise_for_status()
        return Answer.model_validate(resp.json())

    return app


class FloorProcess(ServiceProcess):
    """One floor app as a child process (``python -m shared.tools.bench.floor ...``), started,
    health-checked and stopped like a pobo service (``shared.processes.ServiceProcess``)."""

    def __init__(self, args: Sequence[str], *, port: int, log_path: Path) -> None:
        super().__init__(f"floor app {args[0]}", port=port, env={}, log_path=log_path)
        self.args = [*args, "--port", str(port)]

    def command(self) -> list[str]:
        return [sys.executable, "-m", "shared.tools.bench.floor", *self.args]


class FloorPath:
    """The floor's two apps, started (``with FloorPath() as floor:``): :meth:`time_request` times one
    ``POST /step`` of a persistent client; :attr:`rows` counts the rows on disk after the ``with``.

    ``pobo bench service`` keeps one open beside pobo's services and alternates floor requests with pobo's
    iterations, so that both are timed under the same conditions (a shared VM's speed drifts by 2x within
    minutes; a floor timed a few seconds before pobo's iterations was not comparable)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._http: httpx.Client | None = None
        self._db: Path | None = None
        self._sent = 0
        self.rows = 0

    def __enter__(self) -> FloorPath:
        stack = self._stack.__enter__()
        try:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pobo-floor-")))
            self._db = tmp / "floor.sqlite"
            stack.callback(self._count_rows)  # runs after the apps stopped, before the directory goes
            back = FloorProcess(["back", "--db", str(self._db)], port=free_port(), log_path=tmp / "back.log")
            stack.enter_context(back)
            back.wait_healthy()
            front = FloorProcess(
                ["front", "--back-url", back.url], port=free_port(), log_path=tmp / "front.log"
            )
            stack.enter_context(front)
            front.wait_healthy()
            self._http = stack.enter_context(httpx.Client(base_url=front.url, timeout=60))
        except BaseException:
            stack.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._http = None
        self._stack.__exit__(*exc)  # type: ignore[arg-type]

    def _count_rows(self) -> None:
        assert self._db is not None
        with contextlib.closing(sqlite3.connect(self._db)) as conn:
            self.rows = int(conn.execute("SELECT count(*) FROM answers").fetchone()[0])

    def time_request(self) -> float:
        """One ``POST /step`` through both apps (one fsync'd insert); returns its latency in ms."""
        assert self._http is not None, "use FloorPath in a with statement"
        self._sent += 1
        t0 = time.perf_counter()
        resp = self._http.post("/step", json={"x": self._sent})
        elapsed = (time.perf_counter() - t0) * 1e3
        resp.raise_for_status()
        return elapsed


def summary(samples: list[float]) -> dict[str, float]:
    """p50, p90, p95 and mean of ``samples`` (ms)."""
    a = np.asarray(samples)
    return {
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p95": float(np.percentile(a, 95)),
        "mean": float(a.mean()),
    }


def measure_floor(*, requests: int = 300, warmup: int = 30) -> dict[str, Any]:
    """Start ``back`` and ``front``, send ``warmup`` then ``requests`` sequential ``POST /step`` calls;
    returns ``{"p50", "p90", "p95", "mean"}`` (ms, timed requests only), ``requests``, ``rows`` (rows on disk
    afterwards, warm-up included) and ``samples_ms``."""
    with FloorPath() as floor:
        for _ in range(warmup):
            floor.time_request()
        samples = [floor.time_request() for _ in range(requests)]
    return {
        **summary(samples),
        "requests": requests,
        "warmup": warmup,
        "rows": floor.rows,
        "samples_ms": samples,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m shared.tools.bench.floor back|front --port P ...``: serve one floor app with uvicorn."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m shared.tools.bench.floor")
    sub = parser.add_subparsers(dest="app", required=True)
    back = sub.add_parser("back", help="the SQLite hop")
    back.add_argument("--db", type=Path, required=True)
    front = sub.add_parser("front", help="the hop the client calls")
    front.add_argument("--back-url", required=True)
    for p in (back, front):
        p.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    app = back_app(args.db) if args.app == "back" else front_app(args.back_url)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, workers=1)


if __name__ == "__main__":
    main()
