"""POST /v1/datasets/{id}/releases, GET /v1/releases[/{id}[/rows]]."""

from __future__ import annotations

import asyncio
import hashlib
import io
import time

import httpx
import numpy as np
import pytest

from curator_service.services import privacy as privacy_service
from curator_service.services import releases as release_service
from shared.errors import InputDataError
from shared.privacy.gaussian import calibrate
from tests.curator_service.conftest import ADMIN, World, bearer, make_csv, synthetic, upload

pytestmark = pytest.mark.anyio


async def test_default_release_is_gaussian_and_recorded(world: World) -> None:
    rel = world.release
    assert set(rel) == {
        "id",
        "dataset_id",
        "mechanism",
        "formal_guarantee",
        "n",
        "r",
        "epsilon",
        "delta",
        "noise_std",
        "lift",
        "omega",
        "sha256",
        "created_at",
        "lifted",
        "sigma_min",
        "scaling",
        "allow_large_delta",
        "acknowledged_no_guarantee",
    }
    assert (rel["dataset_id"], rel["n"], rel["r"]) == (world.dataset["id"], 120, 4)
    assert (rel["mechanism"], rel["formal_guarantee"], rel["epsilon"], rel["delta"]) == (
        "gaussian",
        True,
        1.0,
        1e-5,
    )
    assert rel["noise_std"] == pytest.approx(calibrate(1.0, 1e-5, 6).sigma, rel=1e-12)
    assert rel["noise_std"] == pytest.approx(3.7306, abs=1e-3)  # Balle & Wang's sigma at (1, 1e-5)
    assert [rel[k] for k in ("lift", "lifted", "omega", "sigma_min")] == [None] * 4
    assert rel["allow_large_delta"] is False and rel["acknowledged_no_guarantee"] is False
    again = await world.client.get(f"/v1/releases/{rel['id']}", headers=ADMIN)
    assert again.status_code == 200 and again.json() == rel


async def test_partner_view_omits_curator_private_fields(world: World) -> None:
    response = await world.client.get(f"/v1/releases/{world.release['id']}", headers=world.partner_headers)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {
        "id",
        "dataset_id",
        "mechanism",
        "formal_guarantee",
        "n",
        "r",
        "epsilon",
        "delta",
        "noise_std",
        "lift",
        "omega",
        "sha256",
        "created_at",
    }
    assert body["mechanism"] == "gaussian" and body["noise_std"] == world.release["noise_std"]
    listed = await world.client.get("/v1/releases", headers=world.partner_headers)
    assert listed.json() == {"data": [body], "count": 1}
    assert "sigma_min" not in listed.text and "lifted" not in listed.text


async def test_rows_json_and_npy_are_the_same_immutable_bytes(world: World) -> None:
    rid, sha = world.release["id"], world.release["sha256"]
    npy = await world.client.get(
        f"/v1/releases/{rid}/rows", headers={**world.partner_headers, "Accept": "application/x-npy"}
    )
    assert npy.status_code == 200
    assert npy.headers["content-type"] == "application/x-npy"
    assert npy.headers["etag"] == f'"{sha}"'
    assert hashlib.sha256(npy.content).hexdigest() == sha
    Z = np.load(io.BytesIO(npy.content), allow_pickle=False)
    assert Z.shape == (120, 4) and Z.dtype == np.float64
    js = await world.client.get(f"/v1/releases/{rid}/rows", headers=world.partner_headers)
    assert js.status_code == 200 and js.headers["etag"] == f'"{sha}"'
    body = js.json()
    assert body["sha256"] == sha and body["n"] == 120 and body["offset"] == 0
    np.testing.assert_array_equal(np.array(body["rows"]), Z)  # exact float64 round trip
    again = await world.client.get(
        f"/v1/releases/{rid}/rows", headers={**ADMIN, "Accept": "application/x-npy"}
    )
    assert again.content == npy.content
    page = await world.client.get(
        f"/v1/releases/{rid}/rows", headers=ADMIN, params={"offset": 100, "limit": 50}
    )
    np.testing.assert_array_equal(np.array(page.json()["rows"]), Z[100:])
    fmt = await world.client.get(f"/v1/releases/{rid}/rows", headers=ADMIN, params={"format": "npy"})
    assert fmt.content == npy.content
    cached = await world.client.get(
        f"/v1/releases/{rid}/rows", headers={**ADMIN, "If-None-Match": f'"{sha}"'}
    )
    assert cached.status_code == 304 and cached.content == b""


async def test_release_is_a_centred_projection_of_the_features(world: World) -> None:
    """Z^T Z is invariant to nothing we control, but Z is centred (X~ has centred columns)."""
    rid = world.release["id"]
    npy = await world.client.get(f"/v1/releases/{rid}/rows", headers={**ADMIN, "Accept": "application/x-npy"})
    Z = np.load(io.BytesIO(npy.content))
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-8 * np.abs(Z).max())


