"""The audit chain: JSON and CSV export, and tamper detection by editing the database directly."""

from __future__ import annotations

import csv
import hashlib
import io
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from modeler_service.audit import entry_payload
from modeler_service.config import Settings
from modeler_service.models import GENESIS_HASH, AuditEntry
from shared.servicekit.hashchain import canonical_json
from tests.modeler_service.conftest import study_body


@pytest.fixture
def study(client: TestClient) -> dict[str, Any]:
    study = client.post("/v1/studies", json=study_body(iterations=6)).json()
    assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
    deadline = time.monotonic() + 30
    while client.get(f"/v1/studies/{study['id']}").json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return study


def sql(settings: Settings, statement: str, **params: Any) -> None:
    engine = create_engine(settings.resolved_database_url())
    with engine.begin() as conn:
        conn.execute(text(statement), params)
    engine.dispose()


#: The verification's fields about the supersession chain of a study without supersessions.
UNSUPERSEDED = {"supersessions": 0, "first_bad_supersession_seq": None}


def verify(client: TestClient, study: dict[str, Any]) -> dict[str, Any]:
    resp = client.get(f"/v1/studies/{study['id']}/audit/verify")
    assert resp.status_code == 200
    return resp.json()


def test_audit_log_fields_and_chain(client: TestClient, study: dict[str, Any]) -> None:
    log = client.get(f"/v1/studies/{study['id']}/audit").json()
    entries = log["entries"]
    assert log["count"] == 6 and [e["seq"] for e in entries] == [1, 2, 3, 4, 5, 6]
    assert {
        "seq",
        "at",
        "iteration",
        "round",
        "request",
        "kind",
        "details",
        "index",
        "y",
        "acquisition",
        "beta",
        "mean",
        "std",
        "curator_query_id",
        "prev_hash",
        "hash",
    } <= set(entries[0])
    assert entries[0]["prev_hash"] == GENESIS_HASH
    assert [(e["round"], e["request"], e["kind"]) for e in entries] == [(k, 0, "row") for k in range(1, 7)]
    assert [e["details"]["source"] for e in entries] == ["initial", "initial"] + ["gp-ucb"] * 4
    assert all(e["acquisition"] == e["details"]["acquisition"] for e in entries)
    assert entries[0]["details"]["hyperparameters"] == {
        "lengthscale": 1.0,
        "signal_variance": 1.0,
        "noise_variance": 1e-4,
    }
    for prev, entry in zip(entries, entries[1:], strict=False):
        assert entry["prev_hash"] == prev["hash"]
    # the hash is sha256(prev_hash + canonical JSON), recomputable by anyone from the export
    e = entries[2]
    row = AuditEntry(
        study_id=study["id"],
        seq=e["seq"],
        at=_parse(e["at"]),
        round=e["round"],
        request=e["request"],
        kind=e["kind"],
        row_index=e["index"],
        y=e["y"],
        details=e["details"],
        curator_query_id=e["curator_query_id"],
        hash_version=e["hash_version"],
    )
    payload = canonical_json(entry_payload(row))
    assert hashlib.sha256((e["prev_hash"] + payload).encode()).hexdigest() == e["hash"]
    assert verify(client, study) == {"ok": True, "entries": 6, "first_bad_seq": None, **UNSUPERSEDED}


def _parse(value: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_audit_csv_export(client: TestClient, study: dict[str, Any]) -> None:
    resp = client.get(f"/v1/studies/{study['id']}/audit", params={"format": "csv"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    entries = client.get(f"/v1/studies/{study['id']}/audit").json()["entries"]
    assert len(rows) == 6
    for row, entry in zip(rows, entries, strict=True):
        assert int(row["index"]) == entry["index"] and float(row["y"]) == entry["y"]
        assert row["hash"] == entry["hash"] and int(row["curator_query_id"]) == entry["curator_query_id"]


def test_edited_y_is_detected(client: TestClient, settings: Settings, study: dict[str, Any]) -> None:
    sql(settings, "UPDATE modeler_audit_entries SET y = y + 1e-9 WHERE study_id=:s AND seq=3", s=study["id"])
    assert verify(client, study) == {"ok": False, "entries": 6, "first_bad_seq": 3, **UNSUPERSEDED}


def test_edited_index_is_detected(client: TestClient, settings: Settings, study: dict[str, Any]) -> None:
    sql(
        settings,
        "UPDATE modeler_audit_entries SET row_index = row_index + 1 WHERE study_id=:s AND seq=5",
        s=study["id"],
    )
    assert verify(client, study)["first_bad_seq"] == 5


def test_edited_entry_with_recomputed_hash_is_detected(
    client: TestClient, settings: Settings, study: dict[str, Any]
) -> None:
    """Rewriting an entry and its own hash still breaks the link to the next entry."""
    engine = create_engine(settings.resolved_database_url())
    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():
        entry = session.query(AuditEntry).filter_by(study_id=study["id"], seq=2).one()
        entry.y = entry.y + 1.0
        payload = canonical_json(entry_payload(entry))
        entry.hash = hashlib.sha256((entry.prev_hash + payload).encode()).hexdigest()
    engine.dispose()
    assert verify(client, study)["first_bad_seq"] == 3


def test_edited_details_are_detected(client: TestClient, settings: Settings, study: dict[str, Any]) -> None:
    """The strategy's numbers are covered by the hash: a changed acquisition value breaks the chain."""
    engine = create_engine(settings.resolved_database_url())
    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():
        entry = session.query(AuditEntry).filter_by(study_id=study["id"], seq=4).one()
        entry.details = {**entry.details, "acquisition": entry.details["acquisition"] + 1e-12}
    engine.dispose()
    assert verify(client, study)["first_bad_seq"] == 4


def test_deleted_entry_is_detected(client: TestClient, settings: Settings, study: dict[str, Any]) -> None:
    sql(settings, "DELETE FROM modeler_audit_entries WHERE study_id=:s AND seq=4", s=study["id"])
    assert verify(client, study) == {"ok": False, "entries": 5, "first_bad_seq": 4, **UNSUPERSEDED}


def test_deleted_last_entry_is_detected(
    client: TestClient, settings: Settings, study: dict[str, Any]
) -> None:
    sql(settings, "DELETE FROM modeler_audit_entries WHERE study_id=:s AND seq=6", s=study["id"])
    assert verify(client, study) == {"ok": False, "entries": 5, "first_bad_seq": 6, **UNSUPERSEDED}


def test_reordered_entries_are_detected(
    client: TestClient, settings: Settings, study: dict[str, Any]
) -> None:
    s = study["id"]
    sql(settings, "UPDATE modeler_audit_entries SET seq = -1 WHERE study_id=:s AND seq=2", s=s)
    sql(settings, "UPDATE modeler_audit_entries SET seq = 2 WHERE study_id=:s AND seq=3", s=s)
    sql(settings, "UPDATE modeler_audit_entries SET seq = 3 WHERE study_id=:s AND seq=-1", s=s)
    assert verify(client, study) == {"ok": False, "entries": 6, "first_bad_seq": 2, **UNSUPERSEDED}
