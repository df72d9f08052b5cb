"""More concurrent writers than worker threads: every request completes (``servicekit.write_gate``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from modeler_service.config import Settings
from tests.conftest import status_codes_at_once
from tests.modeler_service.conftest import AUTH, make_app, study_body
from tests.modeler_service.fake_curator import FakeCurator

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_more_concurrent_study_creations_than_threads_all_complete(
    four_threads: None, settings: Settings, curator: FakeCurator
) -> None:
    """Creating a study writes in the request's session, from one thread hop to the commit hop; six times
    as many creations as threads must not leave the one holding the write lock without a thread."""
    app: Any = make_app(settings, curator)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://modeler.test", headers=AUTH) as client:
        statuses = await status_codes_at_once(
            24, lambda i: client.post("/v1/studies", json=study_body(seed=i))
        )
        assert statuses == [201] * 24
        listed = (await client.get("/v1/studies")).json()
    app.state.components.ctx.db.dispose()
    assert listed["count"] == 24
