"""Both consoles end to end in headless Chromium, on SQLite and on PostgreSQL (issue 17).

The privacy officer signs in to the curator console, uploads two datasets (one answered from its outcome
column, one measured by hand), reads the privacy report, makes releases and creates a partner granted both.
The modeler's team signs in to the modeler console, creates a GP-UCB study from the schema-rendered form,
runs it and watches it finish (the page polls), verifies its audit log; a second study on the manual release
takes one step, the officer posts the measured value on the curator console, the modeler's page shows it.
Both logs are verified from the pages. Every page is screenshotted to the artefact folder, and no request
leaves the two services (any other is recorded and aborted).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from tests.e2e.browser import Traffic, new_page, shot, sign_in
from tests.e2e.conftest import SQLITE_ONLY, Services, write_csv

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # the console's flow, not the database (see conftest)

ITERATIONS = 8
STUDY_URL = re.compile(r"/console/studies/([0-9a-f]+)(?:\?[^/]*)?$")


def _image_drawn(page: Any, selector: str, timeout: float = 15.0) -> bool:
    """The chart image has loaded and has a size (the page may still be swapping or reloading it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page.wait_for_load_state("load")
        try:
            if page.locator(selector).evaluate("img => img.complete && img.naturalWidth > 0"):
                return True
        except PlaywrightError:  # (the element went away in a swap or a reload)
            pass
        time.sleep(0.2)
    return False


def _upload(page: Any, base: str, csv: Path, name: str, *, objective: str | None) -> int:
    page.goto(f"{base}/console/datasets")
    page.set_input_files("#upload-form input[name=file]", str(csv))
    page.fill("#upload-form input[name=name]", name)
    if objective is not None:
        page.fill("#upload-form input[name=objective]", objective)
    page.click("#upload-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/datasets/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def _release(page: Any) -> int:
    page.click("#release-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/datasets/\d+/releases/new\?"))  # what it costs, asked first
    assert "This spends privacy budget for good" in page.inner_text("#release-confirm")
    page.click("#release-confirm-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/releases/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def _curator_half(page: Any, services: Services, tmp: Path, tag: str) -> dict[str, Any]:
    base = services.curator.url
    sign_in(page, base, services.admin_token)
    y = write_csv(tmp / "trial.csv", n=300, d=3, seed=11)
    manual_rows = np.loadtxt(tmp / "trial.csv", delimiter=",", skiprows=1)[:, :3]
    with open(tmp / "manual.csv", "w", encoding="utf-8") as fh:  # no outcome column: measured by hand
        fh.write("a,b,c\n" + "\n".join(",".join(f"{v:.6f}" for v in row) for row in manual_rows) + "\n")

    column_id = _upload(page, base, tmp / "trial.csv", "trial cohort", objective="objective")
    report = page.locator("#privacy-report")
    assert report.is_visible()
    assert page.locator("#r-table tbody tr").count() >= 1
    assert "trial cohort" in page.inner_text("main")
    shot(page, f"curator-dataset-{tag}")
    column_release = _release(page)
    assert column_release > 0

    manual_id = _upload(page, base, tmp / "manual.csv", "bedside measurements", objective=None)
    assert manual_id != column_id
    manual_release = _release(page)

    page.goto(f"{base}/console/releases")
    assert page.locator("#releases tbody tr").count() == 2
    shot(page, f"curator-releases-{tag}")

    page.goto(f"{base}/console/partners")
    page.fill("#partner-form input[name=name]", "north consultancy")
    page.fill("#partner-form input[name=max_queries]", "100")
    for release_id in (column_release, manual_release):
        page.check(f"#partner-form input[name=release_ids][value='{release_id}']")
    page.click("#partner-form button[type=submit]")
    token = page.inner_text("#partner-token").strip()
    assert len(token) >= 24
    shot(page, f"curator-partner-created-{tag}")
    page.goto(f"{base}/console/partners")
    assert token not in page.content()  # shown once
    assert "north consultancy" in page.inner_text("#partners")

    page.goto(f"{base}/console")
    assert page.locator("#budget-chart").is_visible()
    assert _image_drawn(page, "#budget-chart")
    shot(page, f"curator-overview-{tag}")
    return {"token": token, "column_release": column_release, "manual_release": manual_release, "y": y}


def _create_study(
    page: Any, base: str, curator_url: str, token: str, release_id: int, iterations: int
) -> str:
    page.goto(f"{base}/console/studies/new?strategy=gp-ucb")
    form = page.locator("#study-form")
    form.locator("input[name=curator_url]").fill(curator_url)
    form.locator("input[name=curator_token]").fill(token)
    form.locator("input[name=release_id]").fill(str(release_id))
    form.locator("input[name=iterations]").fill(str(iterations))
    assert form.locator("[name^='param.']").count() >= 1  # the strategy's parameters, from its JSON schema
    page.click("#create-study")
    page.wait_for_url(STUDY_URL)
    found = STUDY_URL.search(page.url)
    assert found is not None
    return found.group(1)


def test_both_consoles_end_to_end(browser: Any, services: Services, tmp_path: Path, request: Any) -> None:
    tag = request.node.callspec.params["services"]
    traffic = Traffic(allowed=(services.curator.url + "/", services.modeler.url + "/"))
    curator = new_page(browser, traffic)
    found = _curator_half(curator, services, tmp_path, tag)

    # ---- the modeler's team: a study from the form, run to the end while the page polls
    modeler = new_page(browser, traffic)
    base = services.modeler.url
    sign_in(modeler, base, services.modeler_token)
    modeler.goto(f"{base}/console/studies/new?strategy=gp-ucb")
    shot(modeler, f"modeler-new-study-{tag}")
    study = _create_study(
        modeler, base, services.curator.url, found["token"], found["column_release"], ITERATIONS
    )
    modeler.click("#run-form button[type=submit]")
    modeler.wait_for_url(re.compile(re.escape(f"/console/studies/{study}") + r"(\?[^/]*)?$"))
    # htmx swaps the live section in place until the study is done (no reload by the test)
    expect(modeler.locator("#study-status")).to_have_text("done", timeout=120_000)
    best = float(modeler.inner_text("#best-value").strip())
    assert best in set(np.round(found["y"], 6).tolist()) or min(abs(best - v) for v in found["y"]) < 1e-5
    assert modeler.locator("#audit tbody tr").count() == ITERATIONS
    assert _image_drawn(modeler, "#best-chart")
    shot(modeler, f"modeler-study-{tag}")
    modeler.click("#audit-verify-link")
    assert "ok" in modeler.inner_text("#audit-verify").lower()
    assert found["token"] not in modeler.content()  # the curator token is never rendered back
    modeler.goto(f"{base}/console")
    assert study[:8] in modeler.inner_text("#studies")
    shot(modeler, f"modeler-studies-{tag}")

    # ---- a manual measurement: one step on the manual release, answered from the curator console
    manual = _create_study(modeler, base, services.curator.url, found["token"], found["manual_release"], 1)
    modeler.click("#step-form button[type=submit]")
    expect(modeler.locator("#study-status")).to_have_text("awaiting measurement", timeout=60_000)
    curator.goto(f"{services.curator.url}/console/queries")
    rows = curator.locator("#pending-queries tbody tr[id^=query-]")
    assert rows.count() == 1
    shot(curator, f"curator-queries-{tag}")
    rows.first.locator("input[name=value]").fill("42.125")
    rows.first.locator("button[type=submit]").click()
    curator.wait_for_url(re.compile(r"/console/queries$"))
    assert curator.locator("#pending-queries tbody tr[id^=query-]").count() == 0
    expect(modeler.locator("#study-status")).to_have_text("done", timeout=60_000)
    assert float(modeler.inner_text("#best-value")) == pytest.approx(42.125)
    assert manual != study

    # ---- both logs verified from the pages
    curator.goto(f"{services.curator.url}/console/releases/{found['column_release']}")
    assert curator.locator("#query-log tbody tr").count() == ITERATIONS
    curator.click("#verify-link")
    assert curator.get_attribute("#verify-result", "data-ok") == "true"
    shot(curator, f"curator-release-verified-{tag}")
    curator.goto(f"{services.curator.url}/console/access-log")
    assert curator.locator("#access-log tbody tr").count() > ITERATIONS
    shot(curator, f"curator-access-log-{tag}")
    assert traffic.outside == [], traffic.outside
    curator.context.close()
    modeler.context.close()
