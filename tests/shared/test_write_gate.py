"""``servicekit.write_gate``: writers are admitted first come, first served, never more than the limit, and
only write-method requests are gated."""

from __future__ import annotations

import anyio
import anyio.to_thread
import httpx
import pytest
from fastapi import Depends, FastAPI

from shared.servicekit.write_gate import WriteGate, admission

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_default_limit_is_half_the_thread_pool() -> None:
    limiter = anyio.to_thread.current_default_thread_limiter()
    saved = limiter.total_tokens
    try:
        limiter.total_tokens = 6
        assert WriteGate().limit() == 3
        limiter.total_tokens = 1
        assert WriteGate().limit() == 1
    finally:
        limiter.total_tokens = saved
    assert WriteGate(limit=5).limit() == 5


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        WriteGate(limit=0)


async def test_at_most_limit_writers_at_once_in_arrival_order() -> None:
    gate = WriteGate(limit=2)
    inside = 0
    most = 0
    order: list[int] = []

    async def writer(i: int) -> None:
        nonlocal inside, most
        async with gate.admitted():
            order.append(i)
            inside += 1
            most = max(most, inside)
            await anyio.sleep(0.01)
            inside -= 1

    async with anyio.create_task_group() as tg:
        for i in range(7):
            tg.start_soon(writer, i)
            await anyio.sleep(0)  # each task queues before the next starts
    assert most == 2
    assert order == list(range(7))


async def test_run_sync_runs_the_function_in_a_thread_once_admitted() -> None:
    gate = WriteGate(limit=1)
    async with gate.admitted():
        with anyio.move_on_after(0.05) as waited:
            await gate.run_sync(lambda: None)
        assert waited.cancelled_caught  # the only place is taken: it waits
    assert await gate.run_sync(sum, [1, 2, 3]) == 6


async def test_only_write_methods_wait_for_admission() -> None:
    gate = WriteGate(limit=1)
    app = FastAPI(dependencies=[Depends(admission(gate), scope="function")])

    @app.get("/item")
    def read() -> str:
        return "read"

    @app.post("/item")
    def write() -> str:
        return "written"

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        async with gate.admitted():  # the gate is full
            assert (await client.get("/item")).json() == "read"
            with anyio.move_on_after(0.2) as blocked:
                await client.post("/item")
            assert blocked.cancelled_caught
        assert (await client.post("/item")).json() == "written"
