"""Budgets belong to people, not to uploads: populations found by content or declared by name."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from shared.privacy.gaussian import calibrate, epsilon_for_change
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


# ------------------------------------------------------------------------------------- issue 31: accidents


def _cohort(n: int = 300, seed: int = 31) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Columns a hospital would have: age in years, systolic pressure, a lab value; and an outcome."""
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 90, n).astype(float)
    bp = np.round(rng.normal(125, 15, n), 1)
    lab = np.round(rng.lognormal(4.5, 0.3, n), 2)
    y = np.round(0.3 * age - 0.1 * bp + rng.normal(0, 5, n), 3)
    return np.column_stack([age, bp, lab]), y, ["age_years", "bp", "lab"]


@pytest.mark.parametrize(
    "accident",
    ["declared-name", "one-ulp", "overlapping-columns", "months", "shuffled-renamed", "outcome-only"],
)
async def test_every_accident_lands_in_the_original_population(
    client: httpx.AsyncClient, accident: str
) -> None:
    X, y, names = _cohort()
    first = (await upload(client, make_csv(X, y, names=names), objective="outcome")).json()
    perm = np.random.default_rng(0).permutation(len(y))
    if accident == "declared-name":  # the same upload, with a population name of its own
        r = await upload(client, make_csv(X, y, names=names), objective="outcome", population="ward 9")
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert f"population {first['population_id']}" in detail and "acknowledge_distinct_people" in detail
        assert (await client.get("/v1/populations", headers=ADMIN)).json()["count"] == 1  # nothing stored
        return
    if accident == "one-ulp":
        Z = X.copy()
        Z[17, 1] = np.nextafter(Z[17, 1], np.inf)
        again = await upload(client, make_csv(Z, y, names=names), objective="outcome")
    elif accident == "overlapping-columns":  # {age, bp, lab} then {bp, lab, heart rate}
        hr = np.random.default_rng(1).normal(70, 9, len(y)).round(1)
        again = await upload(client, make_csv(np.column_stack([X[:, 1:], hr]), names=["bp", "lab", "hr"]))
    elif accident == "months":
        Z = X.copy()
        Z[:, 0] *= 12.0
        again = await upload(client, make_csv(Z, names=["age_months", "bp", "lab"]))
    elif accident == "shuffled-renamed":
        again = await upload(client, make_csv(X[perm][:, ::-1], names=["c", "b", "a"]))
    else:  # the same outcomes, with other features (unrelated noise columns)
        other = np.random.default_rng(2).normal(size=(len(y), 2))
        again = await upload(client, make_csv(other[perm], y[perm]), objective="outcome")
    assert again.status_code == 201, again.text
    body = again.json()
    assert body["population_id"] == first["population_id"], body["population_reason"]
    assert body["population_reason"].startswith("these rows")


async def test_a_declared_population_that_contradicts_a_match_needs_an_acknowledgement(
    client: httpx.AsyncClient,
) -> None:
    X, y, names = _cohort(seed=32)
    first = (
        await upload(client, make_csv(X, y, names=names), objective="outcome", population="ward 1")
    ).json()
    again = await upload(client, make_csv(X, y, names=names), objective="outcome", population="ward 1")
    assert again.status_code == 201 and again.json()["population_id"] == first["population_id"]
    refused = await upload(client, make_csv(X, names=names), population="ward 2")
    assert refused.status_code == 409 and "'ward 1'" in refused.json()["detail"]
    no_name = await upload(client, make_csv(X, names=names), acknowledge_distinct_people="true")
    assert no_name.status_code == 422 and "needs a declared population" in no_name.json()["detail"]
    accepted = await upload(
        client, make_csv(X, names=names), population="ward 2", acknowledge_distinct_people="true"
    )
    assert accepted.status_code == 201, accepted.text
    body = accepted.json()
    assert body["population_id"] != first["population_id"] and body["acknowledged_distinct_people"] is True
    assert "declared distinct from population" in body["population_reason"]


