"""Budgets belong to people, not to uploads: populations found by content or declared by name."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from tests.curator_service.conftest import ADMIN, make_csv, synthetic, upload

pytestmark = pytest.mark.anyio


async def _release(client: httpx.AsyncClient, ds: int, epsilon: float) -> httpx.Response:
    return await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": epsilon, "delta": 1e-6}
    )


async def test_a_reupload_of_the_same_rows_shares_the_budget(client: httpx.AsyncClient, data_dir) -> None:
    X, y = synthetic(n=60, d=4)
    first = (await upload(client, make_csv(X, y), objective="outcome", epsilon_budget=3)).json()
    assert first["population_reason"] == "new population" and first["epsilon_budget"] == 3
    again = await upload(client, make_csv(X, y), objective="outcome")
    assert again.status_code == 201
    second = again.json()
    assert second["population_id"] == first["population_id"]
    assert second["population_reason"] == f"these rows are the same rows as dataset {first['id']}"
    assert (await _release(client, first["id"], 2.0)).status_code == 201
    assert (await _release(client, second["id"], 1.0)).status_code == 201  # 2 + 1 = the budget
    refused = await _release(client, second["id"], 0.5)
    assert refused.status_code == 409
    assert f"(datasets {first['id']}, {second['id']}) has epsilon 0 left" in refused.json()["detail"]
    for ds in (first, second):
        view = (await client.get(f"/v1/datasets/{ds['id']}", headers=ADMIN)).json()
        assert view["epsilon_spent"] == 3.0 and view["epsilon_budget"] == 3
    ledger = (await client.get(f"/v1/datasets/{second['id']}/ledger", headers=ADMIN)).json()
    assert [e["dataset_id"] for e in ledger["entries"]] == [first["id"], second["id"]]
    assert ledger["dataset_ids"] == [first["id"], second["id"]]


async def test_shuffled_rows_and_feature_subsets_are_the_same_people(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=80, d=5, seed=2)
    names = [f"c{j}" for j in range(5)]
    base = (await upload(client, make_csv(X, names=names))).json()
    perm = np.random.default_rng(0).permutation(80)
    subset = (await upload(client, make_csv(X[perm][:, [3, 1]], names=["renamed", "other"]))).json()
    assert subset["population_id"] == base["population_id"]
    assert subset["population_reason"] == f"these rows are a subset of the features of dataset {base['id']}"
    reordered = (await upload(client, make_csv(X[perm][:, ::-1]))).json()
    assert reordered["population_reason"] == (
        f"these rows are the same feature columns as dataset {base['id']} (reordered or renamed)"
    )
    other, _ = synthetic(n=80, d=5, seed=3)
    fresh = (await upload(client, make_csv(other))).json()
    assert fresh["population_id"] != base["population_id"] and fresh["population_reason"] == "new population"
    fewer = (await upload(client, make_csv(X[:79]))).json()  # a row removed: not detected (declare it)
    assert fewer["population_id"] != base["population_id"]


async def test_declared_population_shares_one_budget_across_different_datasets(
    client: httpx.AsyncClient,
) -> None:
    A, _ = synthetic(n=50, d=3, seed=4)
    B, _ = synthetic(n=70, d=2, seed=5)
    a = (await upload(client, make_csv(A), population="ward 3", epsilon_budget=2)).json()
    b = (await upload(client, make_csv(B), population="ward 3")).json()
    assert a["population_id"] == b["population_id"] and a["population_name"] == "ward 3"
    assert a["population_reason"] == "declared: new population 'ward 3'"
    assert b["population_reason"] == "declared: population 'ward 3'" and b["epsilon_budget"] == 2
    pops = (await client.get("/v1/populations", headers=ADMIN)).json()
    assert pops["count"] == 1 and pops["data"][0]["dataset_ids"] == [a["id"], b["id"]]

    codes = await asyncio.gather(*(_release(client, ds, 0.5) for ds in [a["id"], b["id"]] * 4))
    assert sorted(r.status_code for r in codes) == [201] * 4 + [409] * 4  # 4 x 0.5 = the shared budget
    pop = (await client.get(f"/v1/populations/{a['population_id']}", headers=ADMIN)).json()
    assert pop["epsilon_spent"] == 2.0 and pop["epsilon_pld"] < 2.0
    ledger = (await client.get(f"/v1/populations/{a['population_id']}/ledger", headers=ADMIN)).json()
    assert len(ledger["entries"]) == 4 and {e["dataset_id"] for e in ledger["entries"]} <= {a["id"], b["id"]}


async def test_an_upload_cannot_change_a_populations_budget(client: httpx.AsyncClient, data_dir) -> None:
    X, _ = synthetic(n=40, d=3, seed=6)
    first = (await upload(client, make_csv(X), epsilon_budget=1)).json()
    files = sorted(p.name for p in (data_dir / "arrays").rglob("*.npy"))
    r = await upload(client, make_csv(X), epsilon_budget=10)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"these rows are the same rows as dataset {first['id']}; its population {first['population_id']} has "
        "epsilon_budget 1, this upload asked for 10. A budget belongs to the people in the rows and is set "
        "once, when their population is created: leave epsilon_budget and delta_budget out to join it. "
        "Nothing was stored."
    )
    assert sorted(p.name for p in (data_dir / "arrays").rglob("*.npy")) == files
    named = (await upload(client, make_csv(X[:10]), population="p", delta_budget=1e-4)).json()
    clash = await upload(client, make_csv(X[:20]), population="p", delta_budget=1e-3)
    assert clash.status_code == 409 and clash.json()["detail"].startswith("population 'p' exists;")
    assert (await upload(client, make_csv(X[:20]), population="p", delta_budget=1e-4)).status_code == 201
    assert named["delta_budget"] == 1e-4


async def test_population_field_is_validated(client: httpx.AsyncClient) -> None:
    X, _ = synthetic(n=10, d=2)
    r = await upload(client, make_csv(X), population="x" * 201)
    assert r.status_code == 422 and "population" in r.json()["detail"]
    assert (await client.get("/v1/populations/99", headers=ADMIN)).status_code == 404
