"""The OpenAPI docs work air-gapped: no external host in the HTML, and Chromium renders them offline.

FastAPI's default /docs and /redoc pull Swagger UI / ReDoc from a public CDN; both services serve those
assets from the ``fastapi-offline`` package instead. The browser test runs Debian's ``chromium`` with every
host name except the loopback address unresolvable; ``.ci/run`` installs chromium, and in CI its absence is a
failure (outside CI, a machine without chromium skips only the browser half).
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from tests.e2e.browser import CHROMIUM_ARGS, chromium_path

TOKEN = "docs-test-token-0123456789abcdef0123456789abcdef"


def _curator(tmp: Path) -> FastAPI:
    from curator_service.config import Settings
    from curator_service.main import create_app

    return create_app(Settings(data_dir=tmp, admin_token=TOKEN))


def _modeler(tmp: Path) -> FastAPI:
    from modeler_service.config import Settings
    from modeler_service.main import create_app

    return create_app(Settings(data_dir=tmp, token=TOKEN))


SERVICES: dict[str, tuple[Callable[[Path], FastAPI], str]] = {
    "curator": (_curator, "/v1/datasets"),
    "modeler": (_modeler, "/v1/studies"),
}
URL_ATTR = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\(\s*["']?([^"')]+)""", re.I)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=sorted(SERVICES))
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(service name, base URL, an operation path) of a real uvicorn server in a thread."""
    factory, operation = SERVICES[request.param]
    app = factory(tmp_path)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield request.param, base, operation
    server.should_exit = True
    thread.join(timeout=10)


def _external_refs(html: str) -> list[str]:
    refs = [a or b for a, b in URL_ATTR.findall(html)]
    return [u for u in refs if re.match(r"^(?:[a-z][a-z0-9+.-]*:)?//", u, re.I)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_html_references_no_external_host(served: tuple[str, str, str], page: str) -> None:
    _, base, _ = served
    resp = httpx.get(base + page, timeout=10)
    assert resp.status_code == 200
    html = resp.text
    assert _external_refs(html) == []
    assert "cdn.jsdelivr.net" not in html and "fonts.googleapis.com" not in html
    # every asset the page loads is served by the service itself
    local = [a or b for a, b in URL_ATTR.findall(html)]
    assert local, "the docs page loads no assets at all?"
    for ref in local:
        asset = httpx.get(base + ref, timeout=10)
        assert asset.status_code == 200, ref
        assert len(asset.content) > 100, ref


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_chromium_renders_operations_with_network_blocked(
    served: tuple[str, str, str], page: str, tmp_path: Path
) -> None:
    browser = chromium_path()  # (skips, or fails in CI, without chromium)
    name, base, operation = served
    cmd = [
        browser,
        "--headless",
        *CHROMIUM_ARGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        # The air gap: no host name resolves, except the loopback address the service listens on.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--virtual-time-budget=15000",
        "--dump-dom",
        base + page,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # noqa: S603
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    if page == "/docs":
        # Swagger UI renders one .opblock per operation, with its path
        assert dom.count('class="opblock ') >= 3, f"{name}: Swagger UI did not render operations"
    else:
        assert "redoc-wrap" in dom or "api-content" in dom, f"{name}: ReDoc did not render"
    assert operation in dom