async def test_two_releases_use_fresh_randomness(world: World) -> None:
    ds = world.dataset["id"]
    a = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 4}
    )
    b = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 4}
    )
    assert a.status_code == b.status_code == 201
    assert len({world.release["sha256"], a.json()["sha256"], b.json()["sha256"]}) == 3


async def test_lift_always_is_recorded(client: httpx.AsyncClient) -> None:
    rng = np.random.default_rng(5)
    X = rng.standard_normal((200, 3)) * 1e6  # sigma_min far above omega: auto would not lift
    ds = (await upload(client, make_csv(X))).json()["id"]
    alg1 = {"mechanism": "po-gp-ucb", "acknowledge_no_guarantee": True}
    auto = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 2, **alg1}
    )
    always = await client.post(
        f"/v1/datasets/{ds}/releases",
        headers=ADMIN,
        json={"epsilon": 1, "delta": 1e-5, "r": 2, "lift": "always", **alg1},
    )
    assert auto.json()["lifted"] is False and auto.json()["lift"] == "auto"
    assert always.json()["lifted"] is True and always.json()["lift"] == "always"
    for rel in (auto.json(), always.json()):
        assert rel["mechanism"] == "po-gp-ucb" and rel["formal_guarantee"] is False
        assert rel["acknowledged_no_guarantee"] is True and rel["noise_std"] is None


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            {"epsilon": 0, "delta": 1e-5, "r": 2},
            "body field 'epsilon': Input should be greater than or equal to 0.000001",
        ),
        ({"epsilon": 1, "delta": 1, "r": 2}, "body field 'delta': Input should be less than 1"),
        ({"epsilon": 1, "delta": 1e-5, "r": 0}, "body field 'r': Input should be greater than or equal to 1"),
        (
            {"epsilon": 1, "delta": 1e-5, "r": 2, "lift": "never"},
            "body field 'lift': Input should be 'auto' or 'always'",
        ),
        (
            {"epsilon": 1, "delta": 1e-5, "r": 2, "seed": 1},
            "body field 'seed': Extra inputs are not permitted",
        ),
        ({"epsilon": 1, "delta": 1e-5, "mechanism": "jl"}, "Input should be 'gaussian' or 'po-gp-ucb'"),
        (
            {"epsilon": 1, "delta": 1e-5, "r": 2, "mechanism": "po-gp-ucb"},
            "has no formal privacy guarantee when the dataset has more rows than features + 1",
        ),
        (
            {"epsilon": 1, "delta": 1e-5, "r": 2, "mechanism": "po-gp-ucb"},
            'send "acknowledge_no_guarantee": true to release it anyway',
        ),
        (
            {"epsilon": 1, "delta": 1e-5, "mechanism": "po-gp-ucb", "acknowledge_no_guarantee": True},
            "r is required for mechanism 'po-gp-ucb'",
        ),
        ({"epsilon": 1, "delta": 1e-5, "lift": "always"}, "lift applies only to mechanism 'po-gp-ucb'"),
        (
            {
                "epsilon": 1,
                "delta": 1e-5,
                "r": 2,
                "mechanism": "po-gp-ucb",
                "acknowledge_no_guarantee": "yes",
            },
            "body field 'acknowledge_no_guarantee': Input should be a valid boolean",
        ),
        ({"epsilon": 1, "delta": 1e-5, "allow_large_delta": 1}, "Input should be a valid boolean"),
    ],
)
async def test_release_validation(world: World, body: dict, detail: str) -> None:
    response = await world.client.post(
        f"/v1/datasets/{world.dataset['id']}/releases", headers=ADMIN, json=body
    )
    assert response.status_code == 422
    assert detail in response.json()["detail"]


async def test_release_of_missing_dataset_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/datasets/42/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 2}
    )
    assert response.status_code == 404 and response.json() == {"detail": "dataset 42 does not exist"}


async def test_missing_release_is_404(world: World) -> None:
    for headers in (ADMIN, world.partner_headers):
        response = await world.client.get("/v1/releases/999", headers=headers)
        assert response.status_code == 404 and response.json() == {"detail": "release 999 does not exist"}