async def test_mixed_scalings_are_charged_in_the_populations_relation(client: httpx.AsyncClient) -> None:
    """Issue 31, Why 2: one population, age declared at 1 year (the reference) and then at 0.01 years."""
    X, y, names = _cohort(seed=33)
    coarse = (
        await upload(client, make_csv(X, names=names), scaling='{"age_years": 1}', epsilon_budget=30)
    ).json()
    fine = (await upload(client, make_csv(X, names=names), scaling='{"age_years": 0.01}')).json()
    assert fine["population_id"] == coarse["population_id"] and fine["reference_factor"] == pytest.approx(100)
    assert coarse["reference_factor"] == 1.0
    population = (await client.get(f"/v1/populations/{coarse['population_id']}", headers=ADMIN)).json()
    assert [(r["feature"], r["scale"]) for r in population["reference"]] == [
        ("age_years", 1.0),
        ("bp", 1.0),
        ("lab", 1.0),
    ]

    async def report(epsilon: float, delta: float) -> dict:
        params = {"epsilon": epsilon, "delta": delta}
        return (await client.get(f"/v1/datasets/{fine['id']}/privacy", headers=ADMIN, params=params)).json()

    # a release of the fine dataset protects a one-year change only at the epsilon of a norm-100 change
    expected = epsilon_for_change(calibrate(0.1, 1e-6, 3), 100.0)  # the norm-100 change, at (0.1, 1e-6)
    backed = await report(0.1, 1e-6)
    assert backed["charge_factor"] == pytest.approx(100) and backed["charged_epsilon"] == pytest.approx(
        expected
    )
    assert expected > 10 and "charged epsilon" in backed["guarantee"]
    assert backed["features"][0]["reference_change"] == pytest.approx(1.0)  # one year, in its own units
    # at epsilon 1 the norm-100 change moves the mean by ~27 noise standard deviations: no epsilon is proven
    # for it, the report says so and a release is refused (422) with the reason and what to change
    unbacked = await report(1.0, 1e-5)
    assert unbacked["charged_epsilon"] is None and unbacked["fits_budget"] is False
    assert any("would be refused" in w for w in unbacked["warnings"])
    assert "no epsilon is proven" in unbacked["guarantee"]
    refused = await client.post(
        f"/v1/datasets/{fine['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5}
    )
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert "not covered by a proven epsilon" in detail and "age_years 100x" in detail
    assert "smaller epsilon" in detail
    # the coarse dataset's releases cost their epsilon; the fine one's are charged the norm-100 change
    assert (
        await client.post(
            f"/v1/datasets/{coarse['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-6}
        )
    ).status_code == 201
    small = await client.post(
        f"/v1/datasets/{fine['id']}/releases", headers=ADMIN, json={"epsilon": 0.1, "delta": 1e-6}
    )
    assert small.status_code == 201, small.text
    ledger = (await client.get(f"/v1/populations/{coarse['population_id']}/ledger", headers=ADMIN)).json()
    charged = ledger["entries"][-1]
    assert charged["nominal_epsilon"] == 0.1 and charged["epsilon"] == pytest.approx(expected)
    # 1 + 16.3 spent of 30: a second one does not fit, and the refusal says why it costs what it costs
    again = await client.post(
        f"/v1/datasets/{fine['id']}/releases", headers=ADMIN, json={"epsilon": 0.1, "delta": 1e-6}
    )
    assert again.status_code == 409 and "age_years 100x" in again.json()["detail"]
    assert charged["native"]["charge_factor"] == pytest.approx(100)


async def test_a_finer_scale_cannot_escape_its_charge_by_dropping_a_row(client: httpx.AsyncClient) -> None:
    """Review of issue 31: the same people minus one row (signatures no longer match) declared into the same
    population with age at 0.01 years: the known name maps it onto the relation, and it is charged."""
    X, _, names = _cohort(seed=39)
    ward = (
        await upload(client, make_csv(X, names=names), population="ward", scaling='{"age_years": 1}')
    ).json()
    fewer = await upload(
        client, make_csv(X[1:], names=names), population="ward", scaling='{"age_years": 0.01}'
    )
    assert fewer.status_code == 201, fewer.text
    body = fewer.json()
    assert body["population_id"] == ward["population_id"] and body["reference_factor"] == pytest.approx(
        100, rel=0.05
    )
    population = (await client.get(f"/v1/populations/{ward['population_id']}", headers=ADMIN)).json()
    assert [r["feature"] for r in population["reference"]] == ["age_years", "bp", "lab"]  # no second age


