"""Two plain-ASGI guards both services put in front of their apps (no FastAPI/Starlette import here).

* :class:`BodyLimit` — refuses a request body larger than a limit with 413, before the body is read when
  ``Content-Length`` announces it and while streaming otherwise (chunked bodies). Paths with their own
  limit (the curator's CSV upload) are exempt.
* :class:`AuthThrottle` — a client (by peer address) whose requests *carrying a token* were answered
  401 ``max_failures`` times within ``window_seconds`` gets 429 with ``Retry-After`` on every
  authenticated request until the window has passed, *even with a correct partner token*: a
  token-guessing client learns nothing while locked. The one exception is the service's own operator
  token (the curator's admin token, the modeler's token; ``exempt``): someone else behind the same address
  (a NAT, a proxy) must not be able to lock the operator out by sending bad tokens. That opens no
  guessing channel worth having: the operator token is compared in constant time against one hash, and
  the services refuse an operator token shorter than 24 characters (generated ones carry 256 bits).
  The failures are counted in memory (one process) or, with several uvicorn workers, in a small SQLite
  file the workers share (:class:`SharedFailureLog`), so the limit holds for the service as a whole.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from pathlib import Path
from typing import Any, Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

__all__ = [
    "AuthThrottle",
    "BodyLimit",
    "FailureLog",
    "MemoryFailureLog",
    "SharedFailureLog",
    "failure_log",
]

logger = logging.getLogger("pobo.guards")


async def _send_json(send: Send, status: int, detail: str, headers: Iterable[tuple[str, str]] = ()) -> None:
    body = json.dumps({"detail": detail}).encode("utf-8")
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """413 for a request body over ``max_bytes`` (paths in ``exempt`` have their own limit)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, exempt: Iterable[str] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = {p.rstrip("/") for p in exempt}

    def _message(self) -> str:
        return (
            f"request body too large: the limit is {self.max_bytes} bytes "
            "(setting max_json_bytes); send a smaller body"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") in self.exempt:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    announced = int(value)
                except ValueError:
                    await _send_json(send, 400, "invalid Content-Length header")
                    return
                if announced > self.max_bytes:
                    await _send_json(send, 413, self._message())
                    return
        seen = 0
        started = False
        refused = False

        async def counting_receive() -> Message:
            # Past the limit: answer 413 ourselves and tell the app the client went away; whatever the
            # app answers after that is dropped (frameworks would turn a raised error into a 400).
            nonlocal seen, refused, started
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    if not started:
                        started = True
                        await _send_json(send, 413, self._message())
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, counting_receive, tracking_send)


class FailureLog(Protocol):
    """Where :class:`AuthThrottle` counts failed-token answers per client."""

    def locked_for(self, client: str, now: float) -> float:
        """Seconds the client stays locked (0: not locked)."""

    def record(self, client: str, now: float) -> None:
        """One more failed-token answer for ``client`` at time ``now``."""


class MemoryFailureLog:
    """Failures in this process's memory (one process, or a limit per worker)."""

    def __init__(self, *, max_failures: int, window_seconds: float) -> None:
        self.max_failures = max_failures
        self.window = window_seconds
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def locked_for(self, client: str, now: float) -> float:
        with self._lock:  # (forgets failures older than the window)
            q = self._failures.get(client)
            if not q:
                return 0.0
            while q and q[0] <= now - self.window:
                q.popleft()
            if not q:
                del self._failures[client]
                return 0.0
            if len(q) >= self.max_failures:
                return q[-1] + self.window - now
            return 0.0

    def record(self, client: str, now: float) -> None:
        with self._lock:
            if len(self._failures) > 100_000:  # bounded memory under a flood of distinct addresses
                self._failures.clear()
            q = self._failures.setdefault(client, deque(maxlen=self.max_failures))
            q.append(now)


