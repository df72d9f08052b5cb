"""Issue 12, item 3, modeler side: request bodies take strict JSON types (see
tests/curator_service/test_strict_types.py for the curator)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.modeler_service.conftest import study_body


@pytest.mark.parametrize(
    "overrides",
    [
        {"iterations": "5"},
        {"iterations": True},
        {"release_id": "1"},
        {"initial_points": 1.0},
        {"delta_prime": "0.05"},
        {"hyperparameters": {"lengthscale": "1", "signal_variance": 1.0, "noise_variance": 1e-4}},
        {"exclude_queried": "yes"},
        {"seed": 7.0},
    ],
)
def test_modeler_study_body_is_strict(client: TestClient, overrides: dict[str, Any]) -> None:
    r = client.post("/v1/studies", json=study_body(**overrides))
    assert r.status_code == 422, r.text


def test_modeler_run_body_is_strict(client: TestClient) -> None:
    study = client.post("/v1/studies", json=study_body()).json()
    for iterations in (True, "2", 2.0):
        r = client.post(f"/v1/studies/{study['id']}/run", json={"iterations": iterations})
        assert r.status_code == 422, r.text
    assert client.get(f"/v1/studies/{study['id']}").json()["status"] == "ready"


def test_a_validation_error_has_the_curators_shape(client: TestClient) -> None:
    """Issue 12, item 8: one documented 422 body for both services: a message plus the field errors, and
    never the rejected input (which may be a token)."""
    r = client.post("/v1/studies", json=study_body(iterations="5", curator_token="secret-token-value"))
    assert r.status_code == 422
    body = r.json()
    assert body["detail"] == "invalid request: body field 'iterations': Input should be a valid integer"
    assert body["errors"] == [
        {"loc": ["body", "iterations"], "msg": "Input should be a valid integer", "type": "int_type"}
    ]
    assert "secret-token-value" not in r.text
    schema = client.get("/openapi.json").json()["components"]["schemas"]["HTTPValidationError"]
    assert schema["properties"]["detail"]["type"] == "string" and "errors" in schema["properties"]