async def test_two_columns_holding_one_feature_are_charged_as_one_change(client: httpx.AsyncClient) -> None:
    """Review of issue 31: age in years is the relation; a later upload holds it in years and in months. A
    one-year change moves both columns, a norm of sqrt(1 + 1) in that upload's scaled units."""
    X, _, names = _cohort(seed=40)
    first = (await upload(client, make_csv(X, names=names), scaling='{"age_years": 1}')).json()
    both = np.column_stack([X, X[:, 0] * 12.0])
    again = await upload(
        client, make_csv(both, names=[*names, "age_months"]), scaling='{"age_years": 1, "age_months": 12}'
    )
    body = again.json()
    assert body["population_id"] == first["population_id"]
    assert body["reference_factor"] == pytest.approx(np.sqrt(2.0))
    report = (
        await client.get(
            f"/v1/datasets/{body['id']}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
        )
    ).json()
    assert report["charge_factor"] == pytest.approx(np.sqrt(2.0))
    assert report["charged_epsilon"] == pytest.approx(
        epsilon_for_change(calibrate(1.0, 1e-5, 4), np.sqrt(2.0))
    )


async def test_a_release_without_a_guarantee_turns_the_population_formal_guarantee_false(
    client: httpx.AsyncClient,
) -> None:
    X, y, names = _cohort(seed=34)
    ds = (await upload(client, make_csv(X, names=names))).json()
    ok = await client.post(
        f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-6}
    )
    assert ok.status_code == 201
    pop = (await client.get(f"/v1/populations/{ds['population_id']}", headers=ADMIN)).json()
    assert pop["formal_guarantee"] is True and pop["epsilon_pld"] is not None
    alg1 = await client.post(
        f"/v1/datasets/{ds['id']}/releases",
        headers=ADMIN,
        json={
            "epsilon": 1,
            "delta": 1e-6,
            "r": 2,
            "mechanism": "po-gp-ucb",
            "acknowledge_no_guarantee": True,
        },
    )
    assert alg1.status_code == 201
    for path in (f"/v1/populations/{ds['population_id']}", f"/v1/populations/{ds['population_id']}/ledger"):
        view = (await client.get(path, headers=ADMIN)).json()
        assert view["formal_guarantee"] is False and view["epsilon_pld"] is None, path
        assert view["epsilon_spent"] == 2.0  # the label is still charged
    listed = (await client.get("/v1/populations", headers=ADMIN)).json()["data"]
    assert [p["formal_guarantee"] for p in listed] == [False]
    report = (
        await client.get(
            f"/v1/datasets/{ds['id']}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-6}
        )
    ).json()
    assert report["formal_guarantee"] is False and report["population_formal_guarantee"] is False
    assert any("no formal guarantee" in w for w in report["warnings"])


async def test_delta_adds_up_below_one_over_n_and_the_default_budget_follows_n(
    client: httpx.AsyncClient,
) -> None:
    X = np.random.default_rng(35).normal(size=(2000, 2)) + 0.0123
    default = (await upload(client, make_csv(X))).json()
    assert default["delta_budget"] == pytest.approx(0.1 / 2000)  # min(1e-3, 0.1 / n)
    other = np.random.default_rng(36).normal(size=(2000, 2)) + 0.0321
    ds = (await upload(client, make_csv(other), delta_budget=1e-3)).json()
    body = {"epsilon": 1, "delta": 4.9e-4}
    first = await client.post(f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json=body)
    assert first.status_code == 201 and first.json()["formal_guarantee"] is True
    second = await client.post(f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json=body)
    assert second.status_code == 409, second.text
    assert (
        "delta adds up" in second.json()["detail"]
        and "to 0.00098, not below 1/n = 0.0005" in second.json()["detail"]
    )
    ledger = (await client.get(f"/v1/datasets/{ds['id']}/ledger", headers=ADMIN)).json()
    assert ledger["delta_spent"] == pytest.approx(4.9e-4) and len(ledger["entries"]) == 1
    # the override is recorded and costs the population its guarantee
    forced = await client.post(
        f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json=body | {"allow_large_delta": True}
    )
    assert forced.status_code == 201 and forced.json()["formal_guarantee"] is False
    assert (await client.get(f"/v1/datasets/{ds['id']}/ledger", headers=ADMIN)).json()[
        "formal_guarantee"
    ] is False


