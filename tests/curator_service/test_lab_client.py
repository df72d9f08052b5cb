"""The lab workflow through ``CuratorClient`` (the typed client the SDK and the tools use), against the
real curator app in-process: the endpoint table, the request bodies and the typed answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from shared.protocol.client import CuratorClient
from tests.curator_service.conftest import ADMIN_TOKEN, synthetic
from tests.curator_service.test_lab import lab_csv


def test_the_client_runs_the_lab_workflow(app: Any, tmp_path: Path) -> None:
    X, _ = synthetic(n=8, d=2, seed=6)
    csv_path = tmp_path / "assay.csv"
    csv_path.write_bytes(lab_csv(X))
    with TestClient(app, base_url="http://curator.test") as http:

        def client(token: str) -> CuratorClient:
            return CuratorClient("http://curator.test", token, transport=http._transport, retries=0)

        with client(ADMIN_TOKEN) as admin:
            ds = admin.upload_dataset(csv_path, name="assay", id_column="sample")
            assert (ds.id_column, ds.features) == ("sample", ["x0", "x1"])
            release = admin.create_release(ds.id, epsilon=1.0, delta=1e-5)
            partner = admin.create_partner("modeler", release_ids=[release.id], max_queries=5)
            with client(partner.token) as modeler:
                first = modeler.create_query(release.id, 2, idempotency_key="s:1")
                second = modeler.create_query(release.id, 5, idempotency_key="s:2")
                pending = admin.lab_queries()
                assert [(q.id, q.sample_id) for q in pending.data] == [
                    (first.id, "S-002"),
                    (second.id, "S-005"),
                ]
                sheet = tmp_path / "measured.csv"
                sheet.write_text("sample_id,y\nS-002,0.5\nS-005,1.5\n")
                posted = admin.post_results(sheet)
                assert posted.count == 2 and [q.y for q in posted.queries] == [0.5, 1.5]
                assert admin.lab_queries().count == 0
                assert [q.id for q in admin.lab_queries("complete").data] == [first.id, second.id]
                fixed = admin.correct_result(first.id, 0.25, reason="typo")  # not yet sent: corrected
                assert fixed.y == 0.25 and fixed.corrections[0].kind == "correction"
                assert modeler.get_query(first.id).y == 0.25  # sent now
                moved = admin.correct_result(first.id, 0.3, reason="re-measured")  # superseded
                assert [c.kind for c in moved.corrections] == ["correction", "supersession"]
                seen = modeler.list_corrections(release.id)
                assert [(c.query_id, c.previous_y, c.y, c.reason) for c in seen.data] == [
                    (first.id, 0.25, 0.3, None)
                ]
                assert modeler.list_corrections(release.id, after_id=seen.data[0].id).count == 0
                assert admin.list_corrections(release.id).count == 2
                assert modeler.get_query(first.id).y == 0.3
