"""The curator console's forms of issue 34 in headless Chromium, and the modeler console's federation pages.

The officer uploads a manual dataset with an id column (its population shared with a second dataset), makes
a release through its confirmation page, creates a gradient oracle through its own (after a refused value
comes back with the values entered), creates two partners (the token shown once), gives one a new token
and revokes the old one (confirmation first), changes its quota, tightens the other's output privacy (a
looser one is refused) and revokes it (confirmation first). A study of the modeler takes one step on the
release with the new token; the pending-queries page shows the row's sample id, its CSV sheet is
downloaded, refused unfilled, filled and posted back: the query is complete and the study done. Every
result page (and confirmation page) is reloaded and nothing new is created (counted through the admin
API); the access log lists exactly the console's posts (a reload adds none), all under one
``admin@console:<tag>``; the overview shows the shared budget once, with both datasets.
A federation run over the modeler's API shows on the modeler console's federation pages. Every page is
screenshotted; no request leaves the two services (any other is recorded and aborted).
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import expect

from tests.e2e.browser import Traffic, new_page, shot, sign_in
from tests.e2e.conftest import SQLITE_ONLY, Services
from tests.e2e.test_two_party import FIXED_HP, wait_status

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # the console's forms, not the database (see conftest)

N_ROWS = 60
MEASURED = 3.25
OMEGA = [0.3125, -0.1875, 0.4375, 0.0625, 0.5625, -0.4375, 0.2188, 0.1094]
TIMEOUT = 30_000


def sample_id(i: int) -> str:
    return f"W7-{i:03d}"


def _write_manual(path: Path) -> None:
    """Sample ids and three features, no outcome column: measured by hand."""
    X = np.random.default_rng(7).normal(0.0, 1.0, (N_ROWS, 3))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("sample,a,b,c\n")
        for i, row in enumerate(X):
            fh.write(",".join([sample_id(i), *(f"{v:.6f}" for v in row)]) + "\n")


def _write_followup(path: Path) -> None:
    """Another dataset of the same people's population (other columns, other rows: no fingerprint match)."""
    X = np.random.default_rng(8).uniform(10.0, 20.0, (N_ROWS // 2, 2))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("p,q\n" + "\n".join(f"{u:.4f},{v:.4f}" for u, v in X) + "\n")


def _admin_http(services: Services) -> httpx.Client:
    return httpx.Client(
        base_url=services.curator.url,
        headers={"Authorization": f"Bearer {services.admin_token}"},
        timeout=30,
    )


def _counts(services: Services) -> dict[str, Any]:
    """What the forms create, read through the admin API."""
    with services.admin() as admin:
        partners = admin.list_partners().data
        counts: dict[str, Any] = {
            "datasets": admin.list_datasets().count,
            "releases": admin.list_releases().count,
            "oracles": admin.list_gradient_oracles().count,
            "partners": len(partners),
            "revoked": sorted(p.id for p in partners if p.revoked),
            "quotas": {p.id: p.max_queries for p in partners},
            "complete": admin.lab_queries("complete").count,
            "pending": admin.lab_queries("pending").count,
        }
    with _admin_http(services) as http:
        tokens = [http.get(f"/v1/partners/{p.id}/tokens").json()["data"] for p in partners]
    counts["tokens"] = sorted((t["id"], t["revoked"]) for ts in tokens for t in ts)
    return counts


def _reload_creates_nothing(page: Any, services: Services, before: dict[str, Any]) -> None:
    url = page.url
    page.reload()
    page.wait_for_load_state("load")
    assert page.url == url
    assert _counts(services) == before


def _image_drawn(page: Any, selector: str) -> None:
    page.wait_for_function(
        "s => { const i = document.querySelector(s); return !!i && i.complete && i.naturalWidth > 0; }",
        arg=selector,
        timeout=TIMEOUT,
    )


def _run_federation(services: Services) -> tuple[str, list[dict[str, Any]]]:
    """Two rounds over the API: both agents submit in round 1, the first only in round 2."""
    body = {
        "dimension": 2,
        "bounds": [[0, 1], [-2, 2]],
        "P": 2,
        "M": 8,
        "q": 1.0,
        "z": 5.0,
        "S": 1.0,
        "rounds": 2,
        "epsilon_budget": 10.0,
        "round_seconds": 8.0,  # submissions fit in a round on a loaded runner (3 s did not, under load)
        "lengthscale": 0.3,
    }
    with services.modeler_http() as http:
        created = http.post("/v1/federations", json=body)
        assert created.status_code == 201, created.text
        fid = created.json()["id"]
        agents = []
        for k in range(2):
            r = http.post(f"/v1/federations/{fid}/agents", json={"name": f"hospital-{k}"})
            assert r.status_code == 201, r.text
            agents.append(r.json())
        assert http.post(f"/v1/federations/{fid}/start").status_code == 200
        for t, submitting in ((1, agents), (2, agents[:1])):
            for agent in submitting:
                r = http.post(
                    f"/v1/federations/{fid}/rounds/{t}/submissions",
                    json={"omega": OMEGA},
                    headers={
                        "Authorization": f"Bearer {agent['token']}",
                        "Idempotency-Key": f"{fid}:{agent['id']}:{t}",
                    },
                )
                assert r.status_code == 202, r.text
            closed = http.get(f"/v1/federations/{fid}/rounds/{t}", params={"wait": 30}).json()
            assert closed["status"] == "closed", closed
        fed = http.get(f"/v1/federations/{fid}").json()
        assert fed["status"] == "done" and fed["rounds_closed"] == 2, fed
    return fid, agents


def _upload_manual(page: Any, services: Services, csv_path: Path) -> int:
    base = services.curator.url
    page.goto(f"{base}/console/datasets")
    page.set_input_files("#upload-form input[name=file]", str(csv_path))
    page.fill("#upload-form input[name=name]", "ward 7 samples")
    page.fill("#upload-form input[name=id_column]", "sample")
    page.fill("#upload-form input[name=population]", "ward 7")
    page.select_option("#upload-form select[name=objective_mode]", "manual")
    page.click("#upload-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/datasets/\d+$"))
    dataset_id = int(page.url.rsplit("/", 1)[1])
    assert "ward 7 samples" in page.inner_text("main")
    assert sample_id(0) not in page.content()  # the ids are not features: never shown with the dataset
    with services.admin() as admin:
        ds = admin.get_dataset(dataset_id)
    assert (ds.n, ds.d, ds.objective_mode) == (N_ROWS, 3, "manual")
    return dataset_id


def _release(page: Any, services: Services, dataset_id: int) -> int:
    base = services.curator.url
    before = _counts(services)
    page.fill("#release-form input[name=epsilon]", "1")
    page.fill("#release-form input[name=delta]", "0.0001")
    page.click("#release-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/console/datasets/{dataset_id}/releases/new\?"))  # asked first
    confirm = page.locator("#release-confirm")
    assert "This spends privacy budget for good" in confirm.inner_text()
    assert float(page.inner_text("#charged-epsilon").split()[0]) == pytest.approx(1.0)
    shot(page, "forms-release-confirm")
    _reload_creates_nothing(page, services, before)  # the confirmation page is a GET: it spends nothing
    page.click("#release-confirm-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/releases/\d+$"))
    release_id = int(page.url.rsplit("/", 1)[1])
    after = _counts(services)
    assert after["releases"] == before["releases"] + 1
    shot(page, "forms-release")
    _reload_creates_nothing(page, services, after)
    assert page.url == f"{base}/console/releases/{release_id}"
    return release_id


