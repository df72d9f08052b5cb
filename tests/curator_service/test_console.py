"""The curator console's pages, driven in-process with the real app (SQLite, and PostgreSQL when
``POBO_TEST_DATABASE_URL`` is set): every page renders real data, every form calls the same service as the
API, and the privacy rules hold (no raw row value on any page, a partner token shown once, local assets
only, CSRF on every POST, the upload limit).

The frame itself (sign-in, cookies, CSRF details, headers) is tested in tests/shared/test_console_kit.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import update

from curator_service.config import Settings
from curator_service.main import UPLOAD_SLACK_BYTES, create_app
from curator_service.models import Query
from tests.curator_service.conftest import ADMIN, ADMIN_TOKEN, bearer

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
LINKS = re.compile(r'\b(?:src|href|action)="([^"]*)"')
MAX_UPLOAD = 20_000

#: Distinctive cell values: none of them may ever appear on a page.
ROWS = [
    [123.456789, 234.567891, 345.678912, 17.654321],
    [456.789123, 567.891234, 678.912345, 18.765432],
    [789.123456, 891.234567, 912.345678, 19.876543],
    [321.987654, 432.198765, 543.219876, 20.987654],
    [654.321987, 765.432198, 876.543219, 21.198765],
    [987.654321, 198.765432, 219.876543, 22.219876],
]
CELLS = [repr(v) for row in ROWS for v in row]


def csv_bytes(objective: bool) -> bytes:
    header = "a,b,c" + (",outcome" if objective else "")
    lines = [header] + [",".join(repr(v) for v in (row if objective else row[:3])) for row in ROWS]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def app(database_url: str, data_dir: Path) -> Iterator[object]:
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
        client.pages = []
        yield client


def sign_in(client: TestClient, token: str) -> Response:
    form = client.get("/console/sign-in")
    csrf = CSRF.search(form.text)
    assert csrf is not None
    return client.post(
        "/console/sign-in",
        data={"csrf_token": csrf.group(1), "token": token, "next": "/console"},
        follow_redirects=False,
    )


def page(client: TestClient, path: str, status: int = 200) -> str:
    r = client.get(path, follow_redirects=False)
    assert r.status_code == status, (path, r.status_code, r.text[:2000])
    if r.headers["content-type"].startswith("text/html"):
        client.pages.append((path, r.text))
    return r.text


def csrf_of(client: TestClient) -> str:
    found = CSRF.search(client.get("/console").text)
    assert found is not None
    return found.group(1)


def post(client: TestClient, path: str, data: dict[str, object], **kw: object) -> Response:
    r = client.post(path, data={"csrf_token": csrf_of(client), **data}, follow_redirects=False, **kw)
    if r.headers.get("content-type", "").startswith("text/html"):
        client.pages.append((path, r.text))
    return r


def upload(client: TestClient, content: bytes, name: str = "cohort", **form: object) -> Response:
    return post(
        client, "/console/datasets", {"name": name, **form}, files={"file": ("d.csv", content, "text/csv")}
    )


def error_message(html: str) -> str:
    found = re.search(r'id="error-message">([^<]*)<', html)
    assert found is not None, html[:2000]
    return found.group(1)


def assert_clean(client: TestClient) -> None:
    """No page holds a raw cell of the uploaded CSV, and every link, image and form stays on this console."""
    pages = client.pages
    assert pages
    for path, html in pages:
        for cell in CELLS:
            assert cell not in html, (path, cell)
        for link in LINKS.findall(html):
            assert link.startswith(("/", "#")) and not link.startswith("//"), (path, link)


def test_the_console_runs_the_curators_whole_flow(browser: TestClient) -> None:
    api = browser
    html = page(browser, "/console/datasets")
    assert 'id="upload-form"' in html and 'id="datasets"' in html

    # upload: a manual dataset (no objective) and a column one, with the optional fields
    r = upload(browser, csv_bytes(False), name="ward-manual", population="ward 3", epsilon_budget="5")
    assert r.status_code == 303, r.text
    manual_id = int(r.headers["location"].rsplit("/", 1)[1])
    r = upload(browser, csv_bytes(True), name="ward-column", objective="outcome", scaling='{"a": 10}')
    assert r.status_code == 303, r.text
    column_id = int(r.headers["location"].rsplit("/", 1)[1])
    listed = page(browser, "/console/datasets")
    assert "ward-manual" in listed and "ward-column" in listed and "6 × 3" in listed

    # the dataset page: shape, scaling, the privacy report with its r table, the budget chart, the forms
    html = page(browser, f"/console/datasets/{column_id}")
    for marker in (
        'id="privacy-report"',
        'id="r-table"',
        'id="budget-chart"',
        'id="release-form"',
        "per feature",
    ):
        assert marker in html, marker
    report = api.get(
        f"/v1/datasets/{column_id}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5, "r_max": 30}
    ).json()
    assert len(re.findall(r"<tr><td class=\"num\">\d+</td>", html.split('id="r-table"')[1])) == len(
        report["table"]
    )
    assert report["guarantee"].split(".")[0].replace("'", "&#39;") in html
    chart = browser.get(f"/console/datasets/{column_id}/budget.svg")
    assert chart.status_code == 200 and chart.headers["content-type"].startswith("image/svg+xml")
    assert "<svg" in chart.text
    html = page(browser, f"/console/datasets/{manual_id}?epsilon=2&delta=1e-6&r_max=5")
    assert html.count('<tr><td class="num">') >= 5 and 'value="2.0"' in html

    # make releases (the same service as the API: the ledger is charged)
    # (the confirmation page's post: ``test_console_actions`` covers the page itself)
    r = post(
        browser,
        f"/console/datasets/{manual_id}/releases",
        {"epsilon": "1", "delta": "1e-5", "confirm": "yes"},
    )
    assert r.status_code == 303, r.text
    release_id = int(r.headers["location"].rsplit("/", 1)[1])
    r = post(
        browser,
        f"/console/datasets/{manual_id}/releases",
        {"epsilon": "0.5", "delta": "1e-5", "r": "2", "confirm": "yes"},
    )
    assert r.status_code == 303, r.text
    second_id = int(r.headers["location"].rsplit("/", 1)[1])
    ledger = api.get(f"/v1/datasets/{manual_id}/ledger", headers=ADMIN).json()
    assert ledger["epsilon_spent"] == pytest.approx(1.5)
    refused = post(
        browser,
        f"/console/datasets/{manual_id}/releases",
        {"epsilon": "4", "delta": "1e-5", "confirm": "yes"},
    )
    assert refused.status_code == 409 and "budget" in error_message(refused.text)
    unsafe = post(
        browser,
        f"/console/datasets/{manual_id}/releases",
        {"epsilon": "1", "delta": "1e-5", "r": "2", "mechanism": "po-gp-ucb", "confirm": "yes"},
    )
    assert unsafe.status_code == 422 and "acknowledge_no_guarantee" in error_message(unsafe.text)
    assert api.get(f"/v1/datasets/{manual_id}/ledger", headers=ADMIN).json()[
        "epsilon_spent"
    ] == pytest.approx(1.5)
    release = api.get(f"/v1/releases/{release_id}", headers=ADMIN).json()
    html = page(browser, "/console/releases")
    assert 'id="releases"' in html and release["sha256"] in html

    # a partner: the token is shown once
    r = post(
        browser, "/console/partners", {"name": "lab-x", "max_queries": "4", "release_ids": str(release_id)}
    )
    assert r.status_code == 303, r.text  # post/redirect/get: the token is on the page it redirects to
    shown_at = r.headers["location"]
    assert re.fullmatch(r"/console/partners/\d+/token", shown_at)
    shown = page(browser, shown_at)
    token_match = re.search(r'<p id="partner-token" class="secret">([^<]+)</p>', shown)
    assert token_match is not None and "will not be shown again" in shown
    token = token_match.group(1)
    again = page(browser, shown_at)  # a reload creates nothing and shows the token no more
    assert token not in again and 'id="token-gone"' in again
    assert api.get("/v1/partners", headers=ADMIN).json()["count"] == 1
    partner = api.get("/v1/partners/me", headers=bearer(token)).json()
    assert partner["name"] == "lab-x" and partner["release_ids"] == [release_id]
    html = page(browser, "/console/partners")
    assert 'id="partners"' in html and "lab-x" in html and token not in html
    assert 'id="partner-form"' in html and 'id="grant-form"' in html
    assert all(token not in p for _, p in browser.pages if 'id="partner-token"' not in p)

    # a manual query answered from the console; bad values are a 422 page and change nothing
    q = api.post(f"/v1/releases/{release_id}/queries", headers=bearer(token), json={"index": 2}).json()
    assert q["status"] == "pending"
    html = page(browser, "/console/queries")
    assert 'id="pending-queries"' in html and 'class="row measure-form"' in html and "lab-x" in html
    row = html.split(f'id="query-{q["id"]}"')[1].split("</tr>")[0]
    assert f"#{release_id}" in row and '<td class="num">2</td>' in row
    for bad in ("nan", "inf", "-Infinity", "abc", ""):
        r = post(browser, f"/console/queries/{q['id']}/result", {"value": bad})
        assert r.status_code == 422, bad
        assert "number" in error_message(r.text)
    assert api.get(f"/v1/queries/{q['id']}", headers=ADMIN).json()["status"] == "pending"
    r = post(browser, f"/console/queries/{q['id']}/result", {"value": "0.731"})
    assert r.status_code == 303 and r.headers["location"] == "/console/queries"
    answered = api.get(f"/v1/queries/{q['id']}", headers=bearer(token)).json()
    assert answered["status"] == "complete" and answered["y"] == 0.731
    assert f'id="query-{q["id"]}"' not in page(browser, "/console/queries")
    again = post(browser, f"/console/queries/{q['id']}/result", {"value": "1"})
    assert again.status_code == 409 and "already complete" in error_message(again.text)

    # the release page: the query log and its verification
    html = page(browser, f"/console/releases/{release_id}")
    assert 'id="query-log"' in html and "0.731" not in html and 'id="verify-result"' not in html
    assert "lab-x" in html
    html = page(browser, f"/console/releases/{release_id}/verify")
    result = html.split('id="verify-result"')[1].split("</section>")[0]
    assert 'data-ok="true"' in html and "intact" in result and "1 entries" in result

    # grant the second release, then revoke the partner
    pid = partner["id"]
    r = post(browser, "/console/partners/grants", {"partner_id": str(pid), "release_ids": str(second_id)})
    assert r.status_code == 303 and r.headers["location"] == "/console/partners"
    assert api.get(f"/v1/partners/{pid}", headers=ADMIN).json()["release_ids"] == [release_id, second_id]
    assert post(browser, "/console/partners/grants", {"partner_id": str(pid)}).status_code == 422
    assert (
        post(browser, "/console/partners/grants", {"partner_id": "999", "release_ids": "1"}).status_code
        == 404
    )
    html = page(browser, "/console/partners")
    assert f"/console/partners/{pid}/revoke" in html and "1 / 4" in html
    r = post(browser, f"/console/partners/{pid}/revoke", {})  # not from the confirmation page: asks first
    assert r.status_code == 303 and r.headers["location"] == f"/console/partners/{pid}/revoke"
    assert api.get("/v1/partners/me", headers=bearer(token)).status_code == 200
    confirm = page(browser, f"/console/partners/{pid}/revoke")
    assert "This cannot be undone" in confirm and 'name="confirm" value="yes"' in confirm
    r = post(browser, f"/console/partners/{pid}/revoke", {"confirm": "yes"})
    assert r.status_code == 303
    assert api.get("/v1/partners/me", headers=bearer(token)).status_code == 401
    html = page(browser, "/console/partners")
    assert "status-revoked" in html and f"/console/partners/{pid}/revoke" not in html

    # the access log, its filters and paging
    html = page(browser, "/console/access-log")
    assert 'id="access-log"' in html and 'id="access-filter"' in html and f"partner:{pid}" in html
    html = page(browser, f"/console/access-log?partner_id={pid}&after_id=&limit=1000")
    body = html.split('id="access-log"')[1]
    assert f"partner:{pid}" in body and ">admin<" not in body
    html = page(browser, "/console/access-log?limit=2")
    assert 'id="next-page"' in html and html.count('<td class="num"><span class="badge') == 2
    assert "x" in error_message(page(browser, "/console/access-log?partner_id=x", status=422))

    # the overview: counts and the budget chart
    html = page(browser, "/console")
    counts = re.findall(r'<div class="stat">(\d+)</div>', html)
    assert counts == ["2", "2", "0", "0"]
    assert 'id="budget-chart"' in html and browser.get("/console/budget.svg").status_code == 200
    # a tampered query log: the verification names the first bad entry
    db = browser.app.state.components.db  # type: ignore[attr-defined]
    with db.session(write=True) as s:
        s.execute(update(Query).where(Query.id == q["id"]).values(y=0.5))
        s.commit()
    html = page(browser, f"/console/releases/{release_id}/verify")
    result = html.split('id="verify-result"')[1].split("</section>")[0]
    assert 'data-ok="false"' in html and "broken" in result and 'id="first-bad-seq">' in result
    page(browser, "/console/datasets/999", status=404)
    page(browser, "/console/releases/999", status=404)
    assert_clean(browser)


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(browser: TestClient) -> None:
    r = browser.post("/console/partners", data={"name": "p", "max_queries": "3"}, follow_redirects=False)
    assert r.status_code == 403 and "CSRF" in r.text
    r = browser.post(
        "/console/datasets",
        data={"name": "x", "csrf_token": "forged"},
        files={"file": ("d.csv", csv_bytes(False), "text/csv")},
        follow_redirects=False,
    )
    assert r.status_code == 403
    assert browser.get("/v1/partners", headers=ADMIN).json()["count"] == 0
    assert browser.get("/v1/datasets", headers=ADMIN).json()["count"] == 0
    # a partner token never opens a console session
    token = browser.post("/v1/partners", headers=ADMIN, json={"name": "p", "max_queries": 1}).json()["token"]
    with TestClient(browser.app, base_url="http://testserver") as other:
        refused = sign_in(other, token)
        assert refused.status_code == 401 and "pobo_curator_console=" not in refused.headers.get(
            "set-cookie", ""
        )
        assert other.get("/console/partners", follow_redirects=False).status_code == 303


def test_upload_limits_and_bad_csvs_are_html_pages_and_store_nothing(
    browser: TestClient, data_dir: Path
) -> None:
    def stored() -> list[Path]:
        return (
            [p for p in (data_dir / "datasets").rglob("*") if p.is_file()]
            if (data_dir / "datasets").exists()
            else []
        )

    big_row = ",".join(["123.456789"] * 3) + "\n"
    over_limit = b"a,b,c\n" + big_row.encode() * (MAX_UPLOAD // len(big_row) + 5)  # > the limit, < the slack
    r = upload(browser, over_limit)
    assert r.status_code == 413 and f"limit is {MAX_UPLOAD} bytes" in error_message(r.text)
    huge = b"a,b,c\n" + big_row.encode() * ((MAX_UPLOAD + UPLOAD_SLACK_BYTES) // len(big_row) + 5)
    r = upload(browser, huge)  # refused while the body is read, before any parsing
    assert r.status_code == 413 and r.headers["content-type"].startswith("text/html")
    assert f"limit of {MAX_UPLOAD} bytes" in error_message(r.text)

    ragged = b"a,b,c\n1.5,2.5,3.5\n1.5,2.5\n4.5,5.5,6.5\n"
    r = upload(browser, ragged)
    assert r.status_code == 422 and r.headers["content-type"].startswith("text/html")
    assert "line 3" in error_message(r.text) or "row 2" in error_message(r.text)
    r = upload(browser, b"a,b\n1.5,nan\n2.5,3.5\n3.5,4.5\n")
    assert r.status_code == 422 and error_message(r.text)
    r = upload(browser, csv_bytes(False), noise_std="lots")
    assert r.status_code == 422 and "noise_std must be a number" in error_message(r.text)
    r = upload(browser, csv_bytes(False), name=" ")
    assert r.status_code == 422
    assert browser.get("/v1/datasets", headers=ADMIN).json()["count"] == 0
    assert stored() == []
    # a JSON body limit does not apply to the console upload, and a small CSV still goes through
    assert upload(browser, csv_bytes(False)).status_code == 303
    assert browser.get("/v1/datasets", headers=ADMIN).json()["count"] == 1
