"""The curator console's actions (issue 34): every POST in the durable access log with the operator's
console session as its actor (and never a value), budgets per population on the overview, confirmation
pages before what cannot be undone (a release, a gradient oracle, revoking a token), the gradient-oracle
form (post/redirect/get, a refusal shown with the values entered, the list with steps used and mu spent),
and a partner's page (its tokens, a change of quota). In-process with the real app, on SQLite and on
PostgreSQL when ``POBO_TEST_DATABASE_URL`` is set."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from fastapi.testclient import TestClient

from curator_service.config import Settings
from curator_service.console import pages as overview_pages
from curator_service.main import create_app
from shared.servicekit.console.charts import Bar
from tests.curator_service.conftest import ADMIN, ADMIN_TOKEN, bearer
from tests.curator_service.test_console import (
    CELLS,
    MAX_UPLOAD,
    assert_clean,
    csrf_of,
    csv_bytes,
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


ACTOR = re.compile(r"^admin@console:[0-9a-f]{8}$")
SE = {"kind": "se", "lengthscale": 1.0}


def _id(location: str) -> int:
    return int(location.rstrip("/").rsplit("/", 1)[1].split("?")[0])


def confirmed(client: TestClient, path: str, data: dict[str, str], page_id: str) -> Any:
    """A post of a form whose action cannot be undone: first sent to its confirmation page (a GET that
    changes nothing), whose hidden fields are then posted with ``confirm=yes``."""
    first = post(client, path, data)
    assert first.status_code == 303, first.text
    confirmation = first.headers["location"]
    html = page(client, confirmation)
    assert f'id="{page_id}"' in html and 'name="confirm" value="yes"' in html
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', html))
    assert dict(parse_qsl(urlsplit(confirmation).query)).items() <= hidden.items()
    hidden.pop("csrf_token")
    return post(client, path, hidden)


def access_log(client: TestClient) -> list[dict[str, Any]]:
    entries = client.get("/v1/access-log", headers=ADMIN, params={"limit": 10_000}).json()["entries"]
    return [e for e in entries if e["path"].startswith("/console")]


def test_every_console_action_is_in_the_access_log_with_the_operator_as_actor(browser: TestClient) -> None:
    api = browser
    # uploads: a column dataset and a manual one (its outcomes are measured at the console)
    r = upload(browser, csv_bytes(True), name="column", objective="outcome")
    assert r.status_code == 303, r.text
    column_id = _id(r.headers["location"])
    r = upload(browser, csv_bytes(False), name="manual")  # the same people: it joins the population
    manual_id = _id(r.headers["location"])
    # a release: a post of the form goes to the confirmation page first, and spends nothing there
    r = confirmed(
        browser,
        f"/console/datasets/{manual_id}/releases",
        {"epsilon": "1", "delta": "1e-5"},
        "release-confirm",
    )
    assert r.status_code == 303 and re.fullmatch(r"/console/releases/\d+", r.headers["location"])
    release_id = _id(r.headers["location"])
    assert api.get(f"/v1/datasets/{manual_id}/ledger", headers=ADMIN).json()[
        "epsilon_spent"
    ] == pytest.approx(1.0)
    # a gradient oracle (confirmed), a partner, a grant, a new token, a change, a token revoked
    r = confirmed(
        browser,
        f"/console/datasets/{column_id}/gradient-oracles",
        {
            "loss": "gaussian-location",
            "bounds": "-5, 5",
            "clip": "1",
            "mu": "1",
            "steps": "4",
            "delta": "1e-5",
        },
        "oracle-confirm",
    )
    assert r.status_code == 303, r.text
    r = post(
        browser, "/console/partners", {"name": "lab", "max_queries": "5", "release_ids": str(release_id)}
    )
    partner_id = int(r.headers["location"].split("/")[3])
    token = re.search(r'id="partner-token" class="secret">([^<]+)<', page(browser, r.headers["location"]))
    assert token is not None
    assert post(browser, "/console/partners/grants", {"partner_id": str(partner_id)}).status_code == 422
    r = post(browser, f"/console/partners/{partner_id}/tokens", {})
    assert r.status_code == 303
    assert post(browser, f"/console/partners/{partner_id}", {"max_queries": "9"}).status_code == 303
    tokens = api.get(f"/v1/partners/{partner_id}/tokens", headers=ADMIN).json()["data"]
    first_token = tokens[0]["id"]
    r = confirmed(
        browser, f"/console/partners/{partner_id}/tokens/{first_token}/revoke", {}, "token-revoke-form"
    )
    assert r.status_code == 303
    assert api.get("/v1/partners/me", headers=bearer(token.group(1))).status_code == 401
    # a measurement posted for a query of the manual release (asked with a token made through the API)
    fresh = api.post(f"/v1/partners/{partner_id}/tokens", headers=ADMIN).json()["token"]
    q = api.post(f"/v1/releases/{release_id}/queries", headers=bearer(fresh), json={"index": 1}).json()
    assert post(browser, f"/console/queries/{q['id']}/result", {"value": "0.731"}).status_code == 303
    # revoke the partner (confirmed)
    r = confirmed(browser, f"/console/partners/{partner_id}/revoke", {}, "revoke-form")
    assert r.status_code == 303

    entries = access_log(api)
    actions = [(e["method"], e["path"], e["status_code"]) for e in entries]
    expected = [
        ("POST", "/console/sign-in", 303),
        ("POST", "/console/datasets", 303),
        ("POST", f"/console/datasets/{manual_id}/releases", 303),
        ("POST", f"/console/datasets/{column_id}/gradient-oracles", 303),
        ("POST", "/console/partners", 303),
        ("POST", "/console/partners/grants", 422),
        ("POST", f"/console/partners/{partner_id}/tokens", 303),
        ("POST", f"/console/partners/{partner_id}", 303),
        ("POST", f"/console/partners/{partner_id}/tokens/{first_token}/revoke", 303),
        ("POST", f"/console/queries/{q['id']}/result", 303),
        ("POST", f"/console/partners/{partner_id}/revoke", 303),
    ]
    for action in expected:
        assert action in actions, action
    # a confirmed action is two entries: the form's post (sent to the confirmation) and the confirmation's
    assert actions.count(("POST", f"/console/datasets/{manual_id}/releases", 303)) == 2
    assert all(e["method"] == "POST" for e in entries)  # pages read (GET) are not actions
    actors = {e["actor"] for e in entries}
    assert len(actors) == 1 and ACTOR.fullmatch(actors.pop()), entries  # one sign-in, one actor
    assert all(e["partner_id"] is None for e in entries)
    text = repr(entries)
    for value in [*CELLS, "0.731", token.group(1)]:
        assert value not in text  # paths and actors only: never a form's value
    html = page(browser, "/console/access-log?limit=1000")
    assert "admin@console:" in html and f"/console/partners/{partner_id}/revoke" in html


def test_sign_ins_are_logged_each_session_with_its_own_tag(app: object) -> None:
    with (
        TestClient(app, base_url="http://testserver") as one,
        TestClient(app, base_url="http://testserver") as two,
    ):  # type: ignore[arg-type]
        assert sign_in(one, "not-the-admin-token-0123456789abcdef").status_code == 401
        assert sign_in(one, ADMIN_TOKEN).status_code == 303
        assert sign_in(two, ADMIN_TOKEN).status_code == 303
        one.pages = two.pages = []  # type: ignore[attr-defined]
        assert post(one, "/console/partners", {"name": "a", "max_queries": "1"}).status_code == 303
        assert post(two, "/console/partners", {"name": "b", "max_queries": "1"}).status_code == 303
        signed_out = one.post("/console/sign-out", data={"csrf_token": csrf_of(one)}, follow_redirects=False)
        assert signed_out.status_code == 303
        forged = one.post("/console/partners", data={"name": "c", "max_queries": "1", "csrf_token": "x"})
        assert forged.status_code == 403
        entries = access_log(one)
    by_action = [(e["actor"], e["path"], e["status_code"]) for e in entries]
    assert by_action[0] == ("anonymous", "/console/sign-in", 401)
    first, second = by_action[1][0], by_action[2][0]
    assert ACTOR.fullmatch(first) and ACTOR.fullmatch(second) and first != second
    assert (first, "/console/partners", 303) in by_action and (second, "/console/partners", 303) in by_action
    assert (first, "/console/sign-out", 303) in by_action
    assert ("anonymous", "/console/partners", 403) == by_action[-1]  # signed out: no session any more


def test_the_overview_shows_each_population_once_with_its_datasets(
    browser: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ward-a", "ward-b"):  # the same people twice: one population, one budget
        r = upload(browser, csv_bytes(False), name=name, population="ward 3", epsilon_budget="5")
        assert r.status_code == 303, r.text
    other = upload(
        browser,
        csv_bytes(True),
        name="other",
        objective="outcome",
        population="clinic",
        acknowledge_distinct_people="true",
    )
    assert other.status_code == 303, other.text
    a, b = (d["id"] for d in browser.get("/v1/datasets", headers=ADMIN).json()["data"][:2])
    confirmed(
        browser, f"/console/datasets/{a}/releases", {"epsilon": "1", "delta": "1e-5"}, "release-confirm"
    )
    confirmed(
        browser, f"/console/datasets/{b}/releases", {"epsilon": "0.5", "delta": "1e-5"}, "release-confirm"
    )
    populations = browser.get("/v1/populations", headers=ADMIN).json()["data"]
    ward = next(p for p in populations if p["name"] == "ward 3")
    assert sorted(ward["dataset_ids"]) == [a, b]

    html = page(browser, "/console")
    table = html.split('id="budget-table"')[1].split("</table>")[0]
    rows = re.findall(r'<tr id="population-(\d+)">(.*?)</tr>', table, re.S)
    assert [int(pid) for pid, _ in rows] == sorted(p["id"] for p in populations)  # one row per population
    ward_row = dict(rows)[str(ward["id"])]
    assert "ward 3" in ward_row and f"#{a} ward-a" in ward_row and f"#{b} ward-b" in ward_row
    assert re.findall(r'<td class="num">([^<]*)</td>', ward_row)[:2] == ["1.5", "5"]  # spent of the budget

    drawn: list[list[Bar]] = []

    def record(bars: list[Bar], **kw: Any) -> bytes:
        drawn.append(list(bars))
        return b"<svg/>"

    monkeypatch.setattr(overview_pages, "budget_chart", record)
    assert browser.get("/console/budget.svg").status_code == 200
    (bars,) = drawn
    assert len(bars) == 2  # one bar per population, not per dataset
    ward_bar = next(bar for bar in bars if "ward 3" in bar.label)
    assert (ward_bar.spent, ward_bar.total) == (pytest.approx(1.5), pytest.approx(5.0))


def test_the_gradient_oracle_form(browser: TestClient) -> None:
    api = browser
    r = upload(browser, csv_bytes(True), name="cohort", objective="outcome")
    dataset_id = _id(r.headers["location"])
    assert 'id="oracles-link"' in page(browser, f"/console/datasets/{dataset_id}")
    html = page(browser, f"/console/datasets/{dataset_id}/gradient-oracles")
    assert 'id="oracle-form"' in html and 'id="oracles"' in html and "No gradient oracle" in html
    base = f"/console/datasets/{dataset_id}/gradient-oracles"
    good = {
        "loss": "gaussian-location",
        "bounds": "-5, 5",
        "clip": "1",
        "mu": "0.5",
        "steps": "4",
        "delta": "1e-5",
    }

    # refusals: the form again, with the values entered and why (nothing is charged)
    for bad, status, message in (
        ({"clip": "lots"}, 422, "clip must be a number"),
        ({"bounds": "1, 2, 3"}, 422, "bounds, line 1"),
        ({"dimension": "5"}, 422, "dimension 3 = 3, not 5"),
        ({"loss": "huber-regression", "delta": "0.5"}, 422, "delta = 0.5 is not below 1/n"),
    ):
        fields = good | bad
        refused = browser.get(f"{base}/new", params=fields)
        assert refused.status_code == status, (bad, refused.text[:500])
        problem = re.search(r'id="oracle-problem">([^<]*)<', refused.text)
        assert problem is not None and message in problem.group(1).replace("&#39;", "'"), problem
        for name, value in bad.items():
            if name == "loss":
                assert f'<option value="{value}" selected>' in refused.text
            elif name == "bounds":
                assert f">{value}</textarea>" in refused.text
            else:
                assert f'name="{name}"' in refused.text and f'value="{value}"' in refused.text
    # a post that does not come from the confirmation page is sent there, and creates nothing
    r = post(browser, base, good)
    assert r.status_code == 303 and r.headers["location"].startswith(f"{base}/new?")
    confirm = page(browser, r.headers["location"])
    charged = float(re.search(r'id="charged-epsilon">([^ <]+)', confirm).group(1))  # type: ignore[union-attr]
    assert charged > 0 and "for each of the 3 coordinates" in confirm
    assert api.get("/v1/gradient-oracles", headers=ADMIN).json()["count"] == 0
    assert api.get(f"/v1/datasets/{dataset_id}/ledger", headers=ADMIN).json()["epsilon_spent"] == 0

    # confirmed: created, post/redirect/get to the list
    r = post(browser, base, good | {"confirm": "yes"})
    assert r.status_code == 303 and re.fullmatch(rf"{base}\?created=\d+", r.headers["location"])
    oracle_id = int(r.headers["location"].rsplit("=", 1)[1])
    oracle = api.get(f"/v1/gradient-oracles/{oracle_id}", headers=ADMIN).json()
    assert oracle["dimension"] == 3 and oracle["bounds"] == [[-5.0, 5.0]] * 3 and oracle["steps"] == 4
    ledger = api.get(f"/v1/datasets/{dataset_id}/ledger", headers=ADMIN).json()
    assert (
        ledger["epsilon_spent"] == pytest.approx(oracle["epsilon"])
        and f"{oracle['epsilon']:.4g}" == f"{charged:.4g}"
    )
    listed = page(browser, r.headers["location"])
    assert f"Gradient oracle #{oracle_id} created" in listed
    row = listed.split(f'id="oracle-{oracle_id}"')[1].split("</tr>")[0]
    assert "0 / 4" in row and "nobody yet" in row
    # a partner steps it once: the list shows 1 used, 3 left, mu spent mu sqrt(1/4)
    token = api.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "tuner", "max_queries": 0, "gradient_oracle_ids": [oracle_id]},
    ).json()["token"]
    step = api.post(
        f"/v1/gradient-oracles/{oracle_id}/steps",
        headers=bearer(token),
        json={"theta": [0.0, 0.0, 0.0], "points": [[0.1, 0.0, 0.0], [0.0, 0.1, 0.0]], "kernel": SE},
    )
    assert step.status_code == 201, step.text
    row = page(browser, base).split(f'id="oracle-{oracle_id}"')[1].split("</tr>")[0]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert "1 / 4" in row and "tuner" in row
    assert cells[2] == "3" and float(cells[3]) == pytest.approx(0.25) and float(cells[4]) == 0.5

    # over the budget: the confirmation says so, and the confirmed post is the form again with why (409)
    big = good | {"mu": "4", "steps": "1"}  # epsilon 24.9 > the default budget of 10
    confirm = page(browser, f"{base}/new?" + "&".join(f"{k}={v}" for k, v in big.items()))
    assert 'id="does-not-fit"' in confirm and 'id="oracle-confirm-form"' not in confirm
    r = post(browser, base, big | {"confirm": "yes"})
    assert r.status_code == 409 and "privacy budget exceeded" in r.text
    assert re.search(r'name="mu" step="any" min="0" value="4"', r.text)  # the values entered, kept
    assert api.get("/v1/gradient-oracles", headers=ADMIN).json()["count"] == 1
    page(browser, "/console/datasets/999/gradient-oracles", status=404)
    assert_clean(browser)


def test_a_release_asks_first_and_shows_what_it_costs(browser: TestClient) -> None:
    r = upload(browser, csv_bytes(False), name="ward", epsilon_budget="2")
    dataset_id = _id(r.headers["location"])
    path = f"/console/datasets/{dataset_id}/releases"
    r = post(browser, path, {"epsilon": "1.5", "delta": "1e-5", "r": "2"})
    assert r.status_code == 303 and r.headers["location"].startswith(f"{path}/new?")
    html = page(browser, r.headers["location"])
    assert "This spends privacy budget for good" in html and 'id="release-confirm-form"' in html
    assert re.search(r'id="epsilon-after">1\.5<', html)
    assert browser.get("/v1/releases", headers=ADMIN).json()["count"] == 0  # nothing yet
    assert (
        post(browser, path, {"epsilon": "1.5", "delta": "1e-5", "r": "2", "confirm": "yes"}).status_code
        == 303
    )
    # what no longer fits: said on the confirmation page; a bad value is a 422 page there
    html = page(browser, f"{path}/new?epsilon=1&delta=1e-5")
    assert 'id="does-not-fit"' in html and 'id="release-confirm-form"' not in html
    assert "epsilon" in error_message(page(browser, f"{path}/new?epsilon=x&delta=1e-5", status=422))
    refused = post(browser, path, {"epsilon": "1", "delta": "1e-5", "confirm": "yes"})
    assert refused.status_code == 409 and "budget" in error_message(refused.text)
    assert browser.get("/v1/releases", headers=ADMIN).json()["count"] == 1


def test_erasing_a_dataset_asks_first_names_its_holders_and_is_logged(browser: TestClient) -> None:
    api = browser
    r = upload(browser, csv_bytes(True), name="column", objective="outcome")
    dataset_id = _id(r.headers["location"])
    release = api.post(
        f"/v1/datasets/{dataset_id}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5}
    )
    partner = api.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "lab", "max_queries": 5, "release_ids": [release.json()["id"]]},
    ).json()
    assert 'id="erase-start-form"' in page(browser, f"/console/datasets/{dataset_id}")
    # the dataset page's button leads to the confirmation page, which names the partner holding it
    first = post(browser, f"/console/datasets/{dataset_id}/erase", {})
    assert first.status_code == 303 and first.headers["location"] == f"/console/datasets/{dataset_id}/erase"
    html = page(browser, first.headers["location"])
    assert (
        'id="erase-holders"' in html
        and f"/console/partners/{partner['id']}" in html
        and 'name="force"' in html
    )
    # confirmed without force: the 409, shown as the console's error page; nothing erased
    refused = post(browser, f"/console/datasets/{dataset_id}/erase", {"confirm": "yes"})
    assert refused.status_code == 409 and "still granted to partners" in refused.text
    assert api.get(f"/v1/datasets/{dataset_id}", headers=ADMIN).json()["erased_at"] is None
    # confirmed with force: post/redirect/get to the tombstone
    done = post(browser, f"/console/datasets/{dataset_id}/erase", {"confirm": "yes", "force": "true"})
    assert done.status_code == 303 and done.headers["location"] == f"/console/datasets/{dataset_id}"
    tomb = page(browser, done.headers["location"])
    assert 'id="erased-notice"' in tomb and 'id="release-form"' not in tomb
    assert api.get(f"/v1/datasets/{dataset_id}", headers=ADMIN).json()["erased_at"] is not None
    assert 'id="erase-form"' not in page(
        browser, f"/console/datasets/{dataset_id}/erase"
    )  # nothing left to do
    actions = [(e["method"], e["path"], e["status_code"]) for e in access_log(api)]
    erase = f"/console/datasets/{dataset_id}/erase"
    assert [a for a in actions if a[1] == erase] == [
        ("POST", erase, 303),
        ("POST", erase, 409),
        ("POST", erase, 303),
    ]
    assert_clean(browser)
