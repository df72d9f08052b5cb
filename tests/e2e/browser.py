"""Headless Chromium for the console tests: Debian's ``/usr/bin/chromium`` driven by Playwright (no browser
download), every request outside the services under test recorded and aborted, screenshots saved.

Screenshots go to ``$POBO_ARTIFACTS_DIR/console`` (default ``test-artifacts/console`` in the checkout).
``.ci/run`` installs chromium; in CI (``CI`` set) its absence is a failure, elsewhere the browser tests
skip with the command that installs it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("POBO_ARTIFACTS_DIR", ROOT / "test-artifacts")) / "console"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run must install Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium; CI installs it)")
    return path


@dataclass
class Traffic:
    """Every request the pages made: those to the services under test, and any other (aborted)."""

    allowed: tuple[str, ...]
    local: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def route(self, route: Any) -> None:
        url = route.request.url
        if url.startswith(self.allowed) or url.startswith(("data:", "about:")):
            self.local.append(url)
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def new_page(browser: Any, traffic: Traffic) -> Any:
    """A page in a fresh context (own cookies) whose every request goes through ``traffic``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    context.route("**/*", traffic.route)
    return context.new_page()


def shot(page: Any, name: str) -> Path:
    """A full-page screenshot in the artefact folder."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in(page: Any, base: str, token: str, next_path: str = "/console") -> None:
    page.goto(f"{base}{next_path}")
    assert "/console/sign-in" in page.url
    page.fill("input[name=token]", token)
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_url(re.compile(re.escape(base + next_path) + r"$"))