class SharedFailureLog:
    """Failures in a SQLite file shared by the worker processes of one service (times: wall clock).

    Reads never wait for writers (WAL); a write is one small insert, not fsync'd (a throttle need not
    survive a crash; the service deletes the file at start-up). Should the file fail, the throttle goes
    on counting in this process's memory rather than let a guessing client through unthrottled.
    """

    def __init__(self, path: Path, *, max_failures: int, window_seconds: float) -> None:
        self.path = path
        self.max_failures = max_failures
        self.window = window_seconds
        self._fallback = MemoryFailureLog(max_failures=max_failures, window_seconds=window_seconds)
        self._local = threading.local()
        self._failed = False

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            if not self.path.exists():  # 0600, like every file of the data dir
                with contextlib.suppress(FileExistsError):
                    os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            conn = sqlite3.connect(self.path, timeout=2.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute("CREATE TABLE IF NOT EXISTS failures (client TEXT NOT NULL, at REAL NOT NULL)")
            conn.execute("CREATE INDEX IF NOT EXISTS failures_client_at ON failures (client, at)")
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _give_up(self, exc: sqlite3.Error | OSError) -> None:
        if not self._failed:
            self._failed = True
            logger.warning(
                "the shared failed-token log %s failed (%s); counting per worker process from now on",
                self.path.name,
                type(exc).__name__,
            )

    def locked_for(self, client: str, now: float) -> float:
        if self._failed:
            return self._fallback.locked_for(client, now)
        try:
            count, last = (
                self._conn()
                .execute(
                    "SELECT count(*), max(at) FROM failures WHERE client = ? AND at > ?",
                    (client, now - self.window),
                )
                .fetchone()
            )
        except (sqlite3.Error, OSError) as exc:
            self._give_up(exc)
            return self._fallback.locked_for(client, now)
        return float(last) + self.window - now if count >= self.max_failures else 0.0

    def record(self, client: str, now: float) -> None:
        self._fallback.record(client, now)  # kept in step, for the case the file fails later
        if self._failed:
            return
        try:
            conn = self._conn()
            conn.execute("INSERT INTO failures (client, at) VALUES (?, ?)", (client, now))
            conn.execute("DELETE FROM failures WHERE at <= ?", (now - self.window,))  # bounded size
        except (sqlite3.Error, OSError) as exc:
            self._give_up(exc)


def failure_log(
    *, max_failures: int, window_seconds: float, shared_file: Path | None
) -> tuple[FailureLog, Callable[[], float]]:
    """The failed-token log of a service and the clock it counts with: the SQLite file its workers share
    (wall clock) or this process's memory (monotonic clock)."""
    if shared_file is not None:
        log = SharedFailureLog(shared_file, max_failures=max_failures, window_seconds=window_seconds)
        return log, time.time
    return MemoryFailureLog(max_failures=max_failures, window_seconds=window_seconds), time.monotonic


def _bearer_token(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


class AuthThrottle:
    """429 for a client after ``max_failures`` 401 answers within ``window_seconds`` (see module doc).

    ``shared_file``: count in that SQLite file, shared by the service's worker processes (wall clock);
    otherwise in memory (``clock``, monotonic by default). ``failures``: count in this log instead (made by
    :func:`failure_log`, so that the console's sign-in form counts in the same one). ``exempt(token)`` is
    true for the operator token, which is served even while its address is locked.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_failures: int,
        window_seconds: float,
        clock: Callable[[], float] | None = None,
        shared_file: Path | None = None,
        exempt: Callable[[str], bool] | None = None,
        failures: FailureLog | None = None,
    ) -> None:
        self.app = app
        self.max_failures = max_failures
        self.exempt = exempt
        self.failures: FailureLog
        if failures is not None:  # a log the caller shares with other sign-in paths (the console's)
            self.clock = clock or (time.time if shared_file is not None else time.monotonic)
            self.failures = failures
        elif shared_file is not None:
            self.clock = clock or time.time
            self.failures = SharedFailureLog(
                shared_file, max_failures=max_failures, window_seconds=window_seconds
            )
        else:
            self.clock = clock or time.monotonic
            self.failures = MemoryFailureLog(max_failures=max_failures, window_seconds=window_seconds)

    @staticmethod
    def _client(scope: Scope) -> str:
        client = scope.get("client")
        return str(client[0]) if client else "unknown"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.max_failures <= 0:
            await self.app(scope, receive, send)
            return
        has_auth = any(name == b"authorization" for name, _ in scope.get("headers", []))
        client = self._client(scope)
        if has_auth:
            wait = self.failures.locked_for(client, self.clock())
            if wait > 0 and not (self.exempt is not None and self.exempt(_bearer_token(scope))):
                await _send_json(
                    send,
                    429,
                    f"too many requests with an invalid token from this address; try again in "
                    f"{math.ceil(wait)} s",
                    [("retry-after", str(math.ceil(wait)))],
                )
                return

        async def watching_send(message: Message) -> None:
            if has_auth and message["type"] == "http.response.start" and message["status"] == 401:
                self.failures.record(client, self.clock())
            await send(message)

        await self.app(scope, receive, watching_send)
