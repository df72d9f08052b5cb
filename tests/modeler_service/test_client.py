"""``shared.protocol.client``: retries that reuse the Idempotency-Key, errors that carry the curator's detail,
sha256-verified downloads, answers that are not a pobo curator's; and the endpoint table the client's methods
are made from (httpx.MockTransport, no server)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from shared.protocol.client import (
    CuratorClient,
    CuratorError,
    CuratorProtocolError,
    CuratorUnavailable,
    ReleaseIntegrityError,
)
from shared.protocol.client.endpoints import ENDPOINTS

QUERY = {
    "id": 7,
    "release_id": 1,
    "partner_id": 2,
    "index": 42,
    "status": "complete",
    "y": 0.5,
    "created_at": "2026-01-01T00:00:00Z",
    "completed_at": "2026-01-01T00:00:00Z",
}


def npy_bytes(Z: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, Z, allow_pickle=False)
    return buf.getvalue()


def release(sha: str) -> dict[str, object]:
    return {
        "id": 1,
        "dataset_id": 1,
        "n": 4,
        "r": 2,
        "epsilon": 1.0,
        "delta": 1e-4,
        "mechanism": "po-gp-ucb",
        "formal_guarantee": False,
        "noise_std": None,
        "lift": "auto",
        "omega": 3.0,
        "sha256": sha,
        "created_at": "2026-01-01T00:00:00Z",
    }


def client_with(handler, **kw) -> CuratorClient:  # type: ignore[no-untyped-def]
    return CuratorClient(
        "http://curator.test", "tok", transport=httpx.MockTransport(handler), backoff=0.0, **kw
    )


def test_create_query_retries_5xx_and_connection_errors_with_the_same_key() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            raise httpx.ConnectError("refused", request=request)
        if len(seen) == 2:
            raise httpx.ReadTimeout("slow", request=request)  # may have been processed: still safe (same key)
        if len(seen) == 3:
            return httpx.Response(503, json={"detail": "busy"})
        return httpx.Response(201, json=QUERY)

    with client_with(handler, retries=4) as c:
        q = c.create_query(1, 42, idempotency_key="study:1")
    assert q.id == 7 and q.y == 0.5
    assert len(seen) == 4
    assert {r.headers["Idempotency-Key"] for r in seen} == {"study:1"}
    assert all(json.loads(r.content) == {"index": 42} for r in seen)
    assert seen[0].headers["Authorization"] == "Bearer tok"


def test_generated_key_is_shared_by_the_retries_of_one_call_only() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            502 if len(seen) % 2 else 201, json=QUERY if len(seen) % 2 == 0 else {"detail": "x"}
        )

    with client_with(handler) as c:
        c.create_query(1, 42)
        c.create_query(1, 42)
    keys = [r.headers["Idempotency-Key"] for r in seen]
    assert keys[0] == keys[1] and keys[2] == keys[3] and keys[0] != keys[2]


def test_errors_carry_the_curators_detail() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/releases"):
            return httpx.Response(409, json={"detail": "budget exceeded: epsilon 11 > 10"})
        if request.url.path.endswith("/queries"):
            return httpx.Response(429, json={"detail": "query quota of 5 is used up"})
        return httpx.Response(
            422, json={"detail": [{"loc": ["query", "epsilon"], "msg": "Input should be greater than 0"}]}
        )

    with client_with(handler) as c:
        with pytest.raises(CuratorError) as err:
            c.create_release(1, epsilon=11, delta=1e-4, r=5)
        assert err.value.status_code == 409
        assert err.value.detail == "budget exceeded: epsilon 11 > 10"
        assert "409" in str(err.value) and "budget exceeded" in str(err.value)
        with pytest.raises(CuratorError) as err:
            c.create_query(1, 3)
        assert (err.value.status_code, err.value.detail) == (429, "query quota of 5 is used up")
        with pytest.raises(CuratorError) as err:
            c.privacy_report(1, epsilon=-1, delta=1e-4)
        assert (
            err.value.status_code == 422
            and err.value.detail == "query.epsilon: Input should be greater than 0"
        )


def test_exhausted_retries() -> None:
    calls = {"n": 0}

    def down(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        raise httpx.ConnectError("refused", request=request)

    with client_with(down, retries=2) as c, pytest.raises(CuratorUnavailable) as err:
        c.get_release(1)
    assert calls["n"] == 3 and err.value.status_code is None and "ConnectError" in err.value.detail

    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"detail": "internal server error"})

    with client_with(broken, retries=1) as c, pytest.raises(CuratorError) as err2:
        c.list_queries(1)
    assert err2.value.status_code == 500


def test_non_idempotent_posts_are_not_repeated_once_sent() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused", request=request)  # never sent: retried
        return httpx.Response(503, json={"detail": "busy"})  # sent: not repeated (a release spends budget)

    with client_with(handler, retries=4) as c, pytest.raises(CuratorError) as err:
        c.create_release(1, epsilon=1, delta=1e-4, r=5)
    assert calls["n"] == 2 and err.value.status_code == 503


def test_release_rows_are_verified(tmp_path: Path) -> None:
    Z = np.arange(8.0).reshape(4, 2)
    good = npy_bytes(Z)
    sha = hashlib.sha256(good).hexdigest()
    body = {"bytes": good}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/releases/1":
            return httpx.Response(200, json=release(sha))
        assert request.headers["Accept"] == "application/x-npy"
        return httpx.Response(200, content=body["bytes"])

    with client_with(handler) as c:
        np.testing.assert_array_equal(c.release_rows(1), Z)
        dest = tmp_path / "z.npy"
        assert c.download_release_rows(1, dest) == sha
        np.testing.assert_array_equal(np.load(dest), Z)
        body["bytes"] = good[:-1] + b"\x01"
        with pytest.raises(ReleaseIntegrityError, match="sha256"):
            c.release_rows(1)
        with pytest.raises(ReleaseIntegrityError):
            c.download_release_rows(1, tmp_path / "bad.npy")
    assert not (tmp_path / "bad.npy").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["z.npy"]  # no temp file left behind


def test_get_query_wait_extends_the_timeout_and_upload_streams_the_file(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/datasets":
            return httpx.Response(422, json={"detail": "the CSV has no header row"})
        return httpx.Response(200, json=QUERY)

    csv = tmp_path / "d.csv"
    csv.write_text("a,b\n1,2\n")
    with client_with(handler, timeout=5.0) as c:
        c.get_query(7, wait=30)
        with pytest.raises(CuratorError, match="no header row"):
            c.upload_dataset(csv, name="d", objective="b", scaling={"a": 2.0})
    assert seen[0].url.params["wait"] == "30"
    assert seen[0].extensions["timeout"]["read"] == 35.0
    content = seen[1].read()
    assert b'name="file"; filename="d.csv"' in content and b"1,2" in content
    assert b'{"a": 2.0}' in content


def test_token_is_not_in_repr() -> None:
    c = CuratorClient("http://curator.test", "super-secret")
    assert "super-secret" not in repr(c)
    c.close()


def test_gateway_timeouts_are_retried_with_the_same_key_and_404_carries_the_detail() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/queries/999":
            return httpx.Response(404, json={"detail": "query 999 not found"})
        if len(seen) < 3:
            return httpx.Response(504, json={"detail": "gateway timeout"})
        return httpx.Response(201, json=QUERY)

    with client_with(handler) as c:
        assert c.create_query(1, 42, idempotency_key="s:9").id == 7
        assert [r.headers["Idempotency-Key"] for r in seen] == ["s:9"] * 3
        with pytest.raises(CuratorError) as err:
            c.get_query(999)
    assert (err.value.status_code, err.value.detail) == (404, "query 999 not found")
    assert len(seen) == 4  # a 404 is not retried


def test_answers_that_are_not_a_pobo_curators_are_protocol_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/releases/1":
            return httpx.Response(200, json=release("0" * 64))
        if request.url.path == "/v1/releases/1/rows":
            return httpx.Response(302, headers={"location": "http://elsewhere.test/z.npy"})
        if request.url.path == "/healthz":
            return httpx.Response(200, text="<html>hello</html>", headers={"content-type": "text/html"})
        if request.url.path == "/v1/partners/me":
            return httpx.Response(200, json={"unexpected": True})
        return httpx.Response(502, text="<html>bad gateway</html>", headers={"content-type": "text/html"})

    with client_with(handler, retries=1) as c:
        with pytest.raises(CuratorProtocolError, match="never follows"):
            c.release_rows(1)
        with pytest.raises(CuratorProtocolError, match="expected the JSON of a pobo curator"):
            c.healthz()
        with pytest.raises(CuratorProtocolError, match="PartnerPublic"):
            c.get_partner()
        with pytest.raises(CuratorProtocolError) as err:
            c.list_datasets()
    assert err.value.status_code == 502


def test_the_endpoint_table_says_which_calls_may_be_repeated() -> None:
    not_repeatable = {name for name, ep in ENDPOINTS.items() if not ep.retry_safe}
    assert not_repeatable == {
        "upload_dataset",
        "create_release",
        "create_partner",
        "post_result",
        "post_results",  # a plate of measurements: a repeat would post them again
        "correct_result",  # a repeat would be a second correction
        "create_gradient_oracle",
    }
    assert {name for name, ep in ENDPOINTS.items() if ep.method == "GET"} <= {
        name for name, ep in ENDPOINTS.items() if ep.retry_safe
    }
    call = ENDPOINTS["create_query"].bind(release_id="3", index=5, idempotency_key=None)
    assert (call.method, call.path, call.parts.json, call.idempotent) == (
        "POST",
        "/v1/releases/3/queries",
        {"index": 5},
        True,
    )
    assert len(call.parts.headers["Idempotency-Key"]) == 32
    # every endpoint is reached through a method of the client (no dead rows in the table)
    wrappers = {"list_dataset_releases": "list_releases", "get_own_partner": "get_partner"}
    assert all(callable(getattr(CuratorClient, wrappers.get(name, name), None)) for name in ENDPOINTS)


def test_grant_and_revoke_are_retried_but_a_posted_result_is_not() -> None:
    seen: list[str] = []
    partner = {
        "id": 2,
        "name": "lab",
        "release_ids": [1],
        "max_queries": 5,
        "queries_used": 0,
        "revoked": False,
        "created_at": "2026-01-01T00:00:00Z",
    }

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if seen.count(seen[-1]) == 1:
            return httpx.Response(503, json={"detail": "busy"})
        return httpx.Response(200, json=partner)

    with client_with(handler) as c:
        c.grant(2, [1])
        c.revoke_partner(2)
        with pytest.raises(CuratorError) as err:
            c.post_result(7, 0.5)
    assert err.value.status_code == 503
    assert seen == ["POST /v1/partners/2/grants"] * 2 + ["DELETE /v1/partners/2"] * 2 + [
        "POST /v1/queries/7/result"
    ]
