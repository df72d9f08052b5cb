"""Re-record one case of ``gp_ucb_recording.json`` through the modeler's API (fake curator, fixed seeds), the
way ``tests/modeler_service/test_gp_ucb_recording.py`` replays it.

    .venv/bin/python -m tests.data.record_gp_ucb mle "why the case changed"

Only for a deliberate change of GP-UCB's choices (the case's ``rerecorded`` entry says which and why); a
refactor must keep the recording as it is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from modeler_service.config import Settings
from tests.modeler_service.conftest import AUTH, TOKEN, make_app, study_body
from tests.modeler_service.fake_curator import FakeCurator

FILE = Path(__file__).parent / "gp_ucb_recording.json"


def record(case: dict[str, Any]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp) / "modeler", database_url=f"sqlite:///{tmp}/m.db", token=TOKEN)
        with TestClient(make_app(settings, FakeCurator(**case["curator"])), headers=AUTH) as client:
            created = client.post("/v1/studies", json=study_body(**case["body"]))
            created.raise_for_status()
            study_id = created.json()["id"]
            steps = [client.post(f"/v1/studies/{study_id}/step").json() for _ in case["steps"]]
            audit = client.get(f"/v1/studies/{study_id}/audit").json()["entries"]
    keys = ("iteration", "index", "y", "acquisition", "beta", "mean", "std", "source")
    return [
        {**{k: step[k] for k in keys}, "hyperparameters": entry["details"]["hyperparameters"]}
        for step, entry in zip(steps, audit, strict=True)
    ]


def main(name: str, why: str) -> None:
    data = json.loads(FILE.read_text())
    (case,) = [c for c in data["cases"] if c["name"] == name]
    case["steps"] = record(case)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    case["rerecorded"] = {"on_top_of_commit": head.strip(), "why": why}
    tmp = FILE.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(FILE)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
