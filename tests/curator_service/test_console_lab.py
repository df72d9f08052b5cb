"""The curator console's lab workflow (issue 34): the upload form (the id column, every value kept after a
refusal, the delimiter named, post/redirect/get, the progress script), and the pending-queries page (sample
ids, the CSV sheet, measurements in bulk). In-process with the real app, on SQLite and on PostgreSQL when
``POBO_TEST_DATABASE_URL`` is set."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from curator_service.config import Settings
from curator_service.main import create_app
from tests.curator_service.conftest import ADMIN, ADMIN_TOKEN, bearer
from tests.curator_service.test_console import (
    MAX_UPLOAD,
    ROWS,
    assert_clean,
    error_message,
    page,
    post,
    sign_in,
    upload,
)


@pytest.fixture
def app(database_url: str, data_dir: Path) -> Iterator[object]:
    """The curator app with the console tests' upload limit (``test_console.app``'s twin)."""
    settings = Settings(
        database_url=database_url, data_dir=data_dir, admin_token=ADMIN_TOKEN, max_upload_bytes=MAX_UPLOAD
    )
    application = create_app(settings)
    yield application
    application.state.components.db.dispose()


@pytest.fixture
def browser(app: object) -> Iterator[TestClient]:
    """A signed-in browser (the admin token); ``pages`` collects every page it read."""
    with TestClient(app, base_url="http://testserver") as client:  # type: ignore[arg-type]
        assert sign_in(client, ADMIN_TOKEN).status_code == 303
        client.pages = []  # type: ignore[attr-defined]
        yield client


IDS = ["=HYPERLINK(1)", "S-101", "S-102", "S-103", "S-104", "S-105"]  # one id a spreadsheet would run


def lab_csv(sep: str = ",") -> bytes:
    lines = [sep.join(["sample", "a", "b", "c"])]
    lines += [sep.join([IDS[i], *(repr(v) for v in row[:3])]) for i, row in enumerate(ROWS)]
    return ("\n".join(lines) + "\n").encode()


def value_of(html: str, name: str) -> str | None:
    found = re.search(rf'name="{name}"[^>]*value="([^"]*)"', html)
    return None if found is None else found.group(1)


def test_the_upload_form_keeps_what_was_entered_and_names_the_delimiter(browser: TestClient) -> None:
    html = page(browser, "/console/datasets")
    assert 'name="id_column"' in html and "data-upload-progress" in html
    assert '<script src="/console/static/upload.js" defer></script>' in html
    entered = {
        "id_column": "sample",
        "population": "assay batch 7",
        "rows_per_person": "2",
        "epsilon_budget": "4.5",
        "objective_mode": "manual",
        "acknowledge_distinct_people": "true",
        "scaling": '{"a": 10}',
    }
    r = upload(browser, lab_csv(";"), name="assay-7", **entered)
    assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
    assert error_message(r.text).startswith("the file looks semicolon-separated: its header row (line 1) has")
    assert 'id="upload-refused"' in r.text and 'id="upload-form"' in r.text  # the form, not an error page
    assert value_of(r.text, "name") == "assay-7"
    for field in ("id_column", "population", "rows_per_person", "epsilon_budget"):
        assert value_of(r.text, field) == entered[field], field
    assert value_of(r.text, "scaling") == "{&#34;a&#34;: 10}"  # escaped, as every value on a page
    assert '<option value="manual" selected>' in r.text
    assert re.search(r'name="acknowledge_distinct_people" value="true" checked', r.text)
    assert browser.get("/v1/datasets", headers=ADMIN).json()["count"] == 0
    # a refusal from the service (a duplicate id) is shown the same way
    duplicated = lab_csv().replace(b"S-103", b"S-102")
    r = upload(browser, duplicated, name="assay-7", id_column="sample")
    assert r.status_code == 422
    assert error_message(r.text) == (
        "data row 4 repeats the id of data row 3 in the id column &#39;sample&#39;; every row needs its own "
        "id (fix the file, or leave id_column out)"
    )
    # accepted: post/redirect/get to the new dataset's page
    r = upload(browser, lab_csv(), name="assay-7", id_column="sample")
    assert r.status_code == 303 and re.fullmatch(r"/console/datasets/\d+", r.headers["location"])
    [ds] = browser.get("/v1/datasets", headers=ADMIN).json()["data"]
    assert (ds["id_column"], ds["features"]) == ("sample", ["a", "b", "c"])
    page(browser, r.headers["location"])
    assert_clean(browser)


def test_the_progress_script_is_local_and_reports_the_upload(browser: TestClient) -> None:
    r = browser.get("/console/static/upload.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    js = r.text
    assert 'xhr.upload.addEventListener("progress"' in js and "new FormData(form)" in js
    assert "http:" not in js and "https:" not in js and "eval(" not in js  # this origin only, no eval
    assert "script-src 'self'" in r.headers["content-security-policy"]


def test_the_pending_page_names_samples_exports_them_and_takes_a_sheet_back(browser: TestClient) -> None:
    assert upload(browser, lab_csv(), name="assay", id_column="sample").status_code == 303
    [ds] = browser.get("/v1/datasets", headers=ADMIN).json()["data"]
    rel = browser.post(f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5})
    release_id = rel.json()["id"]
    token = browser.post(
        "/v1/partners", headers=ADMIN, json={"name": "lab-x", "release_ids": [release_id], "max_queries": 9}
    ).json()["token"]
    asked = [
        browser.post(f"/v1/releases/{release_id}/queries", headers=bearer(token), json={"index": i}).json()
        for i in (0, 2, 4)
    ]
    html = page(browser, "/console/queries")
    assert (
        "<code>S-102</code>" in html and "<code>S-104</code>" in html and "<code>=HYPERLINK(1)</code>" in html
    )
    assert 'id="results-form"' in html and 'href="/console/queries.csv"' in html
    sheet = browser.get("/console/queries.csv")
    assert sheet.status_code == 200 and sheet.headers["content-type"].startswith("text/csv")
    assert sheet.headers["content-disposition"] == 'attachment; filename="pending-queries.csv"'
    rows = list(csv.DictReader(io.StringIO(sheet.text)))
    assert [(int(r["query_id"]), r["index"], r["sample_id"], r["y"]) for r in rows] == [
        (asked[0]["id"], "0", "'=HYPERLINK(1)", ""),  # formula-safe: a spreadsheet shows it as text
        (asked[1]["id"], "2", "S-102", ""),
        (asked[2]["id"], "4", "S-104", ""),
    ]
    assert rows[0]["partner"] == "lab-x" and rows[0]["release_id"] == str(release_id)

    def filled(values: list[str]) -> bytes:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows([r | {"y": v} for r, v in zip(rows, values, strict=True)])
        return out.getvalue().encode()

    def send(content: bytes) -> object:
        return post(browser, "/console/queries/results", {}, files={"file": ("y.csv", content, "text/csv")})

    r = send(filled(["1.5", "two", "2.5"]))
    assert r.status_code == 422  # type: ignore[attr-defined]
    assert error_message(r.text) == (  # type: ignore[attr-defined]
        "line 3, column &#39;y&#39;: not a number (write decimals with a point, e.g. 0.731)"
    )
    assert len(browser.get("/v1/queries", headers=ADMIN).json()["data"]) == 3  # nothing was posted
    r = send(filled(["1.5", "2.0", "2.5"]))
    assert r.status_code == 303 and r.headers["location"] == "/console/queries"  # type: ignore[attr-defined]
    shown = page(browser, "/console/queries")
    assert "3 queries answered from 3 line(s)" in shown and "Nothing is waiting." in shown
    assert "3 queries answered" not in page(browser, "/console/queries")  # the notice shows once
    answers = [browser.get(f"/v1/queries/{q['id']}", headers=bearer(token)).json()["y"] for q in asked]
    assert answers == [1.5, 2.0, 2.5]
    assert_clean(browser)
