"""Several modeler worker processes on one database (``pobo modeler serve --workers N``), simulated by two
apps sharing the database and the data dir: each keeps its own cache of strategies, which must follow the
iterations the other one recorded."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from modeler_service.config import Settings
from modeler_service.main import Recovered, create_app
from modeler_service.models import utcnow
from shared.bo.strategies import GPUCB
from shared.protocol.client import CuratorClient
from tests.modeler_service.conftest import AUTH, study_body
from tests.modeler_service.fake_curator import FakeCurator

STEPS = 14


def worker_app(settings: Settings, curator: FakeCurator, *, first: bool) -> Any:
    """The first app runs the start-up work (the supervisor's part); the second is a plain worker."""

    def factory(url: str, token: str) -> CuratorClient:
        return CuratorClient(url, token, transport=curator.transport(), retries=2, backoff=0.0)

    recovered = None if first else Recovered([], utcnow())
    return create_app(settings, client_factory=factory, recovered=recovered)


def test_alternating_workers_choose_as_one_process_would(
    settings: Settings, curator: FakeCurator, monkeypatch: pytest.MonkeyPatch
) -> None:
    rebuilds = 0
    original = GPUCB.from_history.__func__  # type: ignore[attr-defined]

    def counting(cls: type[GPUCB], *args: Any, **kwargs: Any) -> GPUCB:
        nonlocal rebuilds
        rebuilds += 1
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(GPUCB, "from_history", classmethod(counting))
    hp = {"hyperparameters": "mle", "iterations": STEPS, "initial_points": 2, "seed": 11}
    a, b = worker_app(settings, curator, first=True), worker_app(settings, curator, first=False)
    with TestClient(a, headers=AUTH) as wa, TestClient(b, headers=AUTH) as wb:
        shared_id = wa.post("/v1/studies", json=study_body(**hp)).json()["id"]
        alone_id = wa.post("/v1/studies", json=study_body(**hp)).json()["id"]
        for t in range(STEPS):
            worker = (wa, wb)[t % 2]  # every step on the other worker than the one before
            assert worker.post(f"/v1/studies/{shared_id}/step").status_code == 200
            assert wa.post(f"/v1/studies/{alone_id}/step").status_code == 200
        shared = wb.get(f"/v1/studies/{shared_id}/audit").json()["entries"]
        alone = wa.get(f"/v1/studies/{alone_id}/audit").json()["entries"]
        assert wb.get(f"/v1/studies/{shared_id}/audit/verify").json()["ok"]
    assert len(shared) == len(alone) == STEPS
    # Same rows, same outcomes, same numbers (MLE refits included) as the study that one process ran.
    assert [e["index"] for e in shared] == [e["index"] for e in alone]
    for x, y in zip(shared, alone, strict=True):
        assert x["acquisition"] == pytest.approx(y["acquisition"], rel=1e-6)
        hx, hy = x["details"]["hyperparameters"], y["details"]["hyperparameters"]
        assert hx == pytest.approx(hy, rel=1e-6)
    # Each worker built the shared study's strategy once, then caught up with the other's entries
    # incrementally (plus one build for the study run alone): not a rebuild per step.
    assert rebuilds == 3
