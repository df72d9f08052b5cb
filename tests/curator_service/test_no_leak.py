"""Property: no response body of any endpoint ever contains a raw feature value of an uploaded dataset.

Hypothesis draws small datasets of distinctive (non-integer) feature values; every curator endpoint is
then called — admin and partner views, JSON and .npy downloads, and the error paths — and each body is
searched for every raw value: as a JSON number, as text (the CSV spelling), and as float64 bytes.
(The static OpenAPI document is not derived from data and is left out.)
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.curator_service.conftest import ADMIN, bearer, make_csv, upload

pytestmark = pytest.mark.anyio

_value = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False).filter(
    lambda v: abs(v) > 1e-3 and v != round(v) and abs(v * 8 - round(v * 8)) > 1e-9
)


@st.composite
def datasets(draw: st.DrawFn) -> np.ndarray:
    n = draw(st.integers(min_value=3, max_value=10))
    d = draw(st.integers(min_value=1, max_value=4))
    return np.array(draw(st.lists(_value, min_size=n * d, max_size=n * d))).reshape(n, d)


def _numbers(node: Any) -> list[float]:
    if isinstance(node, dict):
        return [x for v in node.values() for x in _numbers(v)]
    if isinstance(node, list):
        return [x for v in node for x in _numbers(v)]
    if isinstance(node, int | float) and not isinstance(node, bool):
        return [float(node)]
    return []


def _assert_no_leak(response: httpx.Response, raw: np.ndarray, where: str) -> None:
    values = {float(v) for v in raw.ravel()}
    body = response.content
    for v in values:
        assert np.float64(v).tobytes() not in body, f"{where}: float64 bytes of a raw value"
        spelled = re.compile(rb"(?<![0-9.eE+-])" + re.escape(repr(v).encode()) + rb"(?![0-9eE])")
        assert not spelled.search(body), f"{where}: the text of a raw value"
    if response.headers.get("content-type", "").startswith("application/json") and body:
        leaked = values.intersection(_numbers(json.loads(body)))
        assert not leaked, f"{where}: raw value(s) as JSON numbers"


async def _exercise(client: httpx.AsyncClient, X: np.ndarray) -> list[tuple[str, httpx.Response]]:
    n = X.shape[0]
    y = np.arange(n) + 0.5
    out: list[tuple[str, httpx.Response]] = []

    async def call(method: str, url: str, **kw: Any) -> httpx.Response:
        r = await client.request(method, url, **kw)
        out.append((f"{method} {url}", r))
        return r

    up = await upload(client, make_csv(X, y), objective="outcome", epsilon_budget=2)
    out.append(("POST /v1/datasets", up))
    assert up.status_code == 201, up.text
    ds = up.json()["id"]
    manual = await upload(client, make_csv(X))
    out.append(("POST /v1/datasets (manual)", manual))
    bad = make_csv(X).decode().split("\n")
    bad[2] = bad[2].replace(bad[2].split(",")[0], "not-a-number", 1)
    out.append(("POST /v1/datasets (bad)", await upload(client, "\n".join(bad).encode())))
    await call("GET", "/v1/datasets", headers=ADMIN)
    await call("GET", f"/v1/datasets/{ds}", headers=ADMIN)
    await call(
        "GET", f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5, "r_max": 5}
    )
    rel = await call("POST", f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5})
    rid = rel.json()["id"]
    mrel = await call(  # the same rows again: the same population, and the paper's mechanism
        "POST",
        f"/v1/datasets/{manual.json()['id']}/releases",
        headers=ADMIN,
        json={
            "epsilon": 1,
            "delta": 1e-5,
            "r": 1,
            "mechanism": "po-gp-ucb",
            "acknowledge_no_guarantee": True,
        },
    )
    await call("POST", f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 5, "delta": 1e-5})
    await call("GET", f"/v1/datasets/{ds}/ledger", headers=ADMIN)
    await call("GET", "/v1/populations", headers=ADMIN)
    await call("GET", f"/v1/populations/{up.json()['population_id']}", headers=ADMIN)
    await call("GET", f"/v1/populations/{up.json()['population_id']}/ledger", headers=ADMIN)
    await call("GET", f"/v1/datasets/{ds}/releases", headers=ADMIN)
    p = await call(
        "POST",
        "/v1/partners",
        headers=ADMIN,
        json={"name": "p", "release_ids": [rid, mrel.json()["id"]], "max_queries": 3},
    )
    ph = bearer(p.json()["token"])
    pid = p.json()["id"]
    for headers in (ADMIN, ph):
        await call("GET", "/v1/releases", headers=headers)
        await call("GET", f"/v1/releases/{rid}", headers=headers)
        await call("GET", f"/v1/releases/{rid}/rows", headers=headers)
        await call("GET", f"/v1/releases/{rid}/rows", headers={**headers, "Accept": "application/x-npy"})
    await call("GET", "/v1/partners", headers=ADMIN)
    await call("GET", f"/v1/partners/{pid}", headers=ADMIN)
    await call("GET", "/v1/partners/me", headers=ph)
    await call("POST", f"/v1/partners/{pid}/grants", headers=ADMIN, json={"release_ids": [rid]})
    q = await call(
        "POST", f"/v1/releases/{rid}/queries", headers={**ph, "Idempotency-Key": "a"}, json={"index": 1}
    )
    await call(
        "POST", f"/v1/releases/{rid}/queries", headers={**ph, "Idempotency-Key": "a"}, json={"index": 1}
    )
    await call("POST", f"/v1/releases/{rid}/queries", headers=ph, json={"index": n})
    await call("GET", f"/v1/queries/{q.json()['id']}", headers=ph)
    mq = await call("POST", f"/v1/releases/{mrel.json()['id']}/queries", headers=ph, json={"index": 0})
    await call("POST", f"/v1/queries/{mq.json()['id']}/result", headers=ADMIN, json={"y": 0.25})
    await call("POST", f"/v1/releases/{rid}/queries", headers=ph, json={"index": 0})
    await call("POST", f"/v1/releases/{rid}/queries", headers=ph, json={"index": 0})  # 429
    await call("GET", f"/v1/releases/{rid}/queries", headers=ph)
    await call("GET", f"/v1/releases/{rid}/queries", headers=ADMIN)
    await call("GET", "/v1/datasets/999", headers=ADMIN)
    await call("GET", f"/v1/datasets/{ds}", headers=ph)
    await call("GET", "/v1/access-log", headers=ADMIN)
    await call("GET", "/healthz")
    await call("DELETE", f"/v1/partners/{pid}", headers=ADMIN)
    return out


@settings(
    max_examples=6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(X=datasets())
async def test_no_response_contains_a_raw_feature_value(client: httpx.AsyncClient, X: np.ndarray) -> None:
    assume(not set(X.ravel().tolist()) & set((np.arange(X.shape[0]) + 0.5).tolist()))
    responses = await _exercise(client, X)
    codes = {where: r.status_code for where, r in responses}
    assert codes["POST /v1/datasets (bad)"] == 422
    assert 429 in codes.values() and 409 in codes.values() and 404 in codes.values()
    for where, response in responses:
        _assert_no_leak(response, X, where)


def test_the_leak_check_has_teeth() -> None:
    """Control: the same check flags a body that does contain a raw value."""
    X = np.array([[1.234567, 2.345678], [3.456789, 4.567891], [5.678912, 6.789123]])
    fake = httpx.Response(200, json={"rows": X.tolist()})
    with pytest.raises(AssertionError):
        _assert_no_leak(fake, X, "control")
    fake_npy = httpx.Response(200, content=X.tobytes(), headers={"content-type": "application/x-npy"})
    with pytest.raises(AssertionError):
        _assert_no_leak(fake_npy, X, "control")
