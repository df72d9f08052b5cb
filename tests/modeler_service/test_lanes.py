"""The modeler's fast lane (``api/lanes.py``): a study's step with the modeler token is run before FastAPI
routes it, with the route's answers (its JSON, its errors); any other token gets the route's 401."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from modeler_service.api.routes import studies as study_routes
from shared.servicekit.lanes import bypassed
from tests.modeler_service.conftest import AUTH, study_body


class RouteCalls:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        original = study_routes.step_json

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.n += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(study_routes, "step_json", counted)


def _study(client: TestClient, **overrides: Any) -> str:
    response = client.post("/v1/studies", json=study_body(**overrides))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def test_the_lane_steps_as_the_route_does(
    client: TestClient, app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = RouteCalls(monkeypatch)
    sid = _study(client, iterations=3)
    fast = client.post(f"/v1/studies/{sid}/step")
    assert fast.status_code == 200 and calls.n == 0
    with bypassed(app):
        routed = client.post(f"/v1/studies/{sid}/step")
    assert routed.status_code == 200 and calls.n == 1
    a, b = fast.json(), routed.json()
    assert set(a) == set(b) and (a["iteration"], b["iteration"]) == (1, 2)
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    audit = client.get(f"/v1/studies/{sid}/audit").json()["entries"]
    assert [e["index"] for e in audit] == [a["index"], b["index"]]
    assert client.get(f"/v1/studies/{sid}/audit/verify").json()["ok"]


@pytest.mark.parametrize(
    ("case", "headers", "study"),
    [
        ("no token", {"Authorization": ""}, "new"),
        ("another scheme", {"Authorization": "Basic eDp5"}, "new"),
        ("a bad token", {"Authorization": "Bearer not-the-token"}, "new"),
        ("no such study", AUTH, "missing"),
        ("a study that is done", AUTH, "done"),
    ],
)
def test_errors_are_the_routes(
    client: TestClient, app: Any, case: str, headers: dict[str, str], study: str
) -> None:
    sid = _study(client, iterations=2, initial_points=1)
    if study == "missing":
        sid = "0" * 32
    elif study == "done":
        for _ in range(2):
            assert client.post(f"/v1/studies/{sid}/step").status_code == 200
    with_lane = client.post(f"/v1/studies/{sid}/step", headers=headers)
    with bypassed(app):
        without = client.post(f"/v1/studies/{sid}/step", headers=headers)
    assert (with_lane.status_code, with_lane.json()) == (without.status_code, without.json()), case
    assert with_lane.status_code == {"new": 401, "missing": 404, "done": 409}[study]
    if study == "new":
        assert client.get(f"/v1/studies/{sid}").json()["iterations_done"] == 0
