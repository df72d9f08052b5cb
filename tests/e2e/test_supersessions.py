"""Issue 34: a corrected measurement shows both values in both audit logs and ``pobo reconcile`` is OK.

Real services: a ``manual`` dataset (uploaded without an outcome column), a study's step waits for the lab,
the lab posts the value, the modeler records it (the value is delivered), then the lab re-measures and the
curator supersedes the value. Until the modeler records the supersession, ``pobo reconcile --no-sync`` names
it as a mismatch; once recorded (``POST /v1/studies/{id}/audit/sync``, which ``pobo reconcile`` calls first)
both logs hold both values and the two logs reconcile."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from shared.tools.cli import app
from shared.tools.reconcile import Supersession, reconcile
from tests.e2e.conftest import SQLITE_ONLY, Services
from tests.e2e.test_two_party import FIXED_HP, study_body, wait_status

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # see SQLITE_ONLY in conftest

MEASURED, REMEASURED = 0.731, 0.713


def _cli(services: Services, study_id: str, *flags: str) -> Any:
    args = ["reconcile", "--curator", services.curator.url, "--modeler", services.modeler.url]
    return CliRunner().invoke(
        app,
        [*args, "--study", study_id, *flags],
        env={
            "POBO_CURATOR_TOKEN": services.admin_token,
            "POBO_MODELER_TOKEN": services.modeler_token,
            "COLUMNS": "200",
        },
    )


def test_a_superseded_measurement_is_in_both_logs_and_reconciles(services: Services) -> None:
    csv = services.tmp / "assay.csv"
    X = np.random.default_rng(5).normal(0.0, 1.0, (60, 3))
    np.savetxt(csv, X, delimiter=",", header="x0,x1,x2", comments="", fmt="%.6f")  # no outcome column
    with services.admin() as admin:
        dataset = admin.upload_dataset(csv, name="assay", features="x0,x1,x2", objective_mode="manual")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        partner = admin.create_partner("lab partner", release_ids=[release.id], max_queries=4)
    with services.modeler_http() as http:
        study = http.post("/v1/studies", json=study_body(services, release, partner, 2, FIXED_HP)).json()
        step = http.post(f"/v1/studies/{study['id']}/step").json()
        assert step["status"] == "pending"
        qid = step["curator_query_id"]
        with services.admin() as admin:
            admin.post_result(qid, MEASURED)  # the lab measures the sample
        assert wait_status(http, study["id"], {"ready", "failed"})["iterations_done"] == 1
        with services.admin() as admin:  # the modeler was sent the value: a new one supersedes it
            changed = admin.correct_result(qid, REMEASURED, reason="re-measured: the pipette was off")
        assert changed.delivered_at is not None  # the modeler's runner read it complete
        [c] = changed.corrections
        assert (c.kind, c.previous_y, c.y, changed.y) == ("supersession", MEASURED, REMEASURED, REMEASURED)

        # the modeler has not recorded it yet: a mismatch, named
        missing = reconcile(
            curator_url=services.curator.url,
            curator_token=services.admin_token,
            modeler_url=services.modeler.url,
            modeler_token=services.modeler_token,
            study_id=study["id"],
            sync=False,
        )
        assert [(m.query_id, m.kind) for m in missing.mismatches] == [
            (qid, "supersession not in the modeler's audit")
        ]
        result = _cli(services, study["id"], "--no-sync")
        assert result.exit_code == 1 and "supersession not in the modeler's audit" in result.output

        assert http.post(f"/v1/studies/{study['id']}/audit/sync").json() == {
            "recorded": 1,
            "supersessions": 1,
        }
        log = http.get(f"/v1/studies/{study['id']}/audit").json()
        verified = http.get(f"/v1/studies/{study['id']}/audit/verify").json()
    # the modeler's audit: the entry keeps the value it was sent, the supersession holds both
    [entry] = log["entries"]
    assert (entry["curator_query_id"], entry["y"]) == (qid, MEASURED)
    [s] = log["supersessions"]
    assert (s["correction_id"], s["curator_query_id"], s["audit_seq"]) == (c.id, qid, 1)
    assert (s["previous_y"], s["y"]) == (MEASURED, REMEASURED)
    assert verified["ok"] and verified["supersessions"] == 1
    # the curator's query log: the query's current value and its change, as a link of the verified chain
    with services.admin() as admin:
        query = admin.get_query(qid)
        listed = admin.list_corrections(release.id).data
        assert admin.verify_queries(release.id).ok
    assert query.y == REMEASURED and [(k.previous_y, k.y) for k in query.corrections] == [
        (MEASURED, REMEASURED)
    ]
    assert [(k.id, k.kind, k.query_id) for k in listed] == [(c.id, "supersession", qid)]

    report = reconcile(
        curator_url=services.curator.url,
        curator_token=services.admin_token,
        modeler_url=services.modeler.url,
        modeler_token=services.modeler_token,
        study_id=study["id"],
    )
    assert report.ok, report.mismatches
    assert report.supersessions == [Supersession(qid, c.id, MEASURED, REMEASURED)]
    result = _cli(services, study["id"])
    assert result.exit_code == 0, result.output
    assert f"superseded: query {qid}" in result.output

    # the study goes on: its next round is planned on the corrected value and recorded as usual
    with services.modeler_http() as http:
        nxt = http.post(f"/v1/studies/{study['id']}/step").json()
        with services.admin() as admin:
            admin.post_result(nxt["curator_query_id"], 0.5)
        done = wait_status(http, study["id"], {"done", "failed"})
        assert (done["status"], done["iterations_done"]) == ("done", 2), done["error"]
    assert _cli(services, study["id"]).exit_code == 0
