"""Re-record one case of ``gp_ucb_recording.json`` through the modeler's API (fake curator, fixed seeds), with
the replay ``tests/modeler_service/test_gp_ucb_recording.py`` checks it by.

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

from shared.files import write_text_atomic
from tests.modeler_service.conftest import study_body
from tests.modeler_service.test_gp_ucb_recording import replay

FILE = Path(__file__).parent / "gp_ucb_recording.json"
KEYS = ("iteration", "index", "y", "acquisition", "beta", "mean", "std", "source")


def main(name: str, why: str) -> None:
    data = json.loads(FILE.read_text())
    (case,) = [c for c in data["cases"] if c["name"] == name]
    with tempfile.TemporaryDirectory() as tmp:
        steps, audit = replay(case, study_body(**case["body"]), Path(tmp))
    case["steps"] = [
        {**{k: step[k] for k in KEYS}, "hyperparameters": entry["details"]["hyperparameters"]}
        for step, entry in zip(steps, audit, strict=True)
    ]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    case["rerecorded"] = {"on_top_of_commit": head.strip(), "why": why}
    write_text_atomic(FILE, json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
