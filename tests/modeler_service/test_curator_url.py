"""Issue 12, item 5: a curator_url that points at any other web server gives a 502 that names what was
expected (never a 500); redirects are never followed; CURATOR_URL_ALLOWLIST restricts where a study may
point the modeler."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from modeler_service.config import Settings
from modeler_service.main import create_app
from shared.protocol.client import CuratorClient
from tests.modeler_service.conftest import AUTH, study_body
from tests.modeler_service.fake_curator import FakeCurator

Handler = Callable[[httpx.Request], httpx.Response]


def _client(settings: Settings, handler: Handler) -> TestClient:
    def factory(url: str, token: str) -> CuratorClient:
        return CuratorClient(url, token, transport=httpx.MockTransport(handler), retries=0, backoff=0.0)

    return TestClient(create_app(settings, client_factory=factory), headers=AUTH)


def _html(status: int) -> Handler:
    return lambda request: httpx.Response(
        status, text="<html><body>It works!</body></html>", headers={"content-type": "text/html"}
    )


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (_html(200), "expected the JSON of a pobo curator, got text/html"),
        (_html(404), "Not Found, with text/html instead of a pobo curator's error body"),
        (
            lambda r: httpx.Response(200, json={"hello": "world"}),
            "expected a pobo curator's ReleasePublic, got JSON of another shape",
        ),
        (lambda r: httpx.Response(200, json=[1, 2, 3]), "expected a pobo curator's ReleasePublic"),
        (
            lambda r: httpx.Response(200, content=b"\x00\x01", headers={"content-type": "application/json"}),
            "expected the JSON of a pobo curator",
        ),
    ],
)
def test_another_web_server_is_a_502_that_says_what_was_expected(
    settings: Settings, handler: Handler, expected: str
) -> None:
    with _client(settings, handler) as client:
        r = client.post("/v1/studies", json=study_body())
    assert r.status_code == 502, r.text
    assert "does not answer like a pobo curator" in r.json()["detail"]
    assert expected in r.json()["detail"]


def test_a_redirect_is_never_followed(settings: Settings) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url.host))
        return httpx.Response(302, headers={"location": "http://169.254.169.254/latest/meta-data/"})

    with _client(settings, handler) as client:
        r = client.post("/v1/studies", json=study_body())
    assert r.status_code == 502
    assert (
        "a redirect to http://169.254.169.254/latest/meta-data/, which pobo never follows"
        in r.json()["detail"]
    )
    assert set(seen) == {"curator.test"}  # the other host was never asked


def test_the_allowlist_refuses_other_curator_urls(
    tmp_path: Path, database_url: str, curator: FakeCurator
) -> None:
    settings = Settings(
        data_dir=tmp_path / "m",
        database_url=database_url,
        token="modeler-test-token-0123456789abcdef",
        curator_url_allowlist=["http://curator.test"],
    )
    with _client(settings, curator.handle) as client:
        for url in (
            "http://127.0.0.1:22",
            "http://curator.test.evil.example",
            "http://curator.test@evil.example",
        ):
            r = client.post("/v1/studies", json=study_body(curator_url=url))
            assert r.status_code == 422, url
            assert "setting POBO_MODELER_CURATOR_URL_ALLOWLIST" in r.json()["detail"]
        assert curator.requests == []  # nothing was sent anywhere
        ok = client.post("/v1/studies", json=study_body(curator_url="http://curator.test/"))
        assert ok.status_code == 201, ok.text


def test_the_allowlist_is_read_from_the_environment(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv("POBO_MODELER_CURATOR_URL_ALLOWLIST", '["https://curator.example.org:8001"]')
    assert Settings(data_dir=tmp_path).curator_url_allowlist == ["https://curator.example.org:8001"]


def _pobo(service: str | None) -> Handler:
    """A pobo service that is not the curator asked for: 404 (pobo's error body) for every /v1 path."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/healthz") and service is not None:
            return httpx.Response(200, json={"status": "ok", "database": "ok", "service": service})
        return httpx.Response(404, json={"detail": "Not Found"})

    return handler


@pytest.mark.parametrize(
    ("url", "service", "expected"),
    [
        ("http://modeler.test", "modeler", "is not a pobo curator (it answered as the pobo modeler)"),
        (
            "http://curator.test/v1",
            None,
            "does not answer like a pobo service (give its base URL, without /v1)",
        ),
    ],
)
def test_a_url_that_is_not_a_curator_says_so(
    settings: Settings, url: str, service: str | None, expected: str
) -> None:
    with _client(settings, _pobo(service)) as client:
        r = client.post("/v1/studies", json=study_body(curator_url=url))
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(f"curator_url {url!r} is not a pobo curator")
    assert expected in r.json()["detail"]


def test_a_real_not_found_stays_not_found(settings: Settings, curator: FakeCurator) -> None:
    with _client(settings, curator.handle) as client:
        r = client.post("/v1/studies", json=study_body(release_id=2))
    assert r.status_code == 404 and "release 2: not found at the curator" in r.json()["detail"]


def test_a_throttled_curator_is_not_a_used_up_quota(settings: Settings) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, json={"detail": "too many requests"}, headers={"retry-after": "30"})

    with _client(settings, handler) as client:
        r = client.post("/v1/studies", json=study_body())
    assert r.status_code == 429
    assert "the curator is throttling requests from this modeler" in r.json()["detail"]
    assert "try again in 30 s" in r.json()["detail"] and "quota" not in r.json()["detail"]
