"""A study's name and tags (issue 35): given at creation or by ``PATCH``, shown in its answer, and the list
filtered by them (``GET /v1/studies?name=&tag=``) in SQL, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.modeler_service.test_studies import create, wait_for


def ids(client: TestClient, query: str = "") -> list[str]:
    resp = client.get(f"/v1/studies{query}")
    assert resp.status_code == 200, resp.text
    return [s["id"] for s in resp.json()["data"]]


def labelled(client: TestClient) -> dict[str, dict[str, Any]]:
    return {
        "a": create(client, name="Dose search, cohort A", tags=["cohort-a", "Site:Berlin"]),
        "b": create(client, name="dose search 100% (cohort_B)", tags=["cohort-b", "site:berlin", "v1.2"]),
        "c": create(client, iterations=2),
    }


def test_a_study_keeps_its_name_and_tags(client: TestClient) -> None:
    study = create(client, name="  Dose search  ", tags=["cohort-a", "site:berlin", "COHORT-A"])
    assert (study["name"], study["tags"]) == ("Dose search", ["cohort-a", "site:berlin"])
    shown = client.get(f"/v1/studies/{study['id']}").json()
    assert (shown["name"], shown["tags"]) == ("Dose search", ["cohort-a", "site:berlin"])
    plain = create(client)
    assert (plain["name"], plain["tags"]) == (None, [])


def test_the_list_is_filtered_by_name_and_tags(client: TestClient) -> None:
    s = labelled(client)
    a, b, c = s["a"]["id"], s["b"]["id"], s["c"]["id"]
    assert ids(client) == [a, b, c]
    assert ids(client, "?name=DOSE%20search") == [a, b]
    assert ids(client, "?name=cohort%20a") == [a]
    assert ids(client, "?name=100%25") == [b]  # LIKE's wildcards are plain text here
    assert ids(client, "?name=_b") == [b]
    assert ids(client, "?name=%25") == [b]
    assert ids(client, "?tag=site:BERLIN") == [a, b]  # ignoring case
    assert ids(client, "?tag=site:berlin&tag=cohort-b") == [b]  # every tag
    assert ids(client, "?tag=cohort-a&tag=cohort-b") == []
    assert ids(client, "?tag=v1.2&name=dose") == [b]
    assert ids(client, "?tag=v1.2&name=cohort%20A") == []
    assert ids(client, "?tag=cohort") == []  # a tag matches whole
    assert client.get("/v1/studies?tag=site:berlin").json()["count"] == 2


def test_a_bad_tag_filter_says_what_a_tag_is(client: TestClient) -> None:
    resp = client.get("/v1/studies?tag=two%20words")
    assert resp.status_code == 422
    assert resp.json()["detail"] == (
        "tag filter: tag 'two words' is not a valid tag: use 1-50 characters of letters, digits, '-', '_', "
        "'.' or ':' (no spaces or commas; give several tags as several list items)"
    )


def test_bad_names_and_tags_are_refused_with_what_to_do(client: TestClient) -> None:
    from tests.modeler_service.conftest import study_body

    rule = "use 1-50 characters of letters, digits, '-', '_', '.' or ':' (no spaces or commas; give several"
    refused = {
        ("tags", ("ok", "no spaces")): f"tag 'no spaces' is not a valid tag: {rule}",
        ("tags", ("a" * 51,)): f"tag '{'a' * 51}' is not a valid tag: {rule}",
        ("tags", ("",)): f"tag '' is not a valid tag: {rule}",
        ("tags", tuple(f"t{i}" for i in range(21))): "a study has at most 20 tags, got 21: drop some",
        ("name", "   "): "name must have at least one character besides spaces (or leave it out)",
        ("name", "two\nlines"): "name must be one line of text without control characters",
        ("name", "x" * 201): "String should have at most 200 characters",
    }
    for (field, value), message in refused.items():
        given = list(value) if field == "tags" else value
        resp = client.post("/v1/studies", json=study_body(**{field: given}))
        assert resp.status_code == 422, resp.text
        assert resp.json()["detail"].startswith(f"invalid request: body field '{field}': {message}")
    assert client.get("/v1/studies").json()["count"] == 0  # nothing half-written


def test_patch_renames_and_retags_in_any_status(client: TestClient) -> None:
    s = labelled(client)
    a, b = s["a"]["id"], s["b"]["id"]
    assert client.post(f"/v1/studies/{a}/run").status_code == 202
    changed = client.patch(f"/v1/studies/{a}", json={"name": "Final", "tags": ["final", "Site:Berlin"]})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["name"], changed.json()["tags"]) == ("Final", ["final", "Site:Berlin"])
    assert ids(client, "?tag=cohort-a") == []
    assert ids(client, "?tag=final") == [a]
    assert ids(client, "?tag=site:berlin") == [a, b]
    done = wait_for(client, a, {"done", "failed"})
    assert (done["status"], done["name"], done["tags"]) == ("done", "Final", ["final", "Site:Berlin"])
    renamed = client.patch(f"/v1/studies/{a}", json={"name": "Final, checked"}).json()
    assert (renamed["name"], renamed["tags"], renamed["status"]) == ("Final, checked", done["tags"], "done")
    cleared = client.patch(f"/v1/studies/{a}", json={"name": None, "tags": []}).json()
    assert (cleared["name"], cleared["tags"]) == (None, [])
    assert ids(client, "?tag=site:berlin") == [b] and ids(client, "?name=final") == []
    bad = client.patch(f"/v1/studies/{b}", json={"tags": ["a,b"]})
    assert bad.status_code == 422 and "tag 'a,b' is not a valid tag" in bad.text
    assert client.get(f"/v1/studies/{b}").json()["tags"] == ["cohort-b", "site:berlin", "v1.2"]
    assert client.patch("/v1/studies/nope", json={"name": "x"}).status_code == 404
