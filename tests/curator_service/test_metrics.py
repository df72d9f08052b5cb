"""GET /metrics of the curator: who may read it (the admin token or the metrics_token setting, 401
otherwise), and series that move with the requests: requests by route template and status (the fast lane's
too), latency histograms, queries answered, budget spent and left per population, failed sign-ins."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from curator_service.config import Settings
from curator_service.main import create_app
from tests.curator_service.conftest import ADMIN, ADMIN_TOKEN, World, bearer

pytestmark = pytest.mark.anyio

METRICS_TOKEN = "metrics-scraper-token-0123456789abcdef0123"
QUERIES = "/v1/releases/{release_id}/queries"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(client: httpx.AsyncClient, headers: dict[str, str] = ADMIN) -> dict[Any, float]:
    r = await client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return samples(r.text)


def requests(s: dict[Any, float], method: str, route: str, status: int) -> float:
    key = ("pobo_http_requests_total", (("method", method), ("route", route), ("status", str(status))))
    return s.get(key, 0.0)


async def test_only_the_admin_or_the_metrics_token_reads_the_metrics(world: World) -> None:
    client = world.client
    for headers in (
        {},
        world.partner_headers,
        bearer("not-a-token"),
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
    ):
        r = await client.get("/metrics", headers=headers)
        assert r.status_code == 401
        assert r.json() == {
            "detail": "GET /metrics needs the admin token or the metrics token (Authorization: Bearer)"
        }
    await scrape(client)


async def test_the_metrics_token_setting(settings: Settings) -> None:
    app = create_app(
        Settings(
            database_url=settings.database_url,
            data_dir=settings.data_dir,
            admin_token=ADMIN_TOKEN,
            metrics_token=METRICS_TOKEN,
        )
    )
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://curator.test") as client:
            await scrape(client, bearer(METRICS_TOKEN))
            await scrape(client, ADMIN)
            assert (await client.get("/v1/datasets", headers=bearer(METRICS_TOKEN))).status_code == 401
    finally:
        app.state.components.db.dispose()
    with pytest.raises(ValidationError, match="the metrics_token setting has 5 characters"):
        Settings(metrics_token="short")


async def test_series_move_with_the_requests(world: World) -> None:
    client, rid, pop = world.client, world.release["id"], str(world.dataset["population_id"])
    before = await scrape(client)
    assert before[("pobo_curator_queries_answered_total", ())] == 0
    assert before[("pobo_curator_budget_epsilon_spent", (("population", pop),))] == pytest.approx(1.0)
    assert before[("pobo_curator_budget_epsilon_left", (("population", pop),))] == pytest.approx(4.0)
    for i in range(2):  # the fast lane answers these
        r = await client.post(f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": i})
        assert r.status_code == 201
    bad = await client.post(
        f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": 10**6}
    )
    assert bad.status_code == 422
    assert (await client.get("/v1/partners/me", headers=bearer("pobo_p_" + "A" * 43))).status_code == 401
    assert (await client.get("/v1/no-such-thing", headers=ADMIN)).status_code == 404
    r = await client.post(
        f"/v1/datasets/{world.dataset['id']}/releases", headers=ADMIN, json={"epsilon": 0.5, "delta": 1e-6}
    )
    assert r.status_code == 201

    after = await scrape(client)
    assert after[("pobo_curator_queries_answered_total", ())] == 2
    assert requests(after, "POST", QUERIES, 201) - requests(before, "POST", QUERIES, 201) == 2
    assert requests(after, "POST", QUERIES, 422) == 1
    assert requests(after, "GET", "/v1/partners/me", 401) == 1
    assert requests(after, "GET", "unmatched", 404) == 1
    assert requests(after, "GET", "/metrics", 200) == requests(before, "GET", "/metrics", 200) + 1
    latency = ("pobo_http_request_duration_seconds_count", (("method", "POST"), ("route", QUERIES)))
    assert after[latency] == 3
    assert after[("pobo_auth_failures_total", ())] == before[("pobo_auth_failures_total", ())] + 1
    assert after[("pobo_curator_budget_epsilon_spent", (("population", pop),))] == pytest.approx(1.5)
    assert after[("pobo_curator_budget_epsilon_left", (("population", pop),))] == pytest.approx(3.5)
    assert after[("pobo_curator_budget_delta_spent", (("population", pop),))] == pytest.approx(1e-5 + 1e-6)
    # no id ever becomes a label: routes are templates
    routes = {dict(labels)["route"] for _, labels in after if "route" in dict(labels)}
    assert QUERIES in routes and not [r for r in routes if re.search(r"/[0-9]+(/|$)", r)]
