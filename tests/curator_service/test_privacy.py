"""GET /v1/datasets/{id}/privacy and the privacy ledger (basic composition)."""

from __future__ import annotations

import asyncio
import math

import httpx
import numpy as np
import pytest

from tests.curator_service.conftest import ADMIN, World, make_csv, synthetic, upload

pytestmark = pytest.mark.anyio


def omega(r: int, epsilon: float, delta: float) -> float:
    """Algorithm 1, line 5, written out independently of shared.privacy.po_gp_ucb."""
    return 16 * math.sqrt(r) * math.log(2 / delta) * math.log(16 * r / delta) / epsilon


async def test_privacy_report_against_an_independent_svd(client: httpx.AsyncClient) -> None:
    rng = np.random.default_rng(11)
    X = rng.standard_normal((300, 4)) * np.array([4e4, 3e4, 2e4, 175.0])  # sigma_min ~ 3000
    ds = (await upload(client, make_csv(X))).json()["id"]
    response = await client.get(
        f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 2.0, "delta": 1e-4, "r_max": 30}
    )
    assert response.status_code == 200, response.text
    report = response.json()
    s = np.linalg.svd(X - X.mean(axis=0), compute_uv=False)
    assert report["sigma_min"] == pytest.approx(s.min(), rel=1e-8)
    assert [row["r"] for row in report["table"]] == list(range(1, 31))
    for row in report["table"]:
        assert row["omega"] == pytest.approx(omega(row["r"], 2.0, 1e-4), rel=1e-12)
        assert row["feasible"] == (s.min() >= row["omega"])
    feasible = [row["r"] for row in report["table"] if row["feasible"]]
    assert feasible and feasible == list(range(1, max(feasible) + 1))
    assert report["recommended_r"] == max(feasible) < 30
    assert report["epsilon_spent"] == 0 and report["epsilon_left"] == 10 and report["fits_budget"] is True


async def test_no_feasible_r_gives_null_recommendation(world: World) -> None:
    response = await world.client.get(
        f"/v1/datasets/{world.dataset['id']}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
    )
    assert response.status_code == 200
    report = response.json()
    assert report["recommended_r"] is None and len(report["table"]) == 100
    assert not any(row["feasible"] for row in report["table"])
    # one release of (1, 1e-5) already spent by the fixture
    assert report["epsilon_spent"] == 1.0 and report["delta_spent"] == 1e-5
    budget = world.dataset["delta_budget"]  # the default: min(1e-3, 0.1 / n)
    assert budget == pytest.approx(min(1e-3, 0.1 / world.dataset["n"]))
    assert report["epsilon_left"] == 4.0 and report["delta_left"] == pytest.approx(budget - 1e-5)


async def test_privacy_report_errors(world: World) -> None:
    ds = world.dataset["id"]
    missing = await world.client.get(f"/v1/datasets/{ds}/privacy", headers=ADMIN)
    assert missing.status_code == 422
    assert "query field 'epsilon': Field required" in missing.json()["detail"]
    bad = await world.client.get(
        f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 2}
    )
    assert (
        bad.status_code == 422 and "query field 'delta': Input should be less than 1" in bad.json()["detail"]
    )
    nope = await world.client.get(
        "/v1/datasets/77/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 0.1}
    )
    assert nope.status_code == 404 and nope.json() == {"detail": "dataset 77 does not exist"}
    partner = await world.client.get(
        f"/v1/datasets/{ds}/privacy", headers=world.partner_headers, params={"epsilon": 1, "delta": 0.1}
    )
    assert partner.status_code == 403
    assert "sigma_min" not in partner.text


async def test_ledger_refuses_overspend_and_writes_nothing(world: World, data_dir) -> None:
    ds = world.dataset["id"]
    files_before = sorted(p.name for p in (data_dir / "arrays").rglob("*.npy"))
    ok = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 4.0, "delta": 1e-5, "r": 2}
    )
    assert ok.status_code == 201  # 1 + 4 = 5 = the budget: allowed
    files_before = sorted(p.name for p in (data_dir / "arrays").rglob("*.npy"))
    refused = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 0.01, "delta": 1e-5, "r": 2}
    )
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"privacy budget exceeded: this release needs epsilon=0.01 but population "
        f"{world.dataset['population_id']} (datasets {ds}) has epsilon 0 left (budget 5, spent 5); "
        "nothing was released"
    )
    assert sorted(p.name for p in (data_dir / "arrays").rglob("*.npy")) == files_before
    ledger = (await world.client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()
    assert [(e["epsilon"], e["status"]) for e in ledger["entries"]] == [(1.0, "spent"), (4.0, "spent")]
    assert ledger["epsilon_spent"] == 5.0
    releases = (await world.client.get(f"/v1/datasets/{ds}/releases", headers=ADMIN)).json()
    assert releases["count"] == 2


async def test_delta_budget_is_enforced_too(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=30, d=3)
    ds = (await upload(client, make_csv(X), delta_budget=1e-4)).json()["id"]
    a = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 6e-5, "r": 2}
    )
    assert a.status_code == 201
    b = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 6e-5, "r": 2}
    )
    assert b.status_code == 409
    assert b.json()["detail"].startswith(
        "privacy budget exceeded: this release needs delta=6e-05 but population"
    )


async def test_rounding_does_not_refuse_an_exact_fit(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=30, d=3)
    ds = (await upload(client, make_csv(X), epsilon_budget=1.0)).json()["id"]
    for eps in (0.3, 0.6, 0.1):  # 0.3 + 0.6 + 0.1 = 1.0000000000000002 in float64
        r = await client.post(
            f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": eps, "delta": 1e-6, "r": 1}
        )
        assert r.status_code == 201, r.text
    r = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1e-6, "delta": 1e-6, "r": 1}
    )
    assert r.status_code == 409


async def test_concurrent_releases_never_overspend(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=200, d=5)
    ds = (await upload(client, make_csv(X), epsilon_budget=5.0)).json()["id"]

    async def release() -> int:
        r = await client.post(
            f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1.0, "delta": 1e-6, "r": 3}
        )
        return r.status_code

    codes = await asyncio.gather(*(release() for _ in range(20)))
    assert sorted(codes) == [201] * 5 + [409] * 15
    ledger = (await client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()
    assert ledger["epsilon_spent"] == 5.0
    assert [e["status"] for e in ledger["entries"]] == ["spent"] * 5
    assert len({e["release_id"] for e in ledger["entries"]}) == 5
