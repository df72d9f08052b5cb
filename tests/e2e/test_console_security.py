"""The consoles in headless Chromium: nothing is loaded from outside the service, the CSP holds, and a
forged cross-site form post is refused (SQLite only: the subject is the browser and the frame, not the
database; the page flow runs on both databases in test_console.py)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shared.processes import free_port
from tests.e2e.browser import Traffic, new_page, shot, sign_in
from tests.e2e.conftest import SQLITE_ONLY, Services

pytestmark = [pytest.mark.slow, SQLITE_ONLY]


@pytest.fixture
def attacker_site() -> Iterator[tuple[str, list[str]]]:
    """Another site (``localhost``, not ``127.0.0.1``: a different site for SameSite) serving one page, whose
    HTML is set by the test; returns (its URL, a one-item list holding the HTML)."""
    html = [""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = html[0].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{port}/evil.html", html
    finally:
        server.shutdown()


def _console_pages(page: Any, base: str) -> list[str]:
    """Every console link reachable from the navigation bar (the pages a user opens first)."""
    hrefs = page.eval_on_selector_all("header nav a", "els => els.map(e => e.getAttribute('href'))")
    return [h for h in hrefs if h.startswith("/console")]


def test_no_page_loads_anything_from_outside_the_service(browser: Any, services: Services) -> None:
    for name, svc, token in (
        ("curator", services.curator, services.admin_token),
        ("modeler", services.modeler, services.modeler_token),
    ):
        traffic = Traffic(allowed=(svc.url + "/",))
        page = new_page(browser, traffic)
        violations: list[str] = []
        page.on(
            "console",
            lambda m, v=violations: v.append(m.text) if "Content Security Policy" in m.text else None,
        )
        page.goto(f"{svc.url}/console/sign-in")
        shot(page, f"{name}-sign-in")
        sign_in(page, svc.url, token)
        for href in _console_pages(page, svc.url):
            page.goto(svc.url + href)
            page.wait_for_load_state("networkidle")
        assert traffic.outside == [], f"{name}: requests outside the service: {traffic.outside}"
        assert any(u.endswith("/console/static/htmx.min.js") for u in traffic.local)
        assert any(u.endswith("/console/static/console.css") for u in traffic.local)
        assert violations == [], f"{name}: CSP violations: {violations}"
        # htmx ran under the CSP (no eval, no inline script): its global is there
        assert page.evaluate("typeof window.htmx") == "object"
        page.context.close()


def test_a_forged_cross_site_form_post_is_refused(
    browser: Any, services: Services, attacker_site: tuple[str, list[str]]
) -> None:
    admin = services.admin()
    before = len(admin.list_partners().data)
    url, html = attacker_site
    target = f"{services.curator.url}/console/partners"
    # The attacker's page posts a partner-creation form to the curator console as soon as it loads.
    html[0] = (
        f'<html><body><form id="f" method="post" action="{target}">'
        '<input name="name" value="attacker"><input name="max_queries" value="100000">'
        '<input name="csrf_token" value="guessed"></form>'
        "<script>document.getElementById('f').submit()</script></body></html>"
    )
    traffic = Traffic(allowed=(services.curator.url + "/", url.rsplit("/", 1)[0] + "/"))
    page = new_page(browser, traffic)
    sign_in(page, services.curator.url, services.admin_token)  # the victim is signed in ...
    with page.expect_navigation(url=target):
        page.goto(url)  # ... and visits the attacker's site
    page.wait_for_load_state()
    body = page.inner_text("body")
    shot(page, "curator-forged-post-refused")
    assert "403" in body
    assert len(admin.list_partners().data) == before  # nothing was created
    # the victim's own session is untouched
    page.goto(f"{services.curator.url}/console")
    assert page.url.endswith("/console")
    page.context.close()