def _gradient_oracle(page: Any, services: Services, dataset_id: int) -> int:
    base = services.curator.url
    page.goto(f"{base}/console/datasets/{dataset_id}/gradient-oracles")
    before = _counts(services)
    assert before["oracles"] == 0
    form = page.locator("#oracle-form")
    form.locator("select[name=loss]").select_option("gaussian-location")
    form.locator("textarea[name=bounds]").fill("-3 to 3")  # refused: not "lo, hi"
    form.locator("input[name=mu]").fill("0.5")
    form.locator("input[name=steps]").fill("10")
    form.locator("button[type=submit]").click()
    expect(page.locator("#oracle-problem")).to_contain_text("bounds", timeout=TIMEOUT)
    assert page.input_value("#oracle-form textarea[name=bounds]") == "-3 to 3"  # the values entered, kept
    assert page.input_value("#oracle-form input[name=mu]") == "0.5"
    assert page.input_value("#oracle-form input[name=steps]") == "10"
    shot(page, "forms-oracle-refused")
    assert _counts(services) == before

    page.fill("#oracle-form textarea[name=bounds]", "-3, 3")
    page.click("#oracle-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/console/datasets/{dataset_id}/gradient-oracles/new\?"))
    expect(page.locator("#oracle-confirm")).to_contain_text("This spends privacy budget for good")
    assert float(page.inner_text("#charged-epsilon").split()[0]) > 0
    shot(page, "forms-oracle-confirm")
    _reload_creates_nothing(page, services, before)
    page.click("#oracle-confirm-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/console/datasets/{dataset_id}/gradient-oracles\?created=\d+$"))
    oracle_id = int(page.url.rsplit("=", 1)[1])
    after = _counts(services)
    assert after["oracles"] == 1
    row = page.locator(f"#oracle-{oracle_id}")
    expect(row).to_contain_text("gaussian-location")
    assert "0 / 10" in row.inner_text()  # steps used of steps
    assert f"Gradient oracle #{oracle_id} created" in page.inner_text("main")
    shot(page, "forms-oracles")
    _reload_creates_nothing(page, services, after)
    with services.admin() as admin:
        oracle = admin.get_gradient_oracle(oracle_id)
    assert (oracle.dimension, oracle.steps, oracle.mu) == (3, 10, 0.5)
    return oracle_id


