"""``gp-ucb`` through the strategy registry makes the same choices as the modeler before the registry.

``tests/data/gp_ucb_recording.json`` was recorded through this same API (fake curator, fixed seeds) with
the code before rounds and the registry existed (commit in the file): every step's row, outcome and the
numbers that chose it. The registry strategy must reproduce them on the same inputs, whether the GP-UCB
parameters are given at the top level (API v1) or in ``strategy_params``. The ``mle`` case was re-recorded
(``tests/data/record_gp_ucb.py``) when issue 32 deliberately changed the maximum-likelihood fit's starts;
the ``fixed`` case is the recording from before the registry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from modeler_service.config import Settings
from tests.modeler_service.conftest import AUTH, TOKEN, make_app, study_body
from tests.modeler_service.fake_curator import FakeCurator

RECORDING = json.loads((Path(__file__).parent.parent / "data" / "gp_ucb_recording.json").read_text())
PARAMS = ("delta_prime", "hyperparameters", "initial_points", "exclude_queried")


def _body(case: dict[str, Any], *, nested: bool) -> dict[str, Any]:
    body = study_body(**case["body"])
    if nested:
        moved = {k: body.pop(k) for k in PARAMS if k in body}
        body["strategy_params"] = body.get("strategy_params", {}) | moved
    return body


def replay(case: dict[str, Any], body: dict[str, Any], tmp: Path) -> tuple[list[Any], list[Any]]:
    """A case's study through the API (its fake curator, a fresh SQLite database under ``tmp``): every
    step's answer and the audit's entries. The test compares them with the recording;
    ``tests/data/record_gp_ucb.py`` records them."""
    settings = Settings(data_dir=tmp / "modeler", database_url=f"sqlite:///{tmp / 'm.db'}", token=TOKEN)
    with TestClient(make_app(settings, FakeCurator(**case["curator"])), headers=AUTH) as client:
        created = client.post("/v1/studies", json=body)
        assert created.status_code == 201, created.text
        study_id = created.json()["id"]
        steps = [client.post(f"/v1/studies/{study_id}/step").json() for _ in case["steps"]]
        audit = client.get(f"/v1/studies/{study_id}/audit").json()["entries"]
    return steps, audit


@pytest.mark.parametrize("nested", [False, True], ids=["top-level", "strategy_params"])
@pytest.mark.parametrize("case", RECORDING["cases"], ids=[c["name"] for c in RECORDING["cases"]])
def test_gp_ucb_matches_the_recording(tmp_path: Path, case: dict[str, Any], nested: bool) -> None:
    steps, audit = replay(case, _body(case, nested=nested), tmp_path)
    assert [s["index"] for s in steps] == [r["index"] for r in case["steps"]]
    for got, entry, want in zip(steps, audit, case["steps"], strict=True):
        assert (got["iteration"], got["round"], got["source"]) == (want["iteration"],) * 2 + (want["source"],)
        # y is the fake curator's f (numpy's exp): a newer numpy may round it an ulp apart
        assert got["y"] == pytest.approx(want["y"], rel=1e-12)
        for key in ("acquisition", "beta", "mean", "std"):
            assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
        assert entry["details"]["hyperparameters"] == pytest.approx(want["hyperparameters"], rel=1e-6)
