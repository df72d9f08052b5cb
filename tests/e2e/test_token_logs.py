"""Issue 5, item 6, on real service processes: after a two-party run with good and bad tokens, no token and
no prefix of a token's sha256 appears in either service's log file, in the curator's access-log table, or
anywhere in either database; the curator's database holds the partner token's hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, inspect, text

from tests.e2e.conftest import Services
from tests.e2e.test_two_party import FIXED_HP, setup_release, study_body

pytestmark = pytest.mark.slow


def _forbidden(tokens: list[str]) -> list[str]:
    """Each token and the first 8 hex digits of its sha256 (any longer prefix contains those)."""
    return [s for t in tokens for s in (t, hashlib.sha256(t.encode()).hexdigest()[:8])]


def _database_text(url: str) -> str:
    """Every row of every table in a database, as text (works on SQLite and PostgreSQL)."""
    engine = create_engine(url)
    chunks: list[str] = []
    try:
        with engine.connect() as conn:
            for table in inspect(conn).get_table_names():
                chunks += [repr(tuple(row)) for row in conn.execute(text(f'SELECT * FROM "{table}"'))]
    finally:
        engine.dispose()
    return "\n".join(chunks)


def _sqlite_url(data_dir: Path) -> str:
    (db,) = data_dir.glob("*.db")
    return f"sqlite:///{db}"


def test_no_token_in_logs_or_databases(services: Services) -> None:
    _, release, partner = setup_release(services, max_queries=10)
    bad_partner, bad_admin, bad_modeler = (
        partner.token + "x",
        services.admin_token[::-1],
        "not-" + partner.token,
    )
    with services.modeler_http() as http:
        study = http.post("/v1/studies", json=study_body(services, release, partner, 3, FIXED_HP))
        assert study.status_code == 201, study.text
        for _ in range(3):
            assert http.post(f"/v1/studies/{study.json()['id']}/step").status_code == 200
        # a study the modeler refuses (422) while the body carries the curator token: not echoed, not logged
        refused = http.post("/v1/studies", json={"curator_token": partner.token, "iterations": 0})
        assert refused.status_code == 422 and partner.token not in refused.text
    with httpx.Client(base_url=services.curator.url, timeout=30) as curator:
        for token in (bad_partner, bad_admin):
            r = curator.get("/v1/releases", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 401 and token not in r.text
    with httpx.Client(base_url=services.modeler.url, timeout=30) as modeler:
        r = modeler.get("/v1/studies", headers={"Authorization": f"Bearer {bad_modeler}"})
        assert r.status_code == 401 and bad_modeler not in r.text
    with services.admin() as admin:
        access = admin.access_log().model_dump_json()
    assert '"status_code":401' in access  # the rejected calls are on record (so the scan below has teeth)

    curator_db = services.curator_db or _sqlite_url(services.tmp / "curator")
    modeler_db = services.modeler_db or _sqlite_url(services.tmp / "modeler")
    curator_rows = _database_text(curator_db)
    assert hashlib.sha256(partner.token.encode()).hexdigest() in curator_rows  # only the hash is stored
    # on PostgreSQL both services share the test's schema, so one dump covers both
    stored = curator_rows if modeler_db == curator_db else curator_rows + "\n" + _database_text(modeler_db)
    assert study.json()["id"] in stored  # the modeler's tables are in the dump
    logs = services.curator.log_path.read_text(errors="replace")
    logs += services.modeler.log_path.read_text(errors="replace")
    assert "401" in logs and "/v1/studies" in logs  # uvicorn's access lines are in the files
    tokens = [
        services.admin_token,
        services.modeler_token,
        partner.token,
        bad_partner,
        bad_admin,
        bad_modeler,
    ]
    for secret in _forbidden(tokens):
        assert secret not in logs, f"{secret!r} in a service log"
        assert secret not in access, f"{secret!r} in the access log"
    for token in tokens:  # the hash of a valid token is in the database by design; the token never is
        assert token not in stored, f"{token!r} stored in clear"
    if services.curator_db is None:  # SQLite: the raw file bytes too, write-ahead log included
        raw = b"".join(
            p.read_bytes() for d in ("curator", "modeler") for p in (services.tmp / d).glob("*.db*")
        )
        for token in tokens:
            assert token.encode() not in raw
