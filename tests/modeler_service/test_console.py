"""The modeler console (``/console``) and the stop API, against the fake curator: create a study through the
schema-built form, run / step / stop it, the live fragment and chart, the audit table, its verification and
exports; CSRF, the curator token never shown, every asset local."""

from __future__ import annotations

import csv
import io
import json
import re
import time
from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient

from tests.modeler_service.conftest import study_body
from tests.modeler_service.fake_curator import PARTNER_TOKEN, FakeCurator
from tests.modeler_service.test_studies import wait_for

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
FIXED = '{"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 0.0001}'


class _Page(HTMLParser):
    """Elements of a page: ids, every src/href, the rows of a table, the inputs of a form."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, dict[str, str | None]] = {}
        self.links: list[str] = []
        self.rows: dict[str, int] = {}
        self.inputs: list[dict[str, str | None]] = []
        self._tables: list[str] = []
        self._in_tbody = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids[str(a["id"])] = {"tag": tag, **a}
        for key in ("src", "href", "action", "hx-get"):
            if a.get(key):
                self.links.append(str(a[key]))
        if tag == "table":
            self._tables.append(str(a.get("id") or ""))
        if tag == "tbody":
            self._in_tbody = True
        if (
            tag == "tr"
            and self._in_tbody
            and self._tables
            and "data-seq" in a
            or tag == "tr"
            and "data-study-id" in a
        ):
            self.rows[self._tables[-1]] = self.rows.get(self._tables[-1], 0) + 1
        if tag in ("input", "select"):
            self.inputs.append({"tag": tag, **a})

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_tbody = False
        if tag == "table" and self._tables:
            self._tables.pop()


def page(html: str) -> _Page:
    parsed = _Page()
    parsed.feed(html)
    return parsed


def sign_in(client: TestClient) -> str:
    form = client.get("/console/sign-in")
    csrf = CSRF.search(form.text)
    assert csrf is not None
    token = client.headers["Authorization"].removeprefix("Bearer ")
    r = client.post(
        "/console/sign-in", data={"csrf_token": csrf.group(1), "token": token, "next": "/console"}
    )
    assert r.status_code == 200 and r.url.path == "/console"
    found = CSRF.search(r.text)
    assert found is not None
    return found.group(1)


def create_form(**overrides: str) -> dict[str, str]:
    data = {
        "curator_url": "http://curator.test",
        "curator_token": PARTNER_TOKEN,
        "release_id": "1",
        "iterations": "6",
        "strategy": "gp-ucb",
        "params_of": "gp-ucb",
        "param.initial_points": "2",
        "param.delta_prime": "0.1",
        "param.hyperparameters": FIXED,
        "param.exclude_queried": "true",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def check_local(html: str) -> None:
    for link in page(html).links:
        assert link.startswith("/") and not link.startswith("//"), link
    assert PARTNER_TOKEN not in html
    # the CSP forbids inline scripts and styles: none in the pages
    assert " style=" not in html and "<style" not in html and " onclick=" not in html
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/console/static/htmx.min.js" defer>']


# ------------------------------------------------------------------------------------------------ stop API


def test_stop_api_stops_a_running_study_after_the_round_in_flight(
    client: TestClient, curator: FakeCurator
) -> None:
    curator.manual = True  # each round waits for a measurement: the study is caught mid-run
    study = client.post("/v1/studies", json=study_body()).json()
    sid = study["id"]
    r = client.post(f"/v1/studies/{sid}/stop")
    assert r.status_code == 409 and "not running" in r.json()["detail"]
    assert client.post("/v1/studies/nope/stop").status_code == 404

    for expected_done in (1, 2):
        assert client.post(f"/v1/studies/{sid}/run").status_code == 202
        wait_for(client, sid, {"awaiting_measurement"})
        r = client.post(f"/v1/studies/{sid}/stop")
        assert r.status_code == 200, r.text
        stopped = r.json()
        assert stopped["status"] == "awaiting_measurement"  # stops once the round's answer arrives
        assert stopped["run_target"] == expected_done - 1  # (0: stop before the first round is recorded)
        (pending,) = curator.pending()
        curator.post_result(pending["id"], 0.5)
        done = wait_for(client, sid, {"ready", "done", "failed"})
        assert done["status"] == "ready" and done["iterations_done"] == expected_done
        assert done["run_target"] is None
        time.sleep(0.3)  # the runner asked nothing more of the curator
        assert curator.charged() == expected_done
    assert client.post(f"/v1/studies/{sid}/stop").status_code == 409


# ------------------------------------------------------------------------------------------------ console


def test_console_create_run_audit_and_exports(client: TestClient, curator: FakeCurator) -> None:
    assert client.get("/console", follow_redirects=False).status_code == 303  # not signed in
    csrf = sign_in(client)
    listing = client.get("/console")
    assert "studies" not in page(listing.text).ids and "no-studies" in page(listing.text).ids

    # the form: gp-ucb's parameters from its JSON schema
    form = client.get("/console/studies/new?strategy=gp-ucb")
    assert form.status_code == 200
    parsed = page(form.text)
    assert parsed.ids["study-form"]["action"] == "/console/studies/new"
    names = {i.get("name"): i for i in parsed.inputs}
    for name in ("curator_url", "curator_token", "release_id", "iterations", "strategy"):
        assert name in names, name
    assert names["curator_token"]["type"] == "password"
    assert "seed" not in names and "gradient_oracle_id" not in names
    delta = names["param.delta_prime"]
    assert (delta["type"], delta["step"], delta["min"], delta["max"]) == ("number", "any", "0", "1")
    assert names["param.initial_points"]["step"] == "1" and names["param.initial_points"]["min"] == "1"
    assert (
        names["param.exclude_queried"]["type"] == "checkbox" and "checked" in names["param.exclude_queried"]
    )
    assert names["param.hyperparameters"]["type"] == "text"
    # another strategy: its own fields (gp-bucb's batch size; dp-gibo's oracle id and updater enum)
    bucb = page(client.get("/console/studies/new?strategy=gp-bucb").text)
    assert any(i.get("name") == "param.batch_size" for i in bucb.inputs)
    gibo = client.get("/console/studies/new/params?strategy=dp-gibo")
    assert 'name="gradient_oracle_id"' in gibo.text and 'name="release_id"' not in gibo.text
    assert '<option value="adagrad" selected>' in gibo.text
    kept = client.get("/console/studies/new/params?strategy=gp-bucb&release_id=3&gradient_oracle_id=x")
    assert 'name="release_id" min="1" step="1" required value="3"' in kept.text
    assert client.get("/console/studies/new/params?strategy=nope").status_code == 404
    # "Choose" (no script) re-renders the form for the chosen strategy, the token not echoed
    chosen = client.post(
        "/console/studies/new", data={**create_form(strategy="gp-bucb"), "choose": "1", "csrf_token": csrf}
    )
    assert chosen.status_code == 200 and 'name="param.batch_size"' in chosen.text
    check_local(chosen.text)

    r = client.post(
        "/console/studies/new", data={**create_form(), "csrf_token": csrf}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    sid = r.headers["location"].split("/")[-1].split("?")[0]
    api_study = client.get(f"/v1/studies/{sid}").json()
    assert api_study["strategy_params"]["delta_prime"] == 0.1
    assert api_study["strategy_params"]["initial_points"] == 2
    assert api_study["strategy_params"]["hyperparameters"]["noise_variance"] == 0.0001

    # step once, then run to the end with the Run button
    study_page = client.get(f"/console/studies/{sid}")
    parsed = page(study_page.text)
    for element in (
        "study-live",
        "study-status",
        "best-value",
        "best-chart",
        "run-form",
        "step-form",
        "stop-form",
        "audit",
        "audit-csv",
        "audit-json",
    ):
        assert element in parsed.ids, element
    assert parsed.ids["study-live"].get("hx-get") is None  # not polling: the study is not active
    r = client.post(f"/console/studies/{sid}/step", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith(f"/console/studies/{sid}")
    assert client.get(f"/v1/studies/{sid}").json()["iterations_done"] == 1
    r = client.post(f"/console/studies/{sid}/run", data={"csrf_token": csrf, "iterations": "ten"})
    assert r.status_code == 422 and "not a whole number" in r.text
    r = client.post(f"/console/studies/{sid}/run", data={"csrf_token": csrf, "iterations": "99"})
    assert r.status_code == 422 and "iterations left" in r.text
    r = client.post(f"/console/studies/{sid}/run", data={"csrf_token": csrf, "iterations": ""})
    assert r.status_code == 200 and "Run started" in r.text
    running = page(r.text)
    done = wait_for(client, sid, {"done", "failed"})
    assert done["status"] == "done" and done["iterations_done"] == 6
    if running.ids["study-live"].get("hx-get"):  # caught running: the page polls its fragment
        assert running.ids["study-live"]["hx-get"] == f"/console/studies/{sid}/live?watching=1"
        assert running.ids["study-live"]["hx-trigger"] == "every 2s"

    # the live fragment and the chart
    live = client.get(f"/console/studies/{sid}/live?watching=1", headers={"HX-Request": "true"})
    assert live.headers.get("HX-Refresh") == "true"  # a watching page reloads once the study ends
    fragment = page(live.text)
    assert fragment.ids["study-status"]["data-status"] == "done"
    best = f"{done['best']['y']:.6g}"
    assert best in live.text
    assert fragment.ids["best-chart"]["src"] == f"/console/studies/{sid}/chart.svg?v=6"
    chart = client.get(f"/console/studies/{sid}/chart.svg")
    assert chart.headers["content-type"].startswith("image/svg+xml") and b"<svg" in chart.content

    # the list shows it done with its best value
    listing = client.get("/console")
    assert sid in listing.text and "status-done" in listing.text and best in listing.text
    assert page(listing.text).rows.get("studies") == 1
    check_local(listing.text)

    # the audit table, its verification and exports: the API's
    study_page = client.get(f"/console/studies/{sid}")
    api_log = client.get(f"/v1/studies/{sid}/audit").json()
    assert page(study_page.text).rows.get("audit") == api_log["count"] == 6
    for entry in api_log["entries"]:
        assert entry["hash"][:10] in study_page.text
    check_local(study_page.text)
    verify = client.get(f"/console/studies/{sid}/verify")
    assert 'id="audit-verify"' in verify.text and "intact" in verify.text
    verify_page = client.get(f"/console/studies/{sid}?verify=1")
    assert 'id="audit-verify"' in verify_page.text and "notice ok" in verify_page.text
    csv_export = client.get(f"/console/studies/{sid}/audit.csv")
    assert csv_export.text == client.get(f"/v1/studies/{sid}/audit?format=csv").text
    assert csv_export.headers["content-disposition"] == f'attachment; filename="audit-{sid}.csv"'
    assert len(list(csv.reader(io.StringIO(csv_export.text)))) == 7
    json_export = client.get(f"/console/studies/{sid}/audit.json")
    assert json.loads(json_export.text) == api_log
    assert json_export.headers["content-disposition"].startswith("attachment;")

    # done: run, step and stop are refused as HTML pages
    for action in ("run", "step", "stop"):
        r = client.post(f"/console/studies/{sid}/{action}", data={"csrf_token": csrf})
        assert r.status_code == 409 and "text/html" in r.headers["content-type"], action
        assert 'id="error-message"' in r.text
    assert client.get("/console/studies/nope").status_code == 404


def test_console_stop_button_and_csrf(client: TestClient, curator: FakeCurator) -> None:
    csrf = sign_in(client)
    curator.manual = True
    sid = client.post("/v1/studies", json=study_body()).json()["id"]
    # no CSRF token (or a wrong one): 403, nothing changes
    for data in ({}, {"csrf_token": "forged"}):
        r = client.post(f"/console/studies/{sid}/run", data=data)
        assert r.status_code == 403 and "CSRF" in r.text
    assert client.post("/console/studies/new", data=create_form()).status_code == 403
    assert client.get(f"/v1/studies/{sid}").json()["status"] == "ready"
    assert client.get("/v1/studies").json()["count"] == 1 and curator.charged() == 0

    r = client.post(
        f"/console/studies/{sid}/run", data={"csrf_token": csrf, "iterations": "3"}, follow_redirects=False
    )
    assert r.status_code == 303
    wait_for(client, sid, {"awaiting_measurement"})
    live = page(client.get(f"/console/studies/{sid}").text)
    assert live.ids["study-live"]["hx-get"] == f"/console/studies/{sid}/live?watching=1"
    assert live.ids["study-status"]["data-status"] == "awaiting_measurement"
    assert "pending-round" in live.ids
    listing = page(client.get("/console").text)  # the list polls its table while a study is active
    assert listing.ids["studies-block"]["hx-get"] == "/console/studies-table"
    assert 'data-study-id="' + sid in client.get("/console/studies-table").text
    r = client.post(f"/console/studies/{sid}/run", data={"csrf_token": csrf})
    assert r.status_code == 409 and "already" in r.text
    assert client.post(f"/console/studies/{sid}/stop", data={}).status_code == 403
    r = client.post(f"/console/studies/{sid}/stop", data={"csrf_token": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/console/studies/{sid}?notice=stop"
    (pending,) = curator.pending()
    curator.post_result(pending["id"], 0.25)
    stopped = wait_for(client, sid, {"ready", "done", "failed"})
    assert stopped["status"] == "ready" and stopped["iterations_done"] == 1
    r = client.post(f"/console/studies/{sid}/stop", data={"csrf_token": csrf})
    assert r.status_code == 409 and "not running" in r.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"param.initial_points": "-1"}, "initial_points"),
        ({"param.delta_prime": "lots"}, "is not a number"),
        ({"iterations": "many"}, "iterations"),
        ({"curator_url": "ftp://x"}, "curator_url"),
        ({"release_id": ""}, "release_id"),
        ({"strategy": "no-such", "params_of": "no-such"}, "no strategy named"),
    ],
)
def test_console_invalid_form_is_a_422_with_the_values_kept(
    client: TestClient, curator: FakeCurator, overrides: dict[str, str], message: str
) -> None:
    csrf = sign_in(client)
    r = client.post("/console/studies/new", data={**create_form(**overrides), "csrf_token": csrf})
    assert r.status_code == 422, r.text
    errors = re.search(r'id="form-errors">(.*?)</div>', r.text, re.DOTALL)
    assert errors is not None and message in errors.group(1), r.text
    assert PARTNER_TOKEN not in r.text  # the token is typed again
    if "curator_url" not in overrides:
        assert 'value="http://curator.test"' in r.text
    assert client.get("/v1/studies").json()["count"] == 0 and curator.charged() == 0


def test_console_curator_refusal_shows_the_form_again(client: TestClient, curator: FakeCurator) -> None:
    csrf = sign_in(client)
    r = client.post("/console/studies/new", data={**create_form(release_id="99"), "csrf_token": csrf})
    assert r.status_code == 404 and "form-errors" in page(r.text).ids
    assert PARTNER_TOKEN not in r.text
    r = client.post(
        "/console/studies/new", data={**create_form(curator_token="bad token"), "csrf_token": csrf}
    )
    assert r.status_code == 422 and "bad token" not in r.text


def test_console_gradient_oracle_study_shows_the_theta_path(client: TestClient, curator: FakeCurator) -> None:
    csrf = sign_in(client)
    data = {
        "curator_url": "http://curator.test",
        "curator_token": PARTNER_TOKEN,
        "gradient_oracle_id": "1",
        "iterations": "3",
        "strategy": "dp-gibo",
        "params_of": "dp-gibo",
        "param.updater": "gd",
        "param.batch_size": "2",
        "csrf_token": csrf,
    }
    r = client.post("/console/studies/new", data=data, follow_redirects=False)
    assert r.status_code == 303, r.text
    sid = r.headers["location"].split("/")[-1].split("?")[0]
    assert client.get(f"/v1/studies/{sid}").json()["strategy_params"]["updater"] == "gd"
    r = client.post(f"/console/studies/{sid}/step", data={"csrf_token": csrf})
    assert r.status_code == 200 and "One round done" in r.text
    assert "θ = (" in r.text
    chart = client.get(f"/console/studies/{sid}/chart.svg").text
    assert "theta[0]" in chart and "theta[1]" in chart
    assert page(r.text).rows.get("audit") == client.get(f"/v1/studies/{sid}/audit").json()["count"]