async def test_the_same_outcomes_with_other_features_cannot_give_a_person_a_second_fresh_answer(
    client: httpx.AsyncClient,
) -> None:
    """Issue 31, Why 3: person 0 got two fresh answers through two uploads of the same outcomes."""
    X, y, names = _cohort(seed=37)
    a = (await upload(client, make_csv(X, y, names=names), objective="outcome")).json()
    other = np.random.default_rng(3).normal(size=(len(y), 2))
    b = (await upload(client, make_csv(other, y), objective="outcome")).json()
    assert b["population_id"] == a["population_id"]
    releases = []
    for ds in (a, b):
        rel = await client.post(
            f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-6}
        )
        releases.append(rel.json()["id"])
    op = {"epsilon": 1.0, "B": 40.0, "R": 10.0, "fresh_repeats": True, "max_epsilon_per_row": 1.0000001}
    grant = await client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "lab", "release_ids": releases, "max_queries": 10, "output_privacy": op},
    )
    token = {"Authorization": f"Bearer {grant.json()['token']}"}
    first = await client.post(f"/v1/releases/{releases[0]}/queries", headers=token, json={"index": 0})
    assert first.status_code == 201
    second = await client.post(f"/v1/releases/{releases[1]}/queries", headers=token, json={"index": 0})
    assert second.status_code == 409 and "allotment" in second.json()["detail"]
    led = (await client.get(f"/v1/populations/{a['population_id']}/ledger", headers=ADMIN)).json()
    assert led["output"]["largest_person_total"] == pytest.approx(first.json()["charged_epsilon"])


async def test_rows_per_person_is_group_privacy_for_releases_and_answers(client: httpx.AsyncClient) -> None:
    X, y, names = _cohort(seed=38)
    ds = (await upload(client, make_csv(X, y, names=names), objective="outcome", rows_per_person=4)).json()
    assert ds["rows_per_person"] == 4
    report = (
        await client.get(
            f"/v1/datasets/{ds['id']}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-6}
        )
    ).json()
    assert report["charge_factor"] == pytest.approx(2.0)  # sqrt(4)
    rel = await client.post(
        f"/v1/datasets/{ds['id']}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-6}
    )
    assert rel.status_code == 201
    entry = (await client.get(f"/v1/datasets/{ds['id']}/ledger", headers=ADMIN)).json()["entries"][0]
    assert entry["nominal_epsilon"] == 1 and entry["epsilon"] == pytest.approx(report["charged_epsilon"])
    assert entry["epsilon"] > 2.0  # a change of norm 2 costs more than twice at this delta
    op = {"epsilon": 1.0, "B": 40.0, "R": 10.0}
    grant = await client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "lab", "release_ids": [rel.json()["id"]], "max_queries": 10, "output_privacy": op},
    )
    token = {"Authorization": f"Bearer {grant.json()['token']}"}
    answer = (
        await client.post(f"/v1/releases/{rel.json()['id']}/queries", headers=token, json={"index": 5})
    ).json()
    led = (await client.get(f"/v1/populations/{ds['population_id']}/ledger", headers=ADMIN)).json()["output"]
    assert led["largest_row_total"] == pytest.approx(answer["charged_epsilon"])
    assert led["largest_person_total"] == pytest.approx(4 * answer["charged_epsilon"])  # k rows of one person
