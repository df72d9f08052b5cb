"""The console frame both services share: sign-in, session cookie, CSRF, throttle, headers, assets.

Driven through the curator's real app (the modeler mounts the same kit); the pages themselves are tested
in tests/curator_service/test_console.py and tests/modeler_service/test_console.py, and in a real browser in
tests/e2e/test_console.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from curator_service.config import Settings
from curator_service.main import create_app
from shared.servicekit.console.auth import SessionSigner
from shared.servicekit.console.kit import CSP

TOKEN = "console-kit-admin-token-0123456789abcdef"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def _app(tmp: Path, **extra: object) -> FastAPI:
    return create_app(Settings(data_dir=tmp, admin_token=TOKEN, auth_max_failures=3, **extra))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(_app(tmp_path), base_url="http://testserver") as c:
        yield c


def _sign_in(client: TestClient, token: str = TOKEN, next_path: str = "/console"):  # noqa: ANN202
    form = client.get("/console/sign-in")
    csrf = CSRF.search(form.text)
    assert csrf is not None
    return client.post(
        "/console/sign-in",
        data={"csrf_token": csrf.group(1), "token": token, "next": next_path},
        follow_redirects=False,
    )


def test_pages_need_a_session_and_the_admin_token_opens_one(client: TestClient) -> None:
    r = client.get("/console", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/sign-in?next=/console"
    r = _sign_in(client, next_path="/console/sign-in")
    assert r.status_code == 303 and r.headers["location"] == "/console/sign-in"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("pobo_curator_console=")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/", "Max-Age=28800"):
        assert attribute.lower() in cookie.lower(), attribute
    assert "secure" not in cookie.lower()  # plain HTTP: a Secure cookie would never come back
    assert TOKEN not in cookie
    assert client.get("/console", follow_redirects=False).status_code == 200


def test_a_wrong_token_is_refused_and_shares_the_apis_throttle(client: TestClient) -> None:
    for _ in range(3):
        r = _sign_in(client, token="not-the-admin-token-at-all-0123456789")
        assert r.status_code == 401 and "not the curator&#39;s admin token" in r.text
        assert "pobo_curator_console=" not in r.headers.get("set-cookie", "")
    # three failed sign-ins lock the address for the API too ...
    api = client.get("/v1/datasets", headers={"Authorization": "Bearer another-wrong-token-0123456789"})
    assert api.status_code == 429 and "retry-after" in api.headers
    r = _sign_in(client, token="still-wrong-token-0123456789abcdef")
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    assert "too many invalid tokens" in r.text
    # ... but never the operator: the admin token still signs in (as it still calls the API)
    assert _sign_in(client).status_code == 303


def test_failed_api_calls_count_against_the_console_sign_in(client: TestClient) -> None:
    for _ in range(3):
        r = client.get("/v1/datasets", headers={"Authorization": "Bearer wrong-token-0123456789abcdef"})
        assert r.status_code == 401
    assert _sign_in(client, token="wrong-token-0123456789abcdef").status_code == 429


def test_a_partner_token_cannot_sign_in(client: TestClient) -> None:
    admin = {"Authorization": f"Bearer {TOKEN}"}
    partner = client.post("/v1/partners", json={"name": "consultancy", "max_queries": 10}, headers=admin)
    assert partner.status_code == 201, partner.text
    token = partner.json()["token"]
    r = _sign_in(client, token=token)
    assert (
        r.status_code == 401
    )  # refused like any wrong token: the console never tells a token is a partner's
    assert client.get("/console", follow_redirects=False).status_code == 303


def test_forged_expired_and_other_service_cookies_are_refused(client: TestClient, tmp_path: Path) -> None:
    signer = SessionSigner(service="curator", operator_token=TOKEN, max_age_seconds=1, secure=False)
    other = SessionSigner(
        service="curator", operator_token="some-other-token-0123456789", max_age_seconds=60, secure=False
    )
    modeler = SessionSigner(service="modeler", operator_token=TOKEN, max_age_seconds=60, secure=False)
    forged, _ = other.new_session()
    cross, _ = modeler.new_session()
    valid, _ = SessionSigner(
        service="curator", operator_token=TOKEN, max_age_seconds=60, secure=False
    ).new_session()
    for value, expected in ((forged, 303), (cross, 303), (valid + "x", 303), (valid, 200)):
        client.cookies.set("pobo_curator_console", value)
        assert client.get("/console", follow_redirects=False).status_code == expected
    old, _ = signer.new_session()
    time.sleep(2.1)
    assert signer.read(old) is None  # past max_age
    client.cookies.set("pobo_curator_console", old)
    r = client.get("/console", follow_redirects=False)
    assert r.status_code == 200  # the app's own lifetime is 8 h: the same cookie is still valid there


def test_every_post_needs_the_csrf_token_and_a_same_origin(client: TestClient) -> None:
    assert _sign_in(client).status_code == 303
    page = client.get("/console")
    csrf = CSRF.search(page.text)
    assert csrf is not None
    assert client.post("/console/sign-out", data={}).status_code == 403
    assert client.post("/console/sign-out", data={"csrf_token": "0" * 64}).status_code == 403
    cross = client.post(
        "/console/sign-out",
        data={"csrf_token": csrf.group(1)},
        headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert cross.status_code == 403 and "cross-site" in cross.text
    assert client.get("/console", follow_redirects=False).status_code == 200  # still signed in
    out = client.post(
        "/console/sign-out",
        data={"csrf_token": csrf.group(1)},
        headers={"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"},
        follow_redirects=False,
    )
    assert out.status_code == 303 and "pobo_curator_console=" in out.headers["set-cookie"]
    assert client.get("/console", follow_redirects=False).status_code == 303


def test_the_sign_in_form_has_its_own_csrf_token(client: TestClient) -> None:
    client.get("/console/sign-in")
    r = client.post("/console/sign-in", data={"token": TOKEN, "csrf_token": "x" * 64}, follow_redirects=False)
    assert r.status_code == 403 and "expired" in r.text
    fresh = TestClient(client.app, base_url="http://testserver")  # no pre-session cookie at all
    page = client.get("/console/sign-in")
    csrf = CSRF.search(page.text)
    assert csrf is not None
    r = fresh.post(
        "/console/sign-in", data={"token": TOKEN, "csrf_token": csrf.group(1)}, follow_redirects=False
    )
    assert r.status_code == 403


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/x", "/v1/datasets", "/console\\@evil"]
)
def test_sign_in_never_redirects_off_the_console(client: TestClient, target: str) -> None:
    r = _sign_in(client, next_path=target)
    assert r.status_code == 303 and r.headers["location"] == "/console"


def test_security_headers_on_every_console_response(client: TestClient) -> None:
    responses = [
        client.get("/console", follow_redirects=False),
        client.get("/console/sign-in"),
        client.get("/console/static/console.css"),
        client.get("/console/static/nope.js"),
        client.post("/console/sign-out", data={}),
    ]
    for r in responses:
        assert r.headers["content-security-policy"] == CSP
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "same-origin"
    assert "'unsafe-inline'" not in CSP and "'unsafe-eval'" not in CSP
    assert responses[0].headers["cache-control"] == "no-store"
    assert responses[2].headers["cache-control"].startswith("private")
    assert responses[3].status_code == 404
    assert "content-security-policy" not in client.get("/healthz").headers  # the API is untouched


def test_assets_are_served_by_the_package(client: TestClient) -> None:
    page = client.get("/console/sign-in").text
    refs = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert "/console/static/htmx.min.js" in refs and "/console/static/console.css" in refs
    for ref in refs:
        assert ref.startswith("/"), ref
    js = client.get("/console/static/htmx.min.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert len(js.content) > 40_000
    assert "<script>" not in page and "style=" not in page  # nothing inline for the CSP to allow


def test_secure_cookie_under_tls() -> None:
    signer = SessionSigner(service="modeler", operator_token=TOKEN, max_age_seconds=60, secure=True)
    assert signer.cookie_name == "__Host-pobo_modeler_console"  # browsers take __Host- only over HTTPS


def test_the_console_can_be_turned_off(tmp_path: Path) -> None:
    with TestClient(_app(tmp_path, console=False)) as c:
        assert c.get("/console/sign-in").status_code == 404
        assert c.get("/console/static/console.css").status_code == 404


def test_under_tls_the_cookie_is_secure_and_host_only(tmp_path: Path) -> None:
    """With TLS the session cookie is Secure and __Host- prefixed (no Domain, Path=/): the kit alone, in a
    minimal app, because the real services need a certificate to turn TLS on (tests/e2e/test_tls.py)."""
    from fastapi import FastAPI

    from shared.servicekit.app import AuthFailures
    from shared.servicekit.asgi_guards import MemoryFailureLog
    from shared.servicekit.console import Console

    app = FastAPI()
    app.state.auth_failures = AuthFailures(
        MemoryFailureLog(max_failures=3, window_seconds=60), time.monotonic, 3
    )
    console = Console(
        service="modeler",
        title="modeler",
        templates=tmp_path,
        nav=[],
        operator_token=TOKEN,
        session_minutes=5,
        secure=True,
        who="modeler's API",
    )
    console.install(app)
    with TestClient(app, base_url="https://testserver") as c:
        r = _sign_in(c)
        assert r.status_code == 303
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("__Host-pobo_modeler_console=")
        assert "secure" in cookie.lower() and "domain" not in cookie.lower() and "Path=/" in cookie
        assert "max-age=300" in cookie.lower()
