"""Issue 5, item 6: tokens never stored or logged in clear, token files 0600, failed-token throttling (429),
body size limits (413), CORS closed by default — on both services."""

from __future__ import annotations

import hashlib
import logging
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from curator_service.config import ADMIN_TOKEN_FILE
from curator_service.config import Settings as CuratorSettings
from curator_service.main import create_app as create_curator
from modeler_service.config import TOKEN_FILE
from modeler_service.config import Settings as ModelerSettings
from modeler_service.main import create_app as create_modeler
from shared.servicekit.asgi_guards import AuthThrottle

ADMIN = "sec-admin-token-abcdefghijklmnopqrstuvwxyz0123"
MODELER = "sec-modeler-token-abcdefghijklmnopqrstuvwxyz01"
CSV = "a,b,outcome\n" + "".join(f"{i * 1.37 + 0.123:.4f},{i * 2.71 - 5.5:.4f},{i % 7}\n" for i in range(30))


@pytest.fixture
def curator(tmp_path: Path) -> Iterator[TestClient]:
    app = create_curator(CuratorSettings(data_dir=tmp_path / "c", admin_token=ADMIN, auth_max_failures=5))
    with TestClient(app) as client:
        yield client
    app.state.components.db.dispose()


@pytest.fixture
def modeler(tmp_path: Path) -> Iterator[TestClient]:
    app = create_modeler(ModelerSettings(data_dir=tmp_path / "m", token=MODELER, auth_max_failures=5))
    with TestClient(app) as client:
        yield client


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _seed_curator(client: TestClient) -> str:
    """Upload, release, partner; returns the partner token."""
    r = client.post(
        "/v1/datasets",
        headers=_bearer(ADMIN),
        files={"file": ("d.csv", CSV, "text/csv")},
        data={"name": "d", "objective": "outcome"},
    )
    assert r.status_code == 201, r.text
    ds = r.json()["id"]
    r = client.post(f"/v1/datasets/{ds}/releases", headers=_bearer(ADMIN), json={"epsilon": 1, "delta": 1e-5})
    assert r.status_code == 201, r.text
    r = client.post(
        "/v1/partners",
        headers=_bearer(ADMIN),
        json={"name": "m", "release_ids": [r.json()["id"]], "max_queries": 3},
    )
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


# ------------------------------------------------------------------------------------------ throttling