def _create_partner(
    page: Any, services: Services, name: str, release_id: int, *, private: bool
) -> tuple[int, str]:
    base = services.curator.url
    page.goto(f"{base}/console/partners")
    before = _counts(services)
    page.fill("#partner-form input[name=name]", name)
    page.fill("#partner-form input[name=max_queries]", "100")
    page.check(f"#partner-form input[name=release_ids][value='{release_id}']")
    if private:
        page.check("#partner-form input[name=output_privacy]")
        page.fill("#partner-form input[name=op_epsilon]", "1")
        page.fill("#partner-form input[name=op_B]", "1")
        page.fill("#partner-form input[name=op_R]", "0.5")
    page.click("#partner-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/partners/\d+/token$"))
    partner_id = int(page.url.rsplit("/", 2)[1])
    token = page.inner_text("#partner-token").strip()
    assert len(token) >= 24
    assert "will not be shown again" in page.inner_text("#token-warning")
    after = _counts(services)
    assert after["partners"] == before["partners"] + 1
    shot(page, f"forms-partner-created-{partner_id}")
    _reload_creates_nothing(page, services, after)
    expect(page.locator("#token-gone")).to_be_visible()  # shown once: a reload shows no token
    assert page.locator("#partner-token").count() == 0 and token not in page.content()
    return partner_id, token


def _partner_status(services: Services, token: str) -> int:
    with httpx.Client(base_url=services.curator.url, timeout=30) as http:
        return http.get("/v1/partners/me", headers={"Authorization": f"Bearer {token}"}).status_code


def _tokens(services: Services, partner_id: int) -> list[dict[str, Any]]:
    with _admin_http(services) as http:
        return list(http.get(f"/v1/partners/{partner_id}/tokens").json()["data"])


