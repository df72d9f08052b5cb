"""The curator console's upload form in headless Chromium (issue 34): the form is sent by the page's own
script with a progress report; a refused file (here semicolon-separated) brings the form back with the
error, every value entered, and the chosen file still chosen; the fixed file then goes through to the new
dataset's page (post/redirect/get). No request leaves the service."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import Traffic, new_page, shot, sign_in
from tests.e2e.conftest import SQLITE_ONLY, Services

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # the page's script, not the database

WATCH_STATUS = """() => {
  window.__seen = [];
  const status = document.querySelector("[data-upload-status]");
  new MutationObserver(() => window.__seen.push(status.textContent)).observe(
    status, {childList: true, characterData: true, subtree: true});
}"""


def _assay(path: Path, sep: str, n: int = 40_000) -> None:
    """A few MB: sample ids and three features, separated by ``sep``."""
    rng = np.random.default_rng(5)
    X = rng.normal(0.0, 1.0, (n, 3))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(sep.join(["sample", "a", "b", "c"]) + "\n")
        for i, row in enumerate(X):
            fh.write(sep.join([f"S-{i:06d}", *(repr(float(v)) for v in row)]) + "\n")


def test_the_upload_reports_progress_and_keeps_the_form(
    browser: Any, services: Services, tmp_path: Path
) -> None:
    base = services.curator.url
    traffic = Traffic((base,))
    page = new_page(browser, traffic)
    sign_in(page, base, services.admin_token, "/console/datasets")
    semicolons, commas = tmp_path / "assay-semicolon.csv", tmp_path / "assay.csv"
    _assay(semicolons, ";")
    _assay(commas, ",")

    page.evaluate(WATCH_STATUS)
    page.set_input_files("#upload-form input[name=file]", str(semicolons))
    page.fill("#upload-form input[name=name]", "assay 7")
    page.fill("#upload-form input[name=id_column]", "sample")
    page.fill("#upload-form input[name=population]", "assay batch 7")
    page.select_option("#upload-form select[name=objective_mode]", "manual")
    page.click("#upload-form button[type=submit]")
    expect(page.locator("#error-message")).to_contain_text("the file looks semicolon-separated")
    shot(page, "curator-upload-refused")
    assert page.url == f"{base}/console/datasets"  # the page stayed: its <main> shows the answer
    seen = page.evaluate("window.__seen")
    assert any(re.search(r"sent [0-9.]+ MB of [0-9.]+ MB \(\d+%\)", text) for text in seen), seen
    assert page.input_value("#upload-form input[name=name]") == "assay 7"
    assert page.input_value("#upload-form input[name=id_column]") == "sample"
    assert page.input_value("#upload-form input[name=population]") == "assay batch 7"
    assert page.input_value("#upload-form select[name=objective_mode]") == "manual"
    chosen = page.eval_on_selector("#upload-form input[name=file]", "el => el.files[0].name")
    assert chosen == "assay-semicolon.csv"  # the browser kept the file chosen

    page.set_input_files("#upload-form input[name=file]", str(commas))
    page.click("#upload-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/datasets/\d+$"))
    shot(page, "curator-upload-done")
    assert "assay 7" in page.content()
    assert traffic.outside == []
