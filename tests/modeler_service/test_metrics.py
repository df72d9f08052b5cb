"""GET /metrics of the modeler: the modeler token or the metrics_token setting (401 otherwise), requests by
route template and status (the step's fast lane too), studies by status, rounds closed, failed sign-ins."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from modeler_service.config import Settings
from tests.modeler_service.conftest import AUTH, make_app, study_body
from tests.modeler_service.fake_curator import FakeCurator

METRICS_TOKEN = "modeler-metrics-token-0123456789abcdef"
STEP = "/v1/studies/{study_id}/step"


def scrape(client: TestClient, headers: dict[str, str] = AUTH) -> dict[Any, float]:
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_who_reads_the_metrics(settings: Settings, curator: FakeCurator) -> None:
    app = make_app(
        settings.model_copy(update={"metrics_token": SecretStr(METRICS_TOKEN)}),
        curator,
    )
    with TestClient(app) as client:
        for headers in ({}, {"Authorization": "Bearer nope"}):
            r = client.get("/metrics", headers=headers)
            assert r.status_code == 401
            assert r.json()["detail"] == (
                "GET /metrics needs the modeler token or the metrics token (Authorization: Bearer)"
            )
        scrape(client)
        scrape(client, {"Authorization": f"Bearer {METRICS_TOKEN}"})
        assert (
            client.get("/v1/studies", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).status_code == 401
        )


def test_series_move_with_the_studies(client: TestClient) -> None:
    before = scrape(client)
    assert before[("pobo_modeler_studies", (("status", "ready"),))] == 0
    assert before[("pobo_modeler_rounds_closed_total", (("kind", "study"),))] == 0
    assert before[("pobo_modeler_rounds_closed_total", (("kind", "federation"),))] == 0
    study = client.post("/v1/studies", json=study_body()).json()
    assert scrape(client)[("pobo_modeler_studies", (("status", "ready"),))] == 1
    for _ in range(2):
        assert client.post(f"/v1/studies/{study['id']}/step").status_code == 200
    assert client.get("/v1/studies", headers={"Authorization": "Bearer wrong"}).status_code == 401

    after = scrape(client)
    assert after[("pobo_modeler_studies", (("status", "ready"),))] == 1
    assert after[("pobo_modeler_studies", (("status", "failed"),))] == 0
    assert after[("pobo_modeler_rounds_closed_total", (("kind", "study"),))] == 2
    key = ("pobo_http_requests_total", (("method", "POST"), ("route", STEP), ("status", "200")))
    assert after[key] == 2
    created = ("pobo_http_requests_total", (("method", "POST"), ("route", "/v1/studies"), ("status", "201")))
    assert after[created] == 1
    assert after[("pobo_http_request_duration_seconds_count", (("method", "POST"), ("route", STEP)))] == 2
    assert after[("pobo_auth_failures_total", ())] == before[("pobo_auth_failures_total", ())] + 1
