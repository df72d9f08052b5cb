"""The modeler console's names and tags (issue 35): the create form's name and tags fields, the studies
list showing them with a search form (by a part of the name, by tags), and the study page's form that
changes them (post/redirect/get)."""

from __future__ import annotations

import html
import re
from typing import Any

from fastapi.testclient import TestClient

from tests.modeler_service.conftest import study_body
from tests.modeler_service.fake_curator import FakeCurator
from tests.modeler_service.test_console import check_local, create_form, page, sign_in
from tests.modeler_service.test_studies import wait_for


def listed(client: TestClient, query: str = "") -> list[str]:
    r = client.get(f"/console{query}")
    assert r.status_code == 200, r.text
    check_local(r.text)
    return re.findall(r'data-study-id="([0-9a-f]+)"', r.text)


def test_the_create_form_takes_a_name_and_tags(client: TestClient, curator: FakeCurator) -> None:
    csrf = sign_in(client)
    names = {i.get("name"): i for i in page(client.get("/console/studies/new").text).inputs}
    assert (names["name"]["type"], names["name"]["maxlength"]) == ("text", "200")
    assert names["tags"]["type"] == "text"
    typed = create_form(name=" Dose search ", tags="cohort-a, site:berlin  cohort-a")
    r = client.post(
        "/console/studies/new",
        data={**typed, "csrf_token": csrf},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    sid = r.headers["location"].split("/")[-1].split("?")[0]
    study = client.get(f"/v1/studies/{sid}").json()
    assert (study["name"], study["tags"]) == ("Dose search", ["cohort-a", "site:berlin"])
    shown = client.get(f"/console/studies/{sid}").text
    assert "Dose search" in shown and "cohort-a, site:berlin" in shown
    # a bad tag: the form again (422) with what a tag may be, the name and tags kept
    r = client.post(
        "/console/studies/new", data={**create_form(name="Kept", tags="ok bad/tag"), "csrf_token": csrf}
    )
    assert r.status_code == 422
    errors = re.search(r'id="form-errors">(.*?)</div>', r.text, re.DOTALL)
    assert errors is not None
    assert "tag 'bad/tag' is not a valid tag: use 1-50 characters" in html.unescape(errors.group(1))
    assert 'value="Kept"' in r.text and 'value="ok bad/tag"' in r.text
    assert client.get("/v1/studies").json()["count"] == 1 and curator.charged() == 0


def test_the_list_shows_names_and_tags_and_searches(client: TestClient, curator: FakeCurator) -> None:
    sign_in(client)
    made: list[dict[str, Any]] = [
        client.post("/v1/studies", json=study_body(name=name, tags=tags)).json()
        for name, tags in (
            ("Dose search A", ["cohort-a", "site:berlin"]),
            ("dose search B", ["cohort-b", "site:berlin"]),
            (None, None),
        )
    ]
    a, b, c = (s["id"] for s in made)
    everything = client.get("/console").text
    parsed = page(everything)
    search = parsed.ids["study-search"]
    assert (search["method"], search["action"]) == ("get", "/console")
    assert {"name", "tag"} <= {i.get("name") for i in parsed.inputs}
    assert "Dose search A" in everything
    assert '<a class="badge tag" href="/console?tag=site%3Aberlin">' in everything
    assert listed(client) == [a, b, c]
    assert listed(client, "?name=DOSE") == [a, b]
    assert listed(client, "?name=search%20b") == [b]
    assert listed(client, "?tag=Site:Berlin") == [a, b]
    assert listed(client, "?tag=site:berlin,cohort-b") == [b]  # every tag, separated by a comma ...
    assert listed(client, "?tag=site:berlin+cohort-a&name=dose") == [a]  # ... or a space
    none = client.get("/console?tag=cohort-c")
    assert "no-match" in page(none.text).ids and "no-studies" not in page(none.text).ids
    # the search is kept in the form and in the table's polling address while a study is active
    curator.manual = True
    assert client.post(f"/v1/studies/{b}/run").status_code == 202
    wait_for(client, b, {"awaiting_measurement"})
    searched = page(client.get("/console?name=dose&tag=site:berlin").text)
    assert searched.ids["search-name"]["value"] == "dose"
    assert searched.ids["search-tag"]["value"] == "site:berlin"
    assert searched.ids["studies-block"]["hx-get"] == "/console/studies-table?name=dose&tag=site%3Aberlin"
    table = client.get("/console/studies-table?name=dose&tag=site%3Aberlin").text
    assert re.findall(r'data-study-id="([0-9a-f]+)"', table) == [a, b]
    # a tag no study can have: the list page says what a tag is (422), with no rows
    bad = client.get("/console?tag=a%2Fb")
    assert bad.status_code == 422 and "search-problem" in page(bad.text).ids
    assert "tag 'a/b' is not a valid tag" in html.unescape(bad.text)
    curator.post_result(curator.pending()[0]["id"], 0.5)


def test_the_study_page_changes_the_name_and_tags(client: TestClient, curator: FakeCurator) -> None:
    csrf = sign_in(client)
    sid = client.post("/v1/studies", json=study_body(name="Old", tags=["x"])).json()["id"]
    form = page(client.get(f"/console/studies/{sid}").text)
    assert form.ids["labels-form"]["action"] == f"/console/studies/{sid}/labels"
    assert form.ids["labels-name"]["value"] == "Old" and form.ids["labels-tags"]["value"] == "x"
    assert client.post(f"/console/studies/{sid}/labels", data={"name": "New"}).status_code == 403  # no CSRF
    r = client.post(
        f"/console/studies/{sid}/labels",
        data={"csrf_token": csrf, "name": "New name", "tags": "final v2"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == f"/console/studies/{sid}?notice=labels"
    assert "Name and tags saved." in client.get(r.headers["location"]).text
    study = client.get(f"/v1/studies/{sid}").json()
    assert (study["name"], study["tags"]) == ("New name", ["final", "v2"])
    bad = client.post(f"/console/studies/{sid}/labels", data={"csrf_token": csrf, "name": "N", "tags": "a;b"})
    assert bad.status_code == 422 and "tag 'a;b' is not a valid tag" in html.unescape(bad.text)
    cleared = client.post(f"/console/studies/{sid}/labels", data={"csrf_token": csrf, "name": "", "tags": ""})
    assert cleared.status_code == 200  # (followed the redirect)
    study = client.get(f"/v1/studies/{sid}").json()
    assert (study["name"], study["tags"]) == (None, [])
    missing = client.post("/console/studies/nope/labels", data={"csrf_token": csrf, "name": "x"})
    assert missing.status_code == 404
