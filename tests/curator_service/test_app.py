"""App factory, settings, admin token, migrations, health and the OpenAPI document."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, inspect

from curator_service.config import Settings
from curator_service.db import VERSION_TABLE, Database
from curator_service.main import create_app
from tests.curator_service.conftest import ADMIN

pytestmark = pytest.mark.anyio


async def test_healthz_reports_database_ok(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "service": "curator"}


async def test_healthz_reports_unreachable_database(app, client: httpx.AsyncClient) -> None:
    db = app.state.components.db
    good = db.engine
    db.engine = create_engine(
        "postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 1}
    )
    try:
        response = await client.get("/healthz")
    finally:
        db.engine = good
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "database": "unreachable", "service": "curator"}


async def test_openapi_has_description_tags_and_body_examples(client: httpx.AsyncClient) -> None:
    docs = await client.get("/docs")
    assert docs.status_code == 200 and "/static-offline-docs/" in docs.text  # no CDN needed
    asset = docs.text.split('src="')[1].split('"')[0]
    assert (await client.get(asset)).status_code == 200
    spec = (await client.get("/openapi.json")).json()
    description = spec["info"]["description"]
    assert "differentially\nprivate for one person's row" in description  # the guarantee, stated
    assert "is NOT differentially\nprivate when n > d + 1" in description  # and where it does not hold
    assert "max_norm" in description and "population" in description
    assert {t["name"] for t in spec["tags"]} >= {"datasets", "releases", "partners", "queries", "health"}
    bodies = 0
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            assert op.get("tags"), f"{method} {path} has no tag"
            if "requestBody" not in op:
                continue
            bodies += 1
            content = op["requestBody"]["content"]
            ((media, body),) = content.items()
            schema = body["schema"]
            if "$ref" in schema:
                schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
            if media == "application/json":
                assert schema.get("examples"), f"{method} {path}: no example"
            else:  # multipart: every form field carries an example (the file itself excepted)
                for name, prop in schema["properties"].items():
                    assert name == "file" or prop.get("examples"), (
                        f"{method} {path}: field {name} has no example"
                    )
    assert bodies >= 5


async def test_every_v1_route_requires_a_token(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    for path, methods in spec["paths"].items():
        if not path.startswith("/v1"):
            continue
        concrete = path.replace("{dataset_id}", "1").replace("{release_id}", "1").replace("{query_id}", "1")
        concrete = concrete.replace("{partner_id}", "1")
        for method in methods:
            response = await client.request(method.upper(), concrete)
            assert response.status_code == 401, f"{method} {path}"
            assert response.json()["detail"].startswith("missing bearer token")
            assert response.headers["www-authenticate"] == "Bearer"


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POBO_CURATOR_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("POBO_CURATOR_ADMIN_TOKEN", "from-env-0123456789abcdefghij")
    monkeypatch.setenv("POBO_CURATOR_MAX_UPLOAD_BYTES", "1234")
    monkeypatch.setenv("POBO_CURATOR_PORT", "9001")
    s = Settings()
    assert s.data_dir == tmp_path / "d"
    assert s.admin_token is not None and s.admin_token.get_secret_value() == "from-env-0123456789abcdefghij"
    assert "from-env" not in repr(s)
    assert s.max_upload_bytes == 1234 and s.port == 9001 and s.host == "127.0.0.1"
    assert s.resolved_database_url() == f"sqlite:///{(tmp_path / 'd' / 'curator.db').resolve()}"


def test_default_settings() -> None:
    s = Settings(_env_file=None)
    assert s.port == 8001
    assert s.max_upload_bytes >= 2 * 2**30
    assert s.data_dir == Path("./pobo-data/curator")


def test_admin_token_generated_once_with_mode_0600(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(data_dir=tmp_path / "d", database_url=f"sqlite:///{tmp_path / 'c.db'}")
    first = settings.resolve_admin_token().get_secret_value()
    printed = capsys.readouterr().err
    assert first in printed and "admin-token" in printed
    token_file = tmp_path / "d" / "admin-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert len(first) >= 43  # 32 random bytes, URL-safe base64
    again = Settings(data_dir=tmp_path / "d").resolve_admin_token().get_secret_value()
    assert again == first
    assert first not in capsys.readouterr().err  # printed only once


async def test_generated_admin_token_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = create_app(Settings(data_dir=tmp_path / "d", database_url=f"sqlite:///{tmp_path / 'c.db'}"))
    token = (tmp_path / "d" / "admin-token").read_text().strip()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        ok = await c.get("/v1/datasets", headers={"Authorization": f"Bearer {token}"})
        bad = await c.get("/v1/datasets", headers={"Authorization": "Bearer nope"})
    app.state.components.db.dispose()
    assert ok.status_code == 200 and ok.json() == {"data": [], "count": 0}
    assert bad.status_code == 401 and bad.json() == {"detail": "invalid or revoked token"}


def test_migrations_create_curator_tables_and_version_table(settings: Settings) -> None:
    db = Database(settings.resolved_database_url())
    try:
        db.migrate()
        db.migrate()  # idempotent: start-up runs it every time
        names = set(inspect(db.engine).get_table_names())
        assert VERSION_TABLE == "alembic_version_curator"
        assert {
            "alembic_version_curator",
            "curator_datasets",
            "curator_releases",
            "curator_ledger_entries",
            "curator_partners",
            "curator_grants",
            "curator_queries",
            "curator_access_log",
        } <= names
        assert "alembic_version" not in names  # the modeler's (default-named) table is not ours
    finally:
        db.dispose()


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        db.dispose()


async def test_unknown_route_is_404_json(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/nothing-here", headers=ADMIN)
    assert response.status_code == 404
    assert response.json() == {"detail": "Not Found"}