async def _token_app(scope: Any, receive: Any, send: Any) -> None:
    ok = dict(scope["headers"]).get(b"authorization") == b"Bearer good"
    await send({"type": "http.response.start", "status": 200 if ok else 401, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_throttle_unit_window_and_lock() -> None:
    now = [0.0]
    guard = AuthThrottle(_token_app, max_failures=3, window_seconds=10, clock=lambda: now[0])
    client = TestClient(guard)  # type: ignore[arg-type]
    assert [client.get("/", headers={"Authorization": "Bearer bad"}).status_code for _ in range(3)] == [
        401
    ] * 3
    locked = client.get("/", headers={"Authorization": "Bearer good"})
    assert locked.status_code == 429 and locked.headers["retry-after"] == "10"
    assert client.get("/").status_code == 401  # no token: not throttled (nothing to guess), not counted
    now[0] = 10.5  # the window passed: the correct token works again
    assert client.get("/", headers={"Authorization": "Bearer good"}).status_code == 200


def test_shared_throttle_counts_across_workers(tmp_path: Path) -> None:
    """Two guards on one shared file (two worker processes): failures at either count for both."""
    now = [1_800_000_000.0]
    file = tmp_path / "auth-failures.db"
    workers = [
        TestClient(
            AuthThrottle(
                _token_app, max_failures=4, window_seconds=10, clock=lambda: now[0], shared_file=file
            )
        )  # type: ignore[arg-type]
        for _ in range(2)
    ]
    bad = {"Authorization": "Bearer bad"}
    codes = [workers[i % 2].get("/", headers=bad).status_code for i in range(4)]  # 2 failures at each
    assert codes == [401] * 4
    for worker in workers:  # each alone saw only 2 of the 4: a per-process count would not lock yet
        locked = worker.get("/", headers={"Authorization": "Bearer good"})
        assert locked.status_code == 429 and locked.headers["retry-after"] == "10"
    now[0] += 10.5
    assert all(w.get("/", headers={"Authorization": "Bearer good"}).status_code == 200 for w in workers)


def test_shared_throttle_falls_back_to_memory_when_its_file_fails(tmp_path: Path) -> None:
    unusable = tmp_path / "missing-dir" / "auth-failures.db"  # sqlite cannot create it
    guard = AuthThrottle(_token_app, max_failures=2, window_seconds=10, shared_file=unusable)
    client = TestClient(guard)  # type: ignore[arg-type]
    assert [client.get("/", headers={"Authorization": "Bearer bad"}).status_code for _ in range(2)] == [
        401
    ] * 2
    assert client.get("/", headers={"Authorization": "Bearer good"}).status_code == 429  # still throttled


@pytest.mark.parametrize("service", ["curator", "modeler"])
def test_repeated_bad_tokens_get_429_but_never_lock_out_the_operator(
    service: str, request: pytest.FixtureRequest
) -> None:
    """Issue 12, item 9: after 5 bad tokens from one address, every further guess from it gets 429 (not
    even checked), but the service's own operator token (the curator's admin, the modeler's token) is
    still served: a third party behind the same address cannot lock the operator out."""
    client: TestClient = request.getfixturevalue(service)
    good, path = (ADMIN, "/v1/datasets") if service == "curator" else (MODELER, "/v1/studies")
    assert client.get(path, headers=_bearer(good)).status_code == 200
    codes = [client.get(path, headers=_bearer(f"wrong-{i}")).status_code for i in range(5)]
    assert codes == [401] * 5
    locked = client.get(path, headers=_bearer("wrong-again"))
    assert locked.status_code == 429
    assert int(locked.headers["retry-after"]) > 0
    assert "invalid token" in locked.json()["detail"]
    assert client.get(path, headers=_bearer(good)).status_code == 200  # the operator is not denied
    assert client.get(path, headers={"Authorization": f"Basic {good}"}).status_code == 429  # only Bearer
    assert client.get("/healthz").status_code == 200  # unauthenticated health checks are not throttled


def test_a_locked_out_address_cannot_use_a_partner_token(curator: TestClient) -> None:
    partner = _seed_curator(curator)
    assert curator.get("/v1/partners/me", headers=_bearer(partner)).status_code == 200
    for i in range(5):
        assert curator.get("/v1/partners/me", headers=_bearer(f"wrong-{i}")).status_code == 401
    assert curator.get("/v1/partners/me", headers=_bearer(partner)).status_code == 429  # guessing stays shut


# ------------------------------------------------------------------------------------------ body limits


@pytest.mark.parametrize("service", ["curator", "modeler"])
def test_json_bodies_over_the_limit_get_413(service: str, request: pytest.FixtureRequest) -> None:
    client: TestClient = request.getfixturevalue(service)
    token, path = (ADMIN, "/v1/partners") if service == "curator" else (MODELER, "/v1/studies")
    big = b'{"name": "' + b"x" * (2 * 2**20) + b'"}'
    headers = {**_bearer(token), "Content-Type": "application/json"}
    r = client.post(path, headers=headers, content=big)
    assert r.status_code == 413 and "too large" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: cut off while streaming
        for _ in range(3):
            yield big[: 2**20]

    r = client.post(path, headers=headers, content=chunks())
    assert r.status_code == 413
    r = client.post(path, headers=headers, content=b'{"name": "small"')  # under the limit: normal validation
    assert r.status_code == 422


def test_curator_upload_limit_still_413(tmp_path: Path) -> None:
    app = create_curator(CuratorSettings(data_dir=tmp_path / "c", admin_token=ADMIN, max_upload_bytes=100))
    with TestClient(app) as client:
        r = client.post(
            "/v1/datasets",
            headers=_bearer(ADMIN),
            files={"file": ("d.csv", "a\n" + "1\n" * 2**20, "text/csv")},
        )
    assert r.status_code == 413 and "POBO_CURATOR_MAX_UPLOAD_BYTES" in r.json()["detail"]


# ------------------------------------------------------------------------------------------------ CORS


@pytest.mark.parametrize("service", ["curator", "modeler"])
def test_cors_closed_by_default(service: str, request: pytest.FixtureRequest) -> None:
    client: TestClient = request.getfixturevalue(service)
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}
    r = client.options("/v1/releases" if service == "curator" else "/v1/studies", headers=preflight)
    assert "access-control-allow-origin" not in r.headers
    r = client.get("/healthz", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_opens_only_for_named_origins(tmp_path: Path) -> None:
    settings = CuratorSettings(
        data_dir=tmp_path / "c", admin_token=ADMIN, cors_origins=["https://ok.example"]
    )
    app = create_curator(settings)
    with TestClient(app) as client:
        ok = client.options(
            "/v1/releases", headers={"Origin": "https://ok.example", "Access-Control-Request-Method": "GET"}
        )
        bad = client.options(
            "/v1/releases", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}
        )
    assert ok.headers.get("access-control-allow-origin") == "https://ok.example"
    assert "access-control-allow-origin" not in bad.headers


# ------------------------------------------------------------------------------- tokens at rest and in logs


def _forbidden_strings(*tokens: str) -> list[str]:
    """Each token and the first 8 hex digits of its sha256 (a hash prefix is enough to correlate)."""
    out = []
    for t in tokens:
        out += [t, hashlib.sha256(t.encode()).hexdigest()[:8]]
    return out


def test_curator_database_holds_only_token_hashes_and_logs_hold_neither(
    curator: TestClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    partner = _seed_curator(curator)
    curator.get("/v1/releases", headers=_bearer(partner))
    curator.get("/v1/releases", headers=_bearer(partner + "x"))  # a wrong token, logged as a 401
    access = curator.get("/v1/access-log", headers=_bearer(ADMIN)).text
    app = curator.app
    app.state.components.db.dispose()  # type: ignore[attr-defined]
    raw = b"".join(p.read_bytes() for p in (tmp_path / "c").glob("curator.db*"))
    assert raw, "the SQLite database file was not found"
    for token in (ADMIN, partner, partner + "x"):
        assert token.encode() not in raw
    assert hashlib.sha256(partner.encode()).hexdigest().encode() in raw  # the hash is what is stored
    for s in _forbidden_strings(ADMIN, partner, partner + "x"):
        assert s not in caplog.text, s
        assert s not in access, s


def test_generated_token_files_are_owner_only(tmp_path: Path) -> None:
    c = CuratorSettings(data_dir=tmp_path / "c")
    token = c.resolve_admin_token().get_secret_value()
    path = tmp_path / "c" / ADMIN_TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == token
    m = ModelerSettings(data_dir=tmp_path / "m")
    m.resolve_token()
    m.resolve_secret_key()
    for name in (TOKEN_FILE, "secret.key"):
        assert stat.S_IMODE((tmp_path / "m" / name).stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("settings_cls", "field", "variable"),
    [
        (CuratorSettings, "admin_token", "POBO_CURATOR_ADMIN_TOKEN"),
        (ModelerSettings, "token", "POBO_MODELER_TOKEN"),
    ],
)
def test_a_short_operator_token_is_refused(
    settings_cls: type, field: str, variable: str, tmp_path: Path
) -> None:
    """The lock-out never blocks the operator token, so the services refuse a guessable one at start."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=f"{variable} has 11 characters; use at least 24"):
        settings_cls(data_dir=tmp_path, **{field: "hunter2-pwd"})
    assert settings_cls(data_dir=tmp_path, **{field: "x" * 24})  # long enough
