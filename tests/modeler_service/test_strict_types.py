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