def _rotate_token(page: Any, services: Services, partner_id: int, old_token: str) -> tuple[str, int]:
    """A new token from the partner's page (shown once), then the old one revoked (asked first)."""
    base = services.curator.url
    page.goto(f"{base}/console/partners/{partner_id}")
    (old,) = _tokens(services, partner_id)
    assert page.locator("#tokens tbody tr").count() == 1
    shot(page, "forms-partner")
    before = _counts(services)
    page.click(f"form[action='/console/partners/{partner_id}/tokens'] button[type=submit]")
    page.wait_for_url(re.compile(rf"/console/partners/{partner_id}/token$"))
    new_token = page.inner_text("#partner-token").strip()
    assert len(new_token) >= 24 and new_token != old_token
    after = _counts(services)
    assert len(after["tokens"]) == len(before["tokens"]) + 1
    shot(page, "forms-partner-new-token")
    _reload_creates_nothing(page, services, after)
    assert page.locator("#partner-token").count() == 0 and new_token not in page.content()

    page.goto(f"{base}/console/partners/{partner_id}")
    assert page.locator("#tokens tbody tr").count() == 2
    page.click(f"#token-{old['id']} a.revoke-token")
    page.wait_for_url(re.compile(rf"/console/partners/{partner_id}/tokens/{old['id']}/revoke$"))
    assert "This cannot be undone" in page.inner_text("main")
    assert page.locator("#last-token").count() == 0  # the new token stays valid
    shot(page, "forms-token-revoke-confirm")
    _reload_creates_nothing(page, services, after)  # the confirmation page revokes nothing
    page.click("#token-revoke-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/console/partners/{partner_id}\?notice=token-revoked$"))
    expect(page.locator(f"#token-{old['id']}")).to_contain_text("revoked")
    assert "Token revoked" in page.inner_text("main")
    revoked = _counts(services)
    assert (old["id"], True) in revoked["tokens"]
    shot(page, "forms-token-revoked")
    _reload_creates_nothing(page, services, revoked)
    assert _partner_status(services, old_token) == 401
    assert _partner_status(services, new_token) == 200
    return new_token, old["id"]


def _change_quota(page: Any, services: Services, partner_id: int) -> None:
    page.goto(f"{services.curator.url}/console/partners/{partner_id}")
    page.fill("#partner-change-form input[name=max_queries]", "40")
    page.click("#partner-change-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/console/partners/{partner_id}\?notice=changed$"))
    assert "Partner changed." in page.inner_text("main")
    assert "0 of 40" in page.inner_text("#partner-facts")
    after = _counts(services)
    assert after["quotas"][partner_id] == 40
    shot(page, "forms-partner-changed")
    _reload_creates_nothing(page, services, after)


