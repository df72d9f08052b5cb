"""More concurrent writers than worker threads: every request completes (``servicekit.write_gate``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

from modeler_service.config import Settings
from tests.modeler_service.conftest import AUTH, make_app, study_body
from tests.modeler_service.fake_curator import FakeCurator

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def four_threads() -> AsyncIterator[None]:
    """The app's worker-thread pool cut to 4 threads, before the app serves its first request."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    saved = limiter.total_tokens
    limiter.total_tokens = 4
    yield
    limiter.total_tokens = saved


async def test_more_concurrent_study_creations_than_threads_all_complete(
    four_threads: None, settings: Settings, curator: FakeCurator
) -> None:
    """Creating a study writes in the request's session, from one thread hop to the commit hop; six times
    as many creations as threads must not leave the one holding the write lock without a thread."""
    app: Any = make_app(settings, curator)
    transport = httpx.ASGITransport(app=app)
    statuses: list[int] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://modeler.test", headers=AUTH) as client:

        async def create(i: int) -> None:
            response = await client.post("/v1/studies", json=study_body(seed=i))
            statuses.append(response.status_code)

        with anyio.fail_after(30):  # a deadlock waits 60 s per writer
            async with anyio.create_task_group() as tg:
                for i in range(24):
                    tg.start_soon(create, i)
        assert statuses == [201] * 24
        listed = (await client.get("/v1/studies")).json()
    app.state.components.ctx.db.dispose()
    assert listed["count"] == 24
