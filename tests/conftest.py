"""Suite-wide ordering for ``make test``, which runs the suite in two pytest-xdist workers, a file at a time
per worker (``--dist loadfile``: a module's shared fixtures and started services stay in one process).

The files known to take longest are collected first, so that the two workers start on them and finish
together, instead of one worker taking a long file last while the other idles.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest

#: The longest files (measured with --durations on two workers: tens of seconds to minutes each), longest
#: first.
LONG_FILES = (
    "tests/e2e/test_restart.py",
    "tests/e2e/test_crash_curator.py",
    "tests/e2e/test_concurrency.py",
    "tests/shared/test_bench_gibo.py",
    "tests/fuzz/test_fuzz_curator.py",
    "tests/e2e/test_console.py",
    "tests/shared/test_bench.py",
    "tests/modeler_service/test_fuzz_modeler.py",
    "tests/e2e/test_manual_workers.py",
    "tests/e2e/test_federation.py",
    "tests/shared/test_audit.py",
    "tests/modeler_service/test_federations.py",
    "tests/e2e/test_gibo.py",
    "tests/e2e/test_strategies.py",
    "tests/curator_service/test_server.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: k for k, path in enumerate(LONG_FILES)}

    def key(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(LONG_FILES))

    items.sort(key=key)  # (a stable sort: the order within a file, and of the other files, is kept)


@pytest.fixture
async def four_threads() -> AsyncIterator[None]:
    """The event loop's worker-thread pool cut to 4 threads (ask for it before the app serves a request):
    for tests of what happens when more requests write at once than there are threads."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    saved = limiter.total_tokens
    limiter.total_tokens = 4
    yield
    limiter.total_tokens = saved


async def status_codes_at_once(count: int, request: Callable[[int], Awaitable[object]]) -> list[int]:
    """Start ``request(0)`` .. ``request(count - 1)`` at once and return their responses' status codes
    (failing after 30 s: a writers' deadlock would wait out 60 s lock time-outs)."""
    statuses: list[int] = []

    async def one(i: int) -> None:
        response = await request(i)
        statuses.append(int(response.status_code))  # type: ignore[attr-defined]

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(count):
                tg.start_soon(one, i)
    return statuses


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A client of a local Dask cluster of two worker processes (``shared.distributed.connect(None)``: TLS
    with in-memory certificates, one BLAS thread per worker, no spilling), shared by the tests of one module
    (a cluster takes seconds to start; closed after the module, since its idle workers' heartbeats and
    profilers take CPU from the rest of the suite); a test that kills a worker leaves it to its nanny."""
    pytest.importorskip("distributed", reason="the dask extra (pobo[dask]) is part of pobo[test]")
    from shared.distributed.cluster import connect

    client = connect(None, n_workers=2)
    try:
        yield client
    finally:
        client.close()
