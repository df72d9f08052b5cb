"""Issue 5, item 7: the curator's query log is a hash chain with a verify endpoint, and
``pobo reconcile --curator URL --modeler URL --study ID`` compares it with the modeler's audit log."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from shared.tools.cli import app
from tests.e2e.conftest import SQLITE_ONLY, Services
from tests.e2e.test_two_party import FIXED_HP, setup_release, study_body, wait_status

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # see SQLITE_ONLY in conftest


def _curator_engine(services: Services) -> Any:
    url = services.curator_db or f"sqlite:///{services.tmp / 'curator' / 'curator.db'}"
    return create_engine(url)


def _reconcile(
    services: Services, study_id: str, curator_token: str, modeler_token: str | None = None
) -> Any:
    return CliRunner().invoke(
        app,
        [
            "reconcile",
            "--curator",
            services.curator.url,
            "--modeler",
            services.modeler.url,
            "--study",
            study_id,
        ],
        env={
            "POBO_CURATOR_TOKEN": curator_token,
            "POBO_MODELER_TOKEN": modeler_token or services.modeler_token,
            "COLUMNS": "200",
        },
    )


def test_query_chain_verifies_and_reconcile_finds_tampering(services: Services) -> None:
    _, release, partner = setup_release(services)
    with services.modeler_http() as http:
        study = http.post("/v1/studies", json=study_body(services, release, partner, 8, FIXED_HP)).json()
        assert http.post(f"/v1/studies/{study['id']}/run").status_code == 202
        assert wait_status(http, study["id"], {"done", "failed"})["status"] == "done"

    with services.admin() as admin:
        verified = admin.verify_queries(release.id)
    assert verified.ok and verified.entries == 8 and verified.first_bad_seq is None
    assert len(verified.head) == 64

    for token in (services.admin_token, partner.token):  # the admin or the study's own partner token
        result = _reconcile(services, study["id"], token)
        assert result.exit_code == 0, result.output
        assert "OK" in result.output and "8 audit entries = 8 curator queries" in result.output

    # A side that cannot be asked: exit 2 with that side's answer, no traceback, no token in the output.
    for args, expected in (
        ((study["id"], partner.token, "wrong-modeler-token"), "modeler answered 401"),
        ((study["id"], "wrong-curator-token"), "curator answered 401"),
        (("no-such-study", partner.token), "modeler answered 404"),
    ):
        result = _reconcile(services, *args)
        assert result.exit_code == 2, result.output
        assert expected in result.output and "Traceback" not in result.output
        assert "wrong-modeler-token" not in result.output and "wrong-curator-token" not in result.output

    # Tamper with the curator's record of the third answer (as a rogue DBA could).
    engine = _curator_engine(services)
    with engine.begin() as conn:
        qid, y = conn.execute(
            text("SELECT id, y FROM curator_queries WHERE release_id = :r AND chain_seq = 3"),
            {"r": release.id},
        ).one()
        conn.execute(text("UPDATE curator_queries SET y = :y WHERE id = :id"), {"y": y + 1.0, "id": qid})
    with services.admin() as admin:
        broken = admin.verify_queries(release.id)
    assert not broken.ok and broken.first_bad_seq == 3
    result = _reconcile(services, study["id"], services.admin_token)
    assert result.exit_code == 1
    assert "curator query chain broken" in result.output and "outcome y differs" in result.output
    assert str(qid) in result.output

    # Undo the edit, then drop the last answer: the release's stored head catches the truncation.
    with engine.begin() as conn:
        conn.execute(text("UPDATE curator_queries SET y = :y WHERE id = :id"), {"y": y, "id": qid})
    assert admin_ok(services, release.id)  # the original value verifies again
    with engine.begin() as conn:
        last = conn.execute(
            text("SELECT id FROM curator_queries WHERE release_id = :r AND chain_seq = 8"), {"r": release.id}
        ).scalar_one()
        conn.execute(text("DELETE FROM curator_queries WHERE id = :id"), {"id": last})
    engine.dispose()
    with services.admin() as admin:
        truncated = admin.verify_queries(release.id)
    assert not truncated.ok and truncated.first_bad_seq == 8
    result = _reconcile(services, study["id"], services.admin_token)
    assert result.exit_code == 1 and "only in the modeler's audit" in result.output

    # The modeler's side: drop its fifth audit entry; its chain breaks there, the curator's query is alone.
    modeler_url = services.modeler_db
    if modeler_url is None:
        (modeler_file,) = (services.tmp / "modeler").glob("*.db")
        modeler_url = f"sqlite:///{modeler_file}"
    engine = create_engine(modeler_url)
    with engine.begin() as conn:
        fifth = conn.execute(
            text("SELECT curator_query_id FROM modeler_audit_entries WHERE study_id = :s AND seq = 5"),
            {"s": study["id"]},
        ).scalar_one()
        conn.execute(
            text("DELETE FROM modeler_audit_entries WHERE study_id = :s AND seq = 5"), {"s": study["id"]}
        )
    engine.dispose()
    with services.modeler_http() as http:
        audit_verify = http.get(f"/v1/studies/{study['id']}/audit/verify").json()
    assert audit_verify["ok"] is False and audit_verify["first_bad_seq"] == 5
    result = _reconcile(services, study["id"], services.admin_token)
    assert result.exit_code == 1 and "modeler audit chain broken" in result.output
    assert "only in the curator's log" in result.output and str(fifth) in result.output


def admin_ok(services: Services, release_id: int) -> bool:
    with services.admin() as admin:
        return admin.verify_queries(release_id).ok