def _tighten_and_revoke(page: Any, services: Services, partner_id: int) -> None:
    base = services.curator.url
    page.goto(f"{base}/console/partners/{partner_id}")
    assert "CTL epsilon 1 per answer" in page.inner_text("#partner-facts")
    # its only working token: the revocation page says the partner would be left without one (not revoked)
    (only,) = _tokens(services, partner_id)
    page.goto(f"{base}/console/partners/{partner_id}/tokens/{only['id']}/revoke")
    expect(page.locator("#last-token")).to_be_visible()
    shot(page, "forms-token-revoke-last")
    page.goto(f"{base}/console/partners/{partner_id}")
    before = _counts(services)
    for epsilon, expected in (("2", None), ("0.5", "CTL epsilon 0.5 per answer")):
        page.check("#partner-change-form input[name=output_privacy]")
        page.fill("#partner-change-form input[name=op_epsilon]", epsilon)
        page.fill("#partner-change-form input[name=op_B]", "1")
        page.fill("#partner-change-form input[name=op_R]", "0.5")
        page.click("#partner-change-form button[type=submit]")
        if expected is None:
            expect(page.locator("main")).to_contain_text("can only be tightened", timeout=TIMEOUT)
            shot(page, "forms-partner-looser-refused")
            with services.admin() as admin:
                assert admin.get_partner(partner_id).output_privacy.epsilon == 1.0  # type: ignore[union-attr]
            page.goto(f"{base}/console/partners/{partner_id}")
        else:
            page.wait_for_url(re.compile(rf"/console/partners/{partner_id}\?notice=changed$"))
            assert expected in page.inner_text("#partner-facts")
            _reload_creates_nothing(page, services, before)
            with services.admin() as admin:
                assert admin.get_partner(partner_id).output_privacy.epsilon == 0.5  # type: ignore[union-attr]
    # a cap (a tightening), then a larger cap: charged to the population, so only with the box ticked
    for cap, accept, expected in (
        ("2", False, None),
        ("3", False, "Charge the population"),
        ("3", True, None),
    ):
        page.goto(f"{base}/console/partners/{partner_id}")
        page.check("#partner-change-form input[name=output_privacy]")
        for name, value in (
            ("op_epsilon", "0.5"),
            ("op_B", "1"),
            ("op_R", "0.5"),
            ("op_max_epsilon_per_row", cap),
        ):
            page.fill(f"#partner-change-form input[name={name}]", value)
        if accept:
            page.check("#op-accept-charge")
        page.click("#partner-change-form button[type=submit]")
        if expected is not None:
            expect(page.locator("main")).to_contain_text(expected, timeout=TIMEOUT)
            shot(page, "forms-partner-charge-unconfirmed")
        else:
            page.wait_for_url(re.compile(rf"/console/partners/{partner_id}\?notice=changed$"))
        with services.admin() as admin:
            policy = admin.get_partner(partner_id).output_privacy
            assert policy is not None and policy.max_epsilon_per_row == (
                2.0 if expected or cap == "2" else 3.0
            )

    page.goto(f"{base}/console/partners/{partner_id}")
    page.click("#partner-change-form a[href$='/revoke']")
    page.wait_for_url(re.compile(rf"/console/partners/{partner_id}/revoke$"))
    assert "This cannot be undone" in page.inner_text("main")
    shot(page, "forms-partner-revoke-confirm")
    _reload_creates_nothing(page, services, before)  # the confirmation page revokes nothing
    page.click("#revoke-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/partners$"))
    expect(page.locator(f"#partner-{partner_id}")).to_contain_text("revoked")
    after = _counts(services)
    assert after["revoked"] == [partner_id]
    shot(page, "forms-partners")
    _reload_creates_nothing(page, services, after)


