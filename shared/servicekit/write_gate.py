"""Admission of write requests: never more writers in worker threads than the threads can carry.

FastAPI runs a synchronous route in several hops through one pool of worker threads (anyio's, 40 threads
by default): each synchronous dependency, the route itself and the request session's commit are separate
hops. A write transaction is begun in one hop and committed in a later one, so its writer needs a free
thread between hops while it holds the database's write lock (SQLite's, and ``sqlite_turns``' turn; on
PostgreSQL a row lock). Writers waiting for that lock wait *in* a worker thread. Once the waiters fill
the pool, the holder cannot get a thread to commit and nobody moves: a deadlock that lasts until the
waits time out (60 s), after which requests fail with 503. Twenty studies asking the curator at once
(20 queries plus 20 access-log writes) were enough to reach it.

``WriteGate`` admits at most ``limit`` writers (write-method requests, through the app-wide dependency
``admission``, and writes a service starts after a response, such as the curator's access log, through
``WriteGate.run_sync``) into the thread pool at once; the rest wait in the event
loop, where waiting takes no thread. With ``limit`` at most half the pool, at least half of the threads
are always free for the holder's next hop and for readers (who never wait for a writer: WAL on SQLite,
MVCC on PostgreSQL). Admission is first come, first served, as the turns behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio.to_thread
from starlette.requests import Request

__all__ = ["WRITE_METHODS", "WriteGate", "admission"]

T = TypeVar("T")

#: Methods admitted through the gate (the ones served with a write session).
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class WriteGate:
    """A first-come, first-served limit on concurrent writers, per event loop (one per worker process)."""

    def __init__(self, limit: int | None = None) -> None:
        """``limit``: writers admitted at once; default half the event loop's worker-thread pool."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._limit = limit
        self._semaphores: dict[asyncio.AbstractEventLoop, tuple[int, asyncio.Semaphore]] = {}

    def limit(self) -> int:
        """Writers admitted at once in the running event loop."""
        return self._semaphore()[0]

    def _semaphore(self) -> tuple[int, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        entry = self._semaphores.get(loop)
        if entry is None:
            for old in [old for old in self._semaphores if old.is_closed()]:
                del self._semaphores[old]  # test clients start and close loops; a server has one
            threads = int(anyio.to_thread.current_default_thread_limiter().total_tokens)
            limit = self._limit if self._limit is not None else max(1, threads // 2)
            entry = self._semaphores[loop] = (limit, asyncio.Semaphore(limit))
        return entry

    @asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Hold one writer's place for the body of the ``async with``."""
        async with self._semaphore()[1]:
            yield

    async def run_sync(self, func: Callable[..., T], *args: object) -> T:
        """``func(*args)`` in a worker thread, once admitted (a write begun and committed in one hop)."""
        async with self.admitted():
            return await anyio.to_thread.run_sync(func, *args)


def admission(
    gate: WriteGate, methods: Iterable[str] = WRITE_METHODS
) -> Callable[[Request], AsyncIterator[None]]:
    """An app-wide FastAPI dependency (``Depends(admission(gate), scope="function")``): a write-method
    request holds a place in ``gate`` from before its first synchronous hop to after its session's commit.

    A dependency, not a middleware: FastAPI reads the request body before it solves dependencies, so a
    client that sends its body slowly waits without holding a place (a middleware would let a few slow
    clients shut every writer out).
    """
    write_methods = frozenset(methods)

    async def admit_writer(request: Request) -> AsyncIterator[None]:
        if request.method not in write_methods:
            yield
            return
        async with gate.admitted():
            yield

    return admit_writer
