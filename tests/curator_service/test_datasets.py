"""POST/GET /v1/datasets: streaming CSV upload, column selection, scaling, validation errors."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import numpy as np
import pytest

from curator_service import csvparse
from curator_service.config import Settings
from curator_service.main import UPLOAD_SLACK_BYTES, create_app
from shared.privacy.po_gp_ucb import centred_sigma_min
from tests.curator_service.conftest import ADMIN, make_csv, synthetic, upload

pytestmark = pytest.mark.anyio


async def test_upload_happy_path_returns_metadata_only(client: httpx.AsyncClient) -> None:
    X, y = synthetic(n=50, d=3)
    content = make_csv(X, y)
    response = await upload(client, content, name="cohort-a", objective="outcome")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["id"] >= 1
    assert body["name"] == "cohort-a"
    assert (body["n"], body["d"]) == (50, 3)
    assert body["features"] == ["x0", "x1", "x2"]
    assert body["objective"] == "outcome" and body["objective_mode"] == "column"
    assert body["sha256"] == hashlib.sha256(content).hexdigest()
    assert body["epsilon_budget"] == 10.0 and body["delta_budget"] == 1e-3
    assert body["epsilon_spent"] == 0.0 and body["scaling"]["kind"] == "none"
    assert body["scaling"]["formal_guarantee"] is True
    assert set(body) >= {
        "id",
        "name",
        "n",
        "d",
        "features",
        "objective_mode",
        "sha256",
        "epsilon_budget",
        "delta_budget",
        "created_at",
    }
    listed = await client.get("/v1/datasets", headers=ADMIN)
    assert listed.status_code == 200
    assert listed.json()["count"] == 1 and listed.json()["data"][0] == body
    one = await client.get(f"/v1/datasets/{body['id']}", headers=ADMIN)
    assert one.status_code == 200 and one.json() == body


async def test_upload_defaults_manual_mode_without_objective(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=10, d=2)
    response = await upload(client, make_csv(X), epsilon_budget=2, delta_budget=0.01)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["objective"] is None and body["objective_mode"] == "manual"
    assert body["features"] == ["x0", "x1"]
    assert (body["epsilon_budget"], body["delta_budget"]) == (2.0, 0.01)


async def test_feature_selection_ignores_other_columns(client: httpx.AsyncClient) -> None:
    content = (
        b"patient,age,bmi,notes,y\n"
        b'p-001,41.5,22.25,"likes tea, a lot",1.5\n'
        b"p-002,63.25,30.5,none,2.5\n"
        b"p-003,55.75,27.125,,3.5\n"
    )
    response = await upload(client, content, features="bmi, age", objective="y")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["features"] == ["bmi", "age"] and body["d"] == 2 and body["n"] == 3


async def test_tolerates_bom_crlf_quotes_blank_lines_and_no_final_newline(client: httpx.AsyncClient) -> None:
    content = b'\xef\xbb\xbf"a","b"\r\n1.5,2.5\r\n\r\n"3.5", 4.5 \r\n5.5,6.5'
    response = await upload(client, content)
    assert response.status_code == 201, response.text
    assert (response.json()["n"], response.json()["features"]) == (3, ["a", "b"])


@pytest.mark.parametrize(
    ("content", "form", "detail"),
    [
        (b"a,b\n1,2\n3,oops\n", {}, "data row 2 (line 3), column 'b' (column 2): the cell is not a number"),
        (b"a,b\n1,2\n3,nan\n", {}, "data row 2 (line 3), column 'b' (column 2): the cell is NaN"),
        (b"a,b\n1,2\n-inf,3\n", {}, "data row 2 (line 3), column 'a' (column 1): the cell is infinite"),
        (b"a,b\n1,2\n1e999,3\n", {}, "data row 2 (line 3), column 'a' (column 1): the cell is infinite"),
        (b"a,b\n1,2\n3,\n", {}, "data row 2 (line 3), column 'b' (column 2): the cell is empty"),
        (
            b"a,b\n1,2\n3,4,5\n",
            {},
            "data row 2 (line 3) has 3 field(s) but the header has 2 columns (ragged row)",
        ),
        (
            b"a,b\n1,2\n3\n",
            {},
            "data row 2 (line 3) has 1 field(s) but the header has 2 columns (ragged row)",
        ),
        (b"", {}, "the file is empty; expected a header row and at least 2 data rows"),
        (b"\n1,2\n", {}, "line 1 is blank; the CSV must start with a header row of column names"),
        (b"a,b\n", {}, "the CSV needs at least 2 data rows, got 0"),
        (b"a,b\n1,2\n", {}, "the CSV needs at least 2 data rows, got 1"),
        (b"a,b,a\n1,2,3\n4,5,6\n", {}, "the header (line 1) has duplicate column names: 'a'"),
        (b"a,,c\n1,2,3\n4,5,6\n", {}, "the header (line 1) has an empty name in column 2"),
        (b"a,b\n1,2\n\xff,3\n", {}, "line 3 is not valid UTF-8 text"),
        (b"a\rz,b\n1,2\n3,4\n", {}, "line 1 (the header) is not a valid CSV row: a carriage return"),
        (
            b"a,b\x00z\n1,2\n3,4\n",
            {},
            "the header (line 1) has a control character (U+0000) in the name in column 2; column names "
            "must be printable text",
        ),
        (
            b'"a\rz",b\n1,2\n3,4\n',
            {},
            "the header (line 1) has a control character (U+000D) in the name in column 1",
        ),
        (
            b"a,b\n1,2\n3,4\n",
            {"features": "a,zz"},
            "feature column(s) not in the header: 'zz' (columns: a, b)",
        ),
        (b"a,b\n1,2\n3,4\n", {"features": "a,a"}, "feature column(s) listed twice: 'a'"),
        (b"a,b\n1,2\n3,4\n", {"objective": "q"}, "objective column 'q' is not in the header (columns: a, b)"),
        (
            b"a,b\n1,2\n3,4\n",
            {"objective": "b", "features": "a,b"},
            "the objective column 'b' cannot also be a feature",
        ),
        (b"a,b\n1,2\n3,4\n", {"objective": "b", "features": ""}, None),
        (
            b"a\n1\n3\n",
            {"objective": "a"},
            "no feature columns: the CSV needs at least one column besides the objective",
        ),
        (
            b"a,b\n1,2\n3,4\n",
            {"objective_mode": "column"},
            'objective_mode "column" needs an objective column',
        ),
        (
            b"a,b\n1,2\n3,4\n",
            {"scaling": "max_norm:-1"},
            "scaling max_norm c must be a finite number > 0, got -1.0",
        ),
        (b"a,b\n1,2\n3,4\n", {"scaling": "unit"}, 'scaling must be "none", "max_norm:<c>" or a JSON object'),
        (
            b"a,b\n1,2\n3,4\n",
            {"scaling": '{"a": 0}'},
            "scale of feature 'a' must be a finite number > 0, got 0.0",
        ),
        (b"a,b\n1,2\n3,4\n", {"scaling": '{"zz": 2}'}, "scaling names unknown feature(s): 'zz'"),
        (b"a,b\n1,2\n3,4\n", {"scaling": "{bad"}, "scaling is not valid JSON"),
        (
            b"a,b\n0,0\n0,0\n",
            {"scaling": "max_norm:25"},
            "max_norm scaling is undefined: every feature row has norm 0",
        ),
    ],
)
async def test_upload_errors_name_the_problem(
    client: httpx.AsyncClient, content: bytes, form: dict[str, str], detail: str | None
) -> None:
    response = await upload(client, content, **form)
    if detail is None:
        assert response.status_code == 201, response.text
        return
    assert response.status_code == 422, response.text
    assert detail in response.json()["detail"]
    listed = await client.get("/v1/datasets", headers=ADMIN)
    assert listed.json()["count"] == 0  # nothing recorded


async def test_bad_cell_message_never_echoes_the_cell(client: httpx.AsyncClient) -> None:
    response = await upload(client, b"a,b\n1,2\n3,SECRET-VALUE-42\n")
    assert response.status_code == 422
    assert "SECRET" not in response.text and "42" not in response.text


async def test_failed_upload_leaves_no_files(client: httpx.AsyncClient, data_dir) -> None:
    response = await upload(client, b"a,b\n1,2\n3,4\n5,x\n")
    assert response.status_code == 422
    assert [p for p in (data_dir / "arrays").rglob("*") if p.is_file()] == []


async def test_form_validation_is_422_with_a_readable_detail(client: httpx.AsyncClient) -> None:
    response = await upload(client, b"a,b\n1,2\n3,4\n", noise_std=-1)
    assert response.status_code == 422
    assert (
        response.json()["detail"]
        == "invalid request: body field 'noise_std': Input should be greater than or equal to 0"
    )
    response = await client.post("/v1/datasets", headers=ADMIN, data={"name": "x"})
    assert response.status_code == 422
    assert "body field 'file': Field required" in response.json()["detail"]


async def test_errors_are_found_across_chunk_boundaries(client: httpx.AsyncClient, monkeypatch) -> None:
    monkeypatch.setattr(csvparse, "CHUNK_BYTES", 64)
    X, y = synthetic(n=300, d=4)
    good = make_csv(X, y)
    response = await upload(client, good, objective="outcome")
    assert response.status_code == 201, response.text
    assert response.json()["n"] == 300
    lines = good.decode().split("\n")
    lines[251] = lines[251].replace(",", ",abc", 1)  # data row 251, line 252, second column
    response = await upload(client, "\n".join(lines).encode(), objective="outcome")
    assert response.status_code == 422
    assert (
        response.json()["detail"]
        == "data row 251 (line 252), column 'x1' (column 2): the cell is not a number"
    )


def test_parser_matches_numpy_and_counts_rows(tmp_path) -> None:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((1000, 7)) * 10.0 ** rng.integers(-5, 6, size=(1000, 7))
    content = make_csv(X)
    for chunk in (50, 1000, 1 << 20):
        import io

        stream = csvparse.CsvStream(io.BytesIO(content), chunk_bytes=chunk)
        parser = csvparse.ChunkParser(stream.header, list(range(7)))
        rows = 0
        parts = []
        for first_line, buf in stream.chunks():
            values = parser.parse(first_line, rows + 1, buf)
            rows += values.shape[0]
            parts.append(values)
        np.testing.assert_array_equal(np.vstack(parts), X)  # repr round-trips exactly
        assert stream.sha256 == hashlib.sha256(content).hexdigest()


async def test_per_feature_scaling_divides_columns(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=40, d=3)
    scales = {"x0": 10.0, "x2": 0.5}
    response = await upload(client, make_csv(X), scaling=json.dumps(scales))
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["scaling"]["kind"] == "per_feature"
    assert body["scaling"]["scales"] == scales and body["scaling"]["formal_guarantee"] is True
    report = await client.get(
        f"/v1/datasets/{body['id']}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
    )
    expected = centred_sigma_min(X / np.array([10.0, 1.0, 0.5]))
    assert report.json()["sigma_min"] == pytest.approx(expected, rel=1e-9)


async def test_max_norm_scaling_is_labelled_outside_the_guarantee(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=40, d=3)
    response = await upload(client, make_csv(X), scaling="max_norm:25")
    assert response.status_code == 201, response.text
    info = response.json()["scaling"]
    assert info["kind"] == "max_norm" and info["max_norm"] == 25.0
    assert info["formal_guarantee"] is False and "OUTSIDE the formal" in info["note"]
    ds = response.json()["id"]
    report = await client.get(
        f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
    )
    factor = 25.0 / np.linalg.norm(X, axis=1).max()
    assert report.json()["sigma_min"] == pytest.approx(centred_sigma_min(X * factor), rel=1e-9)
    release = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 2}
    )
    assert release.status_code == 201
    assert release.json()["formal_guarantee"] is False and release.json()["scaling"]["kind"] == "max_norm"


async def test_get_missing_dataset_is_404(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/datasets/999", headers=ADMIN)
    assert response.status_code == 404
    assert response.json() == {"detail": "dataset 999 does not exist"}


async def test_upload_over_the_limit_is_413(settings: Settings) -> None:
    small = settings.model_copy(update={"max_upload_bytes": 200})
    app = create_app(small)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            big = b"a,b,c\n" + b"1.0,2.0,3.0\n" * 120_000
            assert len(big) > 200 + UPLOAD_SLACK_BYTES  # past the file limit plus the multipart framing slack
            response = await upload(client, big)  # httpx announces Content-Length: refused before reading
            assert response.status_code == 413
            assert response.json()["detail"] == (
                "the upload is larger than the limit of 200 bytes (setting POBO_CURATOR_MAX_UPLOAD_BYTES)"
            )

            async def chunks():  # no Content-Length: cut off while streaming
                yield b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n'
                yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.csv"\r\n\r\n'
                for _ in range(20000):
                    yield b"1.0,2.0,3.0\n" * 10
                yield b"\r\n--b--\r\n"

            response = await client.post(
                "/v1/datasets",
                headers={**ADMIN, "Content-Type": "multipart/form-data; boundary=b"},
                content=chunks(),
            )
            assert response.status_code == 413
            assert "larger than the limit of 200 bytes" in response.json()["detail"]
            assert (await client.get("/v1/datasets", headers=ADMIN)).json()["count"] == 0
    finally:
        app.state.components.db.dispose()


async def test_file_part_over_the_limit_is_413_even_within_the_slack(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"max_upload_bytes": 100}))
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            X, _ = synthetic(n=10, d=3)
            content = make_csv(X)
            response = await upload(client, content)
            # the multipart slack lets the request through the guard; the route checks the file itself
            assert response.status_code == 413
            assert response.json()["detail"] == (
                f"the CSV is {len(content)} bytes; the limit is 100 bytes "
                "(setting POBO_CURATOR_MAX_UPLOAD_BYTES)"
            )
    finally:
        app.state.components.db.dispose()


def test_parallel_parse_matches_serial_and_numbers_rows_the_same(monkeypatch) -> None:
    import io

    X, y = synthetic(n=500, d=3)
    content = make_csv(X, y)
    lines = content.decode().split("\n")
    lines[400] = lines[400] + ",1.5"  # data row 400 (line 401) becomes ragged
    bad = "\n".join(lines).encode()
    results = {}
    for workers in (1, 2):
        stream = csvparse.CsvStream(io.BytesIO(content), chunk_bytes=700)
        parser = csvparse.ChunkParser(stream.header, [0, 1, 2, 3])
        results[workers] = np.vstack(list(csvparse.iter_values(stream, parser, workers=workers)))
        stream = csvparse.CsvStream(io.BytesIO(bad), chunk_bytes=700)
        parser = csvparse.ChunkParser(stream.header, [0, 1, 2, 3])
        with pytest.raises(csvparse.RowError) as err:
            list(csvparse.iter_values(stream, parser, workers=workers))
        assert err.value.detail == (
            "data row 400 (line 401) has 5 field(s) but the header has 4 columns (ragged row)"
        )
    np.testing.assert_array_equal(results[1], results[2])
    np.testing.assert_array_equal(results[1], np.column_stack([X, y]))


@pytest.fixture
def narrow(settings: Any) -> Any:
    """The service with small limits: 5 feature columns, releases of at most 8 KiB."""
    settings.max_features = 5
    settings.max_release_bytes = 8 * 1024
    return settings


async def test_wider_files_are_refused_with_the_limit_and_the_setting(
    narrow: Any, client: httpx.AsyncClient
) -> None:
    """Issue 12, item 2: no operation may fail with a 500 on an input size a setting allows; wider uploads
    are refused at upload, naming the limit and the setting, and nothing is stored."""
    X, _ = synthetic(n=20, d=6)
    r = await upload(client, make_csv(X))
    assert r.status_code == 413
    assert r.json()["detail"] == (
        "the CSV has 6 feature columns; the limit is 5 (setting POBO_CURATOR_MAX_FEATURES): select fewer "
        "with the form field `features`, or raise the limit"
    )
    ok = await upload(client, make_csv(X), features="x0,x1,x2,x3,x4")
    assert ok.status_code == 201
    assert (await client.get("/v1/datasets", headers=ADMIN)).json()["count"] == 1


async def test_a_release_too_large_for_memory_is_refused_before_any_spending(
    narrow: Any, client: httpx.AsyncClient
) -> None:
    X, _ = synthetic(n=300, d=4)
    ds = (await upload(client, make_csv(X))).json()["id"]
    big = await client.post(f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-6})
    assert big.status_code == 413  # 300 x 4 x 8 bytes = 9600 > 8192
    assert "setting POBO_CURATOR_MAX_RELEASE_BYTES" in big.json()["detail"]
    assert (await client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()["entries"] == []
    small = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-6, "r": 3}
    )
    assert small.status_code == 201