def _measure(page: Any, services: Services, tmp: Path, release_id: int, token: str) -> None:
    """One study step asks for a row; the lab's sheet brings its measurement back."""
    base = services.curator.url
    with services.modeler_http() as http:
        body = {
            "curator_url": base,
            "release_id": release_id,
            "curator_token": token,
            "iterations": 1,
            "hyperparameters": FIXED_HP,
        }
        created = http.post("/v1/studies", json=body)
        assert created.status_code == 201, created.text
        study_id = created.json()["id"]
        step = http.post(f"/v1/studies/{study_id}/step")
        assert step.status_code == 200 and step.json()["status"] == "pending", step.text
        wait_status(http, study_id, {"awaiting_measurement"})
    with services.admin() as admin:
        pending = admin.lab_queries("pending").data
    assert len(pending) == 1
    query = pending[0]
    assert query.sample_id == sample_id(query.index)

    page.goto(f"{base}/console/queries")
    row = page.locator(f"#query-{query.id}")
    expect(row.locator(".sample-id")).to_have_text(sample_id(query.index))
    assert page.locator("#pending-queries tbody tr[id^=query-]").count() == 1
    shot(page, "forms-queries")
    with page.expect_download() as info:
        page.click("#export-pending")
    sheet = tmp / "pending.csv"
    info.value.save_as(sheet)
    with open(sheet, encoding="utf-8", newline="") as fh:
        lines = list(csv.DictReader(fh))
    assert len(lines) == 1
    assert lines[0]["query_id"] == str(query.id) and lines[0]["sample_id"] == sample_id(query.index)
    assert lines[0]["y"] == ""

    before = _counts(services)
    page.set_input_files("#results-form input[name=file]", str(sheet))  # y still empty: refused
    page.click("#results-form button[type=submit]")
    expect(page.locator("#error-message")).to_contain_text("line 2", timeout=TIMEOUT)
    assert page.locator("#results-refused").is_visible()
    shot(page, "forms-results-refused")
    assert _counts(services) == before  # nothing posted

    filled = tmp / "measured.csv"
    with open(filled, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerow({**lines[0], "y": str(MEASURED)})
    page.set_input_files("#results-form input[name=file]", str(filled))
    page.click("#results-form button[type=submit]")
    page.wait_for_url(re.compile(r"/console/queries$"))
    assert "1 query answered from 1 line(s)" in page.inner_text("main")
    assert page.locator("#pending-queries tbody tr[id^=query-]").count() == 0
    after = _counts(services)
    assert (after["pending"], after["complete"]) == (0, before["complete"] + 1)
    shot(page, "forms-results-posted")
    _reload_creates_nothing(page, services, after)
    assert "1 query answered" not in page.inner_text("main")  # the flash is shown once

    with services.admin() as admin:
        assert admin.get_query(query.id).status == "complete"
    with services.modeler_http() as http:
        done = wait_status(http, study_id, {"done", "failed"})
        assert done["status"] == "done", done.get("error")
        audit = http.get(f"/v1/studies/{study_id}/audit").json()["entries"]
    assert [(e["curator_query_id"], e["y"]) for e in audit] == [(query.id, MEASURED)]


def _overview(page: Any, services: Services, dataset_ids: list[int]) -> None:
    page.goto(f"{services.curator.url}/console")
    with services.admin() as admin:
        population_id = admin.get_dataset(dataset_ids[0]).population_id
        assert admin.get_dataset(dataset_ids[1]).population_id == population_id
    rows = page.locator("#budget-table tbody tr")
    assert rows.count() == 1  # one population, shown once with both its datasets
    row = page.locator(f"#population-{population_id}")
    text = row.inner_text()
    assert "ward 7" in text and all(f"#{i} " in text for i in dataset_ids)
    with _admin_http(services) as http:
        spent = http.get(f"/v1/populations/{population_id}").json()["epsilon_spent"]
    assert spent > 1.0  # the release and the gradient oracle
    assert float(row.locator("td").nth(2).inner_text()) == pytest.approx(spent, rel=1e-3)
    _image_drawn(page, "#budget-chart")
    shot(page, "forms-overview")


def _access_log(page: Any, services: Services, expected: Counter[tuple[str, int]]) -> None:
    page.goto(f"{services.curator.url}/console/access-log?limit=1000")
    rows = page.locator("#access-log tbody tr")
    expect(rows.first).to_be_visible()
    shown = [
        [c.strip() for c in r]
        for r in rows.evaluate_all("rs => rs.map(r => [...r.cells].map(c => c.innerText))")
    ]
    console = [r for r in shown if r[2].startswith("admin@console:")]
    actors = {r[2] for r in console}
    assert len(actors) == 1 and re.fullmatch(r"admin@console:[0-9a-f]{8}", actors.pop()), actors
    assert all(r[3] == "POST" for r in console)  # reads are not logged, actions are
    assert Counter((r[4], int(r[5])) for r in console) == expected
    assert not any(r[2] == "anonymous" and r[4].startswith("/console") for r in shown)
    shot(page, "forms-access-log")


def _federation_pages(page: Any, services: Services, fid: str, agents: list[dict[str, Any]]) -> None:
    base = services.modeler.url
    sign_in(page, base, services.modeler_token, "/console/federations")
    row = page.locator(f"#federations tr[data-federation-id='{fid}']")
    expect(row).to_contain_text("2 closed of 2")
    expect(row).to_contain_text("done")
    shot(page, "forms-modeler-federations")
    row.locator(f"a[href='/console/federations/{fid}']").click()
    page.wait_for_url(re.compile(rf"/console/federations/{fid}$"))
    expect(page.locator("#federation-status")).to_contain_text("done")
    assert page.locator("#rounds tbody tr").count() == 2
    with services.modeler_http() as http:
        rounds = [http.get(f"/v1/federations/{fid}/rounds/{t}").json() for t in (1, 2)]
    for t, accepted in ((1, "2"), (2, "1")):
        cells = page.locator(f"#round-{t} td")
        assert cells.nth(1).inner_text().strip() == "closed"
        assert cells.nth(5).inner_text().strip() == accepted
        assert float(cells.nth(6).inner_text()) == pytest.approx(rounds[t - 1]["epsilon_pld"], rel=1e-3)
    last = [page.locator(f"#agent-{a['id']} .last-round").inner_text().strip() for a in agents]
    assert last == ["2", "1"]
    assert not any(a["token"] in page.content() for a in agents)
    _image_drawn(page, "#epsilon-chart")
    shot(page, "forms-modeler-federation")


def test_console_forms_and_reloads(browser: Any, services: Services, tmp_path: Path) -> None:
    fid, agents = _run_federation(services)
    traffic = Traffic(allowed=(services.curator.url + "/", services.modeler.url + "/"))
    page = new_page(browser, traffic)
    base = services.curator.url
    sign_in(page, base, services.admin_token)

    _write_manual(tmp_path / "manual.csv")
    dataset_id = _upload_manual(page, services, tmp_path / "manual.csv")
    shot(page, "forms-dataset")
    _reload_creates_nothing(page, services, _counts(services))
    _write_followup(tmp_path / "followup.csv")
    with services.admin() as admin:  # a second dataset of the same population (its budget is shared)
        followup = admin.upload_dataset(
            tmp_path / "followup.csv", name="ward 7 follow-up", objective_mode="manual", population="ward 7"
        ).id

    release_id = _release(page, services, dataset_id)
    _gradient_oracle(page, services, dataset_id)
    lab, first_token = _create_partner(page, services, "ward 7 lab", release_id, private=False)
    auditor, _ = _create_partner(page, services, "ward 7 auditor", release_id, private=True)
    lab_token, revoked_token = _rotate_token(page, services, lab, first_token)
    _change_quota(page, services, lab)
    _tighten_and_revoke(page, services, auditor)
    _measure(page, services, tmp_path, release_id, lab_token)
    _overview(page, services, [dataset_id, followup])

    expected = Counter(
        {
            ("/console/sign-in", 303): 1,
            ("/console/datasets", 303): 1,
            (
                f"/console/datasets/{dataset_id}/releases",
                303,
            ): 2,  # the form (sent to confirm), then the button
            (f"/console/datasets/{dataset_id}/gradient-oracles", 303): 1,
            ("/console/partners", 303): 2,
            (f"/console/partners/{lab}/tokens", 303): 1,
            (f"/console/partners/{lab}/tokens/{revoked_token}/revoke", 303): 1,
            (f"/console/partners/{lab}", 303): 1,
            (f"/console/partners/{auditor}", 422): 1,
            (f"/console/partners/{auditor}", 303): 3,  # tighter, a cap, a larger cap with the box ticked
            (f"/console/partners/{auditor}", 409): 1,  # the larger cap without it
            (f"/console/partners/{auditor}/revoke", 303): 1,
            ("/console/queries/results", 422): 1,
            ("/console/queries/results", 303): 1,
        }
    )
    _access_log(page, services, expected)

    modeler = new_page(browser, traffic)
    _federation_pages(modeler, services, fid, agents)
    assert traffic.outside == [], traffic.outside
    page.context.close()
    modeler.context.close()
