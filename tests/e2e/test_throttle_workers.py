"""The failed-token throttle of a service with 2 uvicorn workers holds for the service as a whole: bad
tokens sent over fresh connections (which the workers share between them) lock the client out at the same
count as with one process (issue 5, item 6)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import SQLITE_ONLY, Services

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # see SQLITE_ONLY in conftest
LIMIT = 10  # AUTH_MAX_FAILURES, default


@pytest.fixture
def workers() -> int:
    return 2


def test_bad_tokens_on_any_worker_count_towards_one_limit(services: Services) -> None:
    for svc, token, path in (
        (services.curator, services.admin_token, "/v1/datasets"),
        (services.modeler, services.modeler_token, "/v1/studies"),
    ):
        codes = []
        for i in range(LIMIT):
            with httpx.Client(timeout=30) as fresh:  # a new connection: any worker may take it
                codes.append(fresh.get(f"{svc.url}{path}", headers={"Authorization": f"Bearer bad-{i}"}))
        assert [r.status_code for r in codes] == [401] * LIMIT
        for i in range(4):  # whichever worker answers: locked for any further guess ...
            with httpx.Client(timeout=30) as fresh:
                locked = fresh.get(f"{svc.url}{path}", headers={"Authorization": f"Bearer worse-{i}"})
                operator = fresh.get(f"{svc.url}{path}", headers={"Authorization": f"Bearer {token}"})
            assert locked.status_code == 429, (svc.kind, locked.text)
            assert int(locked.headers["retry-after"]) > 0
            assert operator.status_code == 200, (svc.kind, operator.text)  # ... but not for the operator
