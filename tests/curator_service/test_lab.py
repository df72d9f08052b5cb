"""Issue 34, lab workflow: an id column kept apart (never a feature, never shown to a partner), the lab's
list of pending queries with sample ids, and measurements posted in bulk from a CSV, all or nothing."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from curator_service import csvparse
from tests.curator_service.conftest import ADMIN, bearer, synthetic, upload

pytestmark = pytest.mark.anyio

N = 12


def lab_csv(X: np.ndarray, ids: list[str] | None = None, *, sep: str = ",", first: str = "sample") -> bytes:
    """A manual dataset's CSV: the id column first, then the features (exact float64 reprs)."""
    ids = ids if ids is not None else [f"S-{i:03d}" for i in range(X.shape[0])]
    header = [first] + [f"x{j}" for j in range(X.shape[1])]
    lines = [sep.join(header)] + [
        sep.join([ids[i], *(repr(float(v)) for v in row)]) for i, row in enumerate(X)
    ]
    return ("\n".join(lines) + "\n").encode()


def results_csv(rows: list[tuple[Any, ...]], header: tuple[str, ...]) -> bytes:
    return ("\n".join([",".join(header)] + [",".join(str(c) for c in r) for r in rows]) + "\n").encode()


@dataclass
class Lab:
    client: httpx.AsyncClient
    X: np.ndarray
    dataset: dict[str, Any]
    release: dict[str, Any]
    partners: list[dict[str, Any]]

    def headers(self, k: int) -> dict[str, str]:
        return bearer(self.partners[k]["token"])

    async def ask(self, k: int, index: int, key: str | None = None) -> dict[str, Any]:
        headers = self.headers(k) | ({"Idempotency-Key": key} if key else {})
        r = await self.client.post(
            f"/v1/releases/{self.release['id']}/queries", headers=headers, json={"index": index}
        )
        assert r.status_code == 201, r.text
        return r.json()

    async def post_results(self, content: bytes, **form: Any) -> httpx.Response:
        return await self.client.post(
            "/v1/queries/results",
            headers=ADMIN,
            files={"file": ("results.csv", content, "text/csv")},
            data={k: str(v) for k, v in form.items()},
        )

    async def pending(self, **params: Any) -> list[dict[str, Any]]:
        r = await self.client.get("/v1/queries", headers=ADMIN, params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["count"] == len(body["data"])
        return list(body["data"])


async def make_lab(client: httpx.AsyncClient, *, partners: int = 2) -> Lab:
    X, _ = synthetic(n=N, d=2, seed=11)
    r = await upload(client, lab_csv(X), name="assay", id_column="sample")
    assert r.status_code == 201, r.text
    dataset = r.json()
    r = await client.post(
        f"/v1/datasets/{dataset['id']}/releases", headers=ADMIN, json={"epsilon": 1.0, "delta": 1e-5}
    )
    assert r.status_code == 201, r.text
    release = r.json()
    made = []
    for k in range(partners):
        r = await client.post(
            "/v1/partners",
            headers=ADMIN,
            json={"name": f"modeler-{k}", "release_ids": [release["id"]], "max_queries": 20},
        )
        assert r.status_code == 201, r.text
        made.append(r.json())
    return Lab(client, X, dataset, release, made)


@pytest.fixture
async def lab(client: httpx.AsyncClient) -> Lab:
    return await make_lab(client)


# ------------------------------------------------------------------------------------------ id column


async def test_the_id_column_is_kept_apart_from_the_features(lab: Lab) -> None:
    ds = lab.dataset
    assert ds["id_column"] == "sample" and ds["features"] == ["x0", "x1"] and ds["d"] == 2
    assert ds["objective_mode"] == "manual" and ds["n"] == N
    rows = await lab.client.get(
        f"/v1/releases/{lab.release['id']}/rows", headers=lab.headers(0) | {"Accept": "application/x-npy"}
    )
    assert rows.status_code == 200
    Z = np.load(io.BytesIO(rows.content), allow_pickle=False)
    assert Z.shape == (N, 2) and lab.release["r"] == 2  # the features' dimension: no id in the release


async def test_id_column_problems_are_named_without_echoing_values(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=6, d=2, seed=5)
    secret = repr(float(X[2, 0]))

    async def refused(content: bytes, **form: Any) -> str:
        r = await upload(client, content, **form)
        assert r.status_code == 422, r.text
        detail: str = r.json()["detail"]
        assert secret not in detail and "S-00" not in detail  # positions only, never a cell
        return detail

    assert await refused(lab_csv(X), id_column="patient") == (
        "id column 'patient' is not in the header (columns: sample, x0, x1); name the column that holds "
        "each row's sample id, or leave id_column out"
    )
    ids = [f"S-00{i}" for i in range(6)]
    assert await refused(lab_csv(X, ids[:2] + [" "] + ids[3:]), id_column="sample") == (
        "data row 3 (line 4), the id column 'sample' (column 1): the id is empty; every row needs its own id"
    )
    assert await refused(lab_csv(X, ids[:4] + [ids[1], ids[5]]), id_column="sample") == (
        "data row 5 repeats the id of data row 2 in the id column 'sample'; every row needs its own id "
        "(fix the file, or leave id_column out)"
    )
    assert await refused(lab_csv(X), id_column="sample", features="sample,x0") == (
        "the id column 'sample' cannot also be a feature: ids are kept by the curator and never released; "
        "remove it from `features`"
    )
    assert await refused(lab_csv(X), id_column="x1", objective="x1") == (
        "the id column 'x1' cannot also be the objective column"
    )
    # without id_column the text column is simply not selectable as a feature (as before)
    plain = await upload(client, lab_csv(X), features="x0,x1")
    assert plain.status_code == 201 and plain.json()["id_column"] is None


def test_ids_are_read_alike_serially_in_parallel_and_quoted() -> None:
    X, _ = synthetic(n=300, d=3, seed=2)
    ids = [f"lab/{i:04d}" if i % 7 else f'"ward {i}, bed {i % 5}"' for i in range(300)]
    content = lab_csv(X, ids)
    expected = [s.strip('"') for s in ids]
    for workers in (1, 2):
        stream = csvparse.CsvStream(io.BytesIO(content), chunk_bytes=900)
        parser = csvparse.ChunkParser(stream.header, [1, 2, 3], id_col=0)
        parts = list(csvparse.iter_rows(stream, parser, workers=workers))
        values = np.vstack([v for v, _ in parts])
        got = [bytes(b).decode() for _, i in parts if i is not None for b in i]
        np.testing.assert_array_equal(values, X)
        assert got == expected
    bad = content.decode().split("\n")
    bad[201] = ",".join([""] + bad[201].split(",")[1:])  # data row 201 (line 202) loses its id
    stream = csvparse.CsvStream(io.BytesIO("\n".join(bad).encode()), chunk_bytes=900)
    parser = csvparse.ChunkParser(stream.header, [1, 2, 3], id_col=0)
    with pytest.raises(csvparse.RowError) as err:
        list(csvparse.iter_rows(stream, parser, workers=2))
    assert err.value.detail.startswith("data row 201 (line 202), the id column 'sample'")


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("where", [0, 2])  # the id column first, or last
def test_the_array_cut_of_ids_equals_the_line_by_line_reader(
    monkeypatch: pytest.MonkeyPatch, newline: str, where: int
) -> None:
    X, _ = synthetic(n=40, d=2, seed=8)
    ids = [f" échantillon-{i} " if i % 3 == 0 else f"S{i}" for i in range(40)]  # spaces, UTF-8
    lines = [",".join(["x0", "x1"][:where] + ["sample"] + ["x0", "x1"][where:])]
    for i, row in enumerate(X):
        cells = [repr(float(v)) for v in row]
        lines.append(",".join(cells[:where] + [ids[i]] + cells[where:]))
        if i == 17:
            lines.append("")  # a blank line is no row
    content = (newline.join(lines) + newline).encode()
    usecols = [j for j in range(3) if j != where]

    def read() -> list[bytes]:
        stream = csvparse.CsvStream(io.BytesIO(content), chunk_bytes=500)
        parser = csvparse.ChunkParser(stream.header, usecols, id_col=where)
        return [bytes(b) for _, i in csvparse.iter_rows(stream, parser) if i is not None for b in i]

    cut = read()
    assert cut == [s.strip().encode() for s in ids]
    monkeypatch.setattr(csvparse, "_fast_ids", lambda *_args: None)  # the line-by-line reader only
    assert read() == cut


async def test_a_semicolon_or_tab_file_is_named_as_such(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=5, d=2, seed=1)
    for sep, name in ((";", "semicolon"), ("\t", "tab")):
        r = await upload(client, lab_csv(X, sep=sep), id_column="sample")
        assert r.status_code == 422
        assert r.json()["detail"] == (
            f"the file looks {name}-separated: its header row (line 1) has no comma. pobo reads "
            'comma-separated CSV: save the file as "CSV UTF-8 (comma delimited)", or replace the delimiters '
            "by commas (and decimal commas by points)"
        )


# ------------------------------------------------------------------------------------------ the list


async def test_the_pending_list_names_each_sample_across_releases(lab: Lab) -> None:
    a = await lab.ask(0, 3)
    b = await lab.ask(1, 3)  # another partner asks about the same sample
    c = await lab.ask(1, 7)
    pending = await lab.pending()
    assert [(q["id"], q["index"], q["sample_id"]) for q in pending] == [
        (a["id"], 3, "S-003"),
        (b["id"], 3, "S-003"),
        (c["id"], 7, "S-007"),
    ]
    first = pending[0]
    assert first["release_id"] == lab.release["id"] and first["dataset_id"] == lab.dataset["id"]
    assert (first["partner_id"], first["partner_name"]) == (lab.partners[0]["id"], "modeler-0")
    assert first["status"] == "pending" and first["y"] is None and first["corrections"] == 0
    assert await lab.pending(after_id=a["id"], limit=1) == [pending[1]]
    assert await lab.pending(release_id=lab.release["id"] + 1) == []
    # a dataset without an id column: its queries are listed with sample_id null
    X, _ = synthetic(n=6, d=2, seed=9)
    plain = (await upload(lab.client, lab_csv(X), name="plain", features="x0,x1")).json()
    rel = (
        await lab.client.post(
            f"/v1/datasets/{plain['id']}/releases", headers=ADMIN, json={"epsilon": 1.0, "delta": 1e-5}
        )
    ).json()
    await lab.client.post(
        f"/v1/partners/{lab.partners[0]['id']}/grants", headers=ADMIN, json={"release_ids": [rel["id"]]}
    )
    r = await lab.client.post(f"/v1/releases/{rel['id']}/queries", headers=lab.headers(0), json={"index": 1})
    assert r.status_code == 201
    other = await lab.pending(dataset_id=plain["id"])
    assert [(q["id"], q["sample_id"]) for q in other] == [(r.json()["id"], None)]
    # answered queries leave the pending list and show up as complete
    posted = await lab.client.post(f"/v1/queries/{c['id']}/result", headers=ADMIN, json={"y": 0.5})
    assert posted.status_code == 200
    assert c["id"] not in [q["id"] for q in await lab.pending()]
    done = await lab.pending(status="complete")
    assert [(q["id"], q["sample_id"], q["y"], q["delivered_at"]) for q in done] == [
        (c["id"], "S-007", 0.5, None)
    ]


async def test_the_lab_list_is_the_admins_and_checks_its_parameters(lab: Lab) -> None:
    r = await lab.client.get("/v1/queries", headers=lab.headers(0))
    assert r.status_code == 403
    assert r.json() == {
        "detail": "this endpoint needs the curator's admin token; a partner token is not allowed"
    }
    r = await lab.client.get("/v1/queries", headers=ADMIN, params={"status": "waiting"})
    assert r.status_code == 422
    assert "'pending' or 'complete'" in r.json()["detail"]
    assert (await lab.client.get("/v1/queries")).status_code == 401


async def test_sample_ids_never_reach_a_partner_or_a_log_line(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    q = await lab.ask(0, 4, key="k-4")
    await lab.client.post(f"/v1/queries/{q['id']}/result", headers=ADMIN, json={"y": 1.25})
    seen = [
        await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(0)),
        await lab.client.get(f"/v1/releases/{lab.release['id']}/queries", headers=lab.headers(0)),
        await lab.client.get(f"/v1/releases/{lab.release['id']}", headers=lab.headers(0)),
        await lab.client.get("/v1/partners/me", headers=lab.headers(0)),
        await lab.client.get(f"/v1/releases/{lab.release['id']}/corrections", headers=lab.headers(0)),
        await lab.client.post(
            f"/v1/releases/{lab.release['id']}/queries",
            headers=lab.headers(0) | {"Idempotency-Key": "k-4"},
            json={"index": 4},
        ),
    ]
    for r in seen:
        assert r.status_code in (200, 201), r.text
        assert "S-0" not in r.text and "sample" not in r.text
    assert "S-0" not in caplog.text


# ------------------------------------------------------------------------------------------ bulk entry


async def test_bulk_results_by_sample_id_answer_every_query_about_the_sample(lab: Lab) -> None:
    a = await lab.ask(0, 3)
    b = await lab.ask(1, 3)
    c = await lab.ask(0, 5)
    r = await lab.post_results(
        results_csv([("S-003", 0.25, "ok"), ("S-005", -1.5, "")], ("sample_id", "y", "note"))
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == 3
    assert body["lines"] == [
        {"line": 2, "query_ids": [a["id"], b["id"]]},
        {"line": 3, "query_ids": [c["id"]]},
    ]
    assert {q["id"]: q["y"] for q in body["queries"]} == {a["id"]: 0.25, b["id"]: 0.25, c["id"]: -1.5}
    for k, q in ((0, a), (1, b)):
        got = (await lab.client.get(f"/v1/queries/{q['id']}", headers=lab.headers(k))).json()
        assert got["status"] == "complete" and got["y"] == 0.25
    assert await lab.pending() == []
    verified = (
        await lab.client.get(f"/v1/releases/{lab.release['id']}/queries/verify", headers=ADMIN)
    ).json()
    assert verified["ok"] and verified["entries"] == 3


async def test_bulk_results_by_index_and_by_query_id(lab: Lab) -> None:
    a = await lab.ask(0, 1)
    b = await lab.ask(1, 2)
    r = await lab.post_results(results_csv([(1, "2.5")], ("index", "y")), release_id=lab.release["id"])
    assert r.status_code == 200 and r.json()["lines"] == [{"line": 2, "query_ids": [a["id"]]}]
    r = await lab.post_results(results_csv([(b["id"], "1e-3")], ("query_id", "y")))
    assert r.status_code == 200 and r.json()["queries"][0]["y"] == 0.001
    r = await lab.post_results(results_csv([(7, "1.0")], ("index", "y")))
    assert r.status_code == 422
    assert r.json()["detail"] == (
        "line 2: an index names a row of a release's dataset: add a release_id column or give the form "
        "field release_id"
    )


async def test_a_bad_line_refuses_the_whole_file(lab: Lab) -> None:
    a = await lab.ask(0, 3)
    b = await lab.ask(0, 4)
    await lab.ask(0, 6)
    header = ("sample_id", "y")
    cases = [
        (
            [("S-003", "0.1"), ("S-004", "abc")],
            422,
            "line 3, column 'y': not a number (write decimals with a point, e.g. 0.731)",
        ),
        (
            [("S-003", "0.1"), ("S-004", "")],
            422,
            "line 3, column 'y': the value is empty; enter the measurement or delete the line",
        ),
        (
            [("S-003", "0.1"), ("S-003", "0.2")],
            422,
            f"line 3 answers query {a['id']} again (line 2 did): one value per query; nothing was posted",
        ),
        (
            [("S-003", "0.1"), ("S-999", "0.2")],
            422,
            "line 3: no manual dataset with an id column has this sample id; check it, or name the query "
            "by query_id",
        ),
        (
            [("S-003", "0.1"), ("S-009", "0.2")],
            422,
            f"line 3: no query of dataset {lab.dataset['id']} is waiting for a measurement of this sample "
            "(row 9): it was answered already or never asked; remove the line (GET "
            "/v1/queries?status=pending lists what is waiting)",
        ),
        ([("S-003", "nan")], 422, "line 2, column 'y': the value must be a finite number"),
    ]
    for rows, status, detail in cases:
        r = await lab.post_results(results_csv(rows, header))
        assert (r.status_code, r.json()["detail"]) == (status, detail)
    assert [q["id"] for q in await lab.pending()][:2] == [a["id"], b["id"]]  # nothing was written
    r = await lab.post_results(b"sample_id;y\nS-003;0.1\n")
    assert r.status_code == 422
    assert r.json()["detail"].startswith("the file looks semicolon-separated")
    r = await lab.post_results(b"sample,value\nS-003,0.1\n")
    assert (r.status_code, r.json()["detail"]) == (
        422,
        "the header (line 1) needs a column y and one of query_id, sample_id, index (found: 'sample', "
        "'value')",
    )
    r = await lab.post_results(b"sample_id,y\n")
    assert (r.status_code, r.json()["detail"]) == (422, "the file has a header but no measurement line")
    # a query answered already: a conflict naming the line, and how to change a posted value
    await lab.client.post(f"/v1/queries/{b['id']}/result", headers=ADMIN, json={"y": 3.0})
    r = await lab.post_results(results_csv([(a["id"], "0.1"), (b["id"], "0.2")], ("query_id", "y")))
    assert r.status_code == 409
    assert r.json()["detail"].startswith(
        f"line 3: query {b['id']} is already complete; a result is posted once."
    )
    assert a["id"] in [q["id"] for q in await lab.pending()]
    assert (
        await lab.client.post(
            "/v1/queries/results", headers=lab.headers(0), files={"file": ("r.csv", b"y\n")}
        )
    ).status_code == 403


async def test_an_export_of_the_console_round_trips(lab: Lab) -> None:
    """The formula-safe apostrophe an export puts before a leading '-' or '=' is removed on the way back."""
    X, _ = synthetic(n=4, d=2, seed=4)
    r = await upload(lab.client, lab_csv(X, ["-7", "=1+1", "ok", "@x"]), name="odd", id_column="sample")
    assert r.status_code == 201, r.text
    rel = (
        await lab.client.post(
            f"/v1/datasets/{r.json()['id']}/releases", headers=ADMIN, json={"epsilon": 1.0, "delta": 1e-5}
        )
    ).json()
    await lab.client.post(
        f"/v1/partners/{lab.partners[0]['id']}/grants", headers=ADMIN, json={"release_ids": [rel["id"]]}
    )
    q = await lab.client.post(f"/v1/releases/{rel['id']}/queries", headers=lab.headers(0), json={"index": 1})
    assert (await lab.pending(release_id=rel["id"]))[0]["sample_id"] == "=1+1"
    r = await lab.post_results(results_csv([("'=1+1", "4.0")], ("sample_id", "y")))
    assert r.status_code == 200, r.text
    assert r.json()["lines"] == [{"line": 2, "query_ids": [q.json()["id"]]}]
    assert json.loads(r.text)["queries"][0]["y"] == 4.0