async def test_failed_computation_returns_the_budget(world: World, monkeypatch, data_dir) -> None:
    ds = world.dataset["id"]

    def broken(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(release_service, "gaussian_release", broken)
    response = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 2}
    )
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error; see the curator's log"}

    def invalid(*_args, **_kwargs):
        raise InputDataError("r must be an integer >= 1, got 0")

    monkeypatch.setattr(release_service, "gaussian_release", invalid)
    response = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 2}
    )
    assert response.status_code == 422 and response.json() == {"detail": "r must be an integer >= 1, got 0"}
    ledger = (await world.client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()
    assert ledger["epsilon_spent"] == 1.0 and len(ledger["entries"]) == 1  # only the fixture's release
    assert len(list((data_dir / "arrays" / "releases").iterdir())) == 1


async def test_release_runs_off_the_event_loop(world: World, monkeypatch) -> None:
    real = release_service.gaussian_release

    def slow(*args, **kwargs):
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(release_service, "gaussian_release", slow)
    ds = world.dataset["id"]
    started = time.perf_counter()
    task = asyncio.create_task(
        world.client.post(
            f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 2}
        )
    )
    await asyncio.sleep(0.1)
    health = await world.client.get("/healthz")
    meta = await world.client.get(f"/v1/releases/{world.release['id']}", headers=world.partner_headers)
    answered = time.perf_counter() - started
    assert health.status_code == 200 and meta.status_code == 200
    assert answered < 0.9 and not task.done()
    assert (await task).status_code == 201


async def test_tampered_release_file_is_refused(world: World, app, data_dir) -> None:
    path = next((data_dir / "arrays" / "releases").iterdir())
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    app.state.components.store._verified.clear()
    response = await world.client.get(
        f"/v1/releases/{world.release['id']}/rows", headers={**ADMIN, "Accept": "application/x-npy"}
    )
    assert response.status_code == 500
    assert response.json()["detail"].startswith("a stored array failed its sha256 integrity check")


async def test_nothing_but_z_is_stored_for_a_release(world: World, data_dir, app) -> None:
    """The projection matrix M (d x r), the noise and any seed are never written anywhere."""
    files = sorted((data_dir / "arrays").rglob("*.npy"))
    shapes = sorted(np.load(p, mmap_mode="r").shape for p in files)
    assert shapes == sorted([(120,), (120, 6), (120, 4)])  # outcomes, features, Z
    from sqlalchemy import inspect

    columns = {c["name"] for c in inspect(app.state.components.db.engine).get_columns("curator_releases")}
    assert not any("seed" in c or c in {"m", "projection"} for c in columns)


async def test_partner_without_grant_cannot_tell_the_release_exists(world: World) -> None:
    """Issue 12, item 9: an ungranted release answers exactly like a missing one (404, same detail)."""
    other = await world.client.post(
        "/v1/partners", headers=ADMIN, json={"name": "b", "release_ids": [], "max_queries": 1}
    )
    headers = bearer(other.json()["token"])
    rid = world.release["id"]
    for release in (rid, 999):
        for path in ("", "/rows", "/queries", "/queries/verify"):
            response = await world.client.get(f"/v1/releases/{release}{path}", headers=headers)
            assert response.status_code == 404, path
            assert response.json() == {"detail": f"release {release} does not exist"}
    assert (await world.client.get("/v1/releases", headers=headers)).json() == {"data": [], "count": 0}


async def test_sigma_min_is_cached_after_the_first_report(world: World, monkeypatch) -> None:
    ds = world.dataset["id"]
    first = await world.client.get(
        f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
    )

    def fail(*_a, **_k):
        raise AssertionError("sigma_min recomputed")

    monkeypatch.setattr(privacy_service, "centred_sigma_min", fail)
    second = await world.client.get(
        f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
    )
    assert second.status_code == 200 and second.json()["sigma_min"] == first.json()["sigma_min"]


async def test_uncached_sigma_min_is_computed_once(client: httpx.AsyncClient, monkeypatch) -> None:
    X, _ = synthetic(n=40, d=3)
    ds = (await upload(client, make_csv(X))).json()["id"]
    calls = []
    real = privacy_service.centred_sigma_min
    monkeypatch.setattr(privacy_service, "centred_sigma_min", lambda X: calls.append(1) or real(X))
    for _ in range(3):
        r = await client.get(
            f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
        )
        assert r.status_code == 200
    assert calls == [1]


async def test_json_rows_are_paged_not_unbounded(world: World, monkeypatch) -> None:
    """Issue 12, item 2: no size a setting allows may end in a 500 (a JSON page of a big release would);
    above the cap the answer is a 413 that says how to get the rows."""
    monkeypatch.setattr(release_service, "MAX_JSON_VALUES", 100)  # the fixture's release: 120 x 4 values
    rid = world.release["id"]
    whole = await world.client.get(f"/v1/releases/{rid}/rows", headers=world.partner_headers)
    assert whole.status_code == 413
    assert "download the .npy file" in whole.json()["detail"] and "limit=25" in whole.json()["detail"]
    page = await world.client.get(
        f"/v1/releases/{rid}/rows", headers=world.partner_headers, params={"limit": 25}
    )
    assert page.status_code == 200 and len(page.json()["rows"]) == 25
    npy = await world.client.get(
        f"/v1/releases/{rid}/rows", headers={**world.partner_headers, "Accept": "application/x-npy"}
    )
    assert npy.status_code == 200
