"""Release mechanisms over HTTP: the Gaussian default, the paper's Algorithm 1 behind an acknowledgement,
the parameters a privacy officer would refuse, the ledger's native parameters, and the reconstruction
attack of docs/privacy.md run as a partner would."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from shared.privacy.gaussian import calibrate
from tests.curator_service.conftest import ADMIN, World, bearer, make_csv, upload

pytestmark = pytest.mark.anyio

ALG1 = {"mechanism": "po-gp-ucb", "acknowledge_no_guarantee": True}


async def _partner_rows(client: httpx.AsyncClient, release_id: int) -> np.ndarray:
    p = await client.post(
        "/v1/partners", headers=ADMIN, json={"name": "p", "release_ids": [release_id], "max_queries": 1}
    )
    rows = await client.get(
        f"/v1/releases/{release_id}/rows",
        headers={**bearer(p.json()["token"]), "Accept": "application/x-npy"},
    )
    assert rows.status_code == 200
    return np.load(io.BytesIO(rows.content))


async def test_algorithm_1_is_served_only_acknowledged_and_says_so(world: World) -> None:
    ds = world.dataset["id"]
    refused = await world.client.post(
        f"/v1/datasets/{ds}/releases",
        headers=ADMIN,
        json={"epsilon": 1, "delta": 1e-5, "r": 3, "mechanism": "po-gp-ucb"},
    )
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("invalid request: body: mechanism 'po-gp-ucb'")
    ledger = (await world.client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()
    assert len(ledger["entries"]) == 1  # nothing charged for the refusal
    ok = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 3, **ALG1}
    )
    assert ok.status_code == 201, ok.text
    rel = ok.json()
    assert (rel["mechanism"], rel["formal_guarantee"], rel["acknowledged_no_guarantee"]) == (
        "po-gp-ucb",
        False,
        True,
    )
    assert (
        rel["lift"] == "auto"
        and rel["lifted"] is not None
        and rel["sigma_min"] > 0
        and rel["noise_std"] is None
    )
    partner = await world.client.post(
        "/v1/partners", headers=ADMIN, json={"name": "q", "release_ids": [rel["id"]], "max_queries": 1}
    )
    seen = (
        await world.client.get(f"/v1/releases/{rel['id']}", headers=bearer(partner.json()["token"]))
    ).json()
    assert seen["formal_guarantee"] is False and "sigma_min" not in seen and "lifted" not in seen
    entries = (await world.client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()["entries"]
    assert [(e["mechanism"], e["native"] is None) for e in entries] == [
        ("gaussian", False),
        ("po-gp-ucb", True),
    ]


async def test_delta_at_or_above_one_over_n_needs_an_explicit_override(client: httpx.AsyncClient) -> None:
    X = np.random.default_rng(3).normal(size=(50, 3)) + 0.123  # n = 50: 1/n = 0.02
    ds = (await upload(client, make_csv(X), delta_budget=0.5)).json()["id"]
    body = {"epsilon": 1.0, "delta": 0.02}
    refused = await client.post(f"/v1/datasets/{ds}/releases", headers=ADMIN, json=body)
    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        f"delta = 0.02 is not below 1/n = 0.02 (dataset {ds} has n = 50 rows): a mechanism that publishes "
        "one random row in the clear meets such a delta. Choose delta < 1/n (e.g. 1/n^2), or send "
        '"allow_large_delta": true to release anyway (recorded).'
    )
    assert (await client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()["entries"] == []
    ok = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json=body | {"allow_large_delta": True}
    )
    assert ok.status_code == 201
    assert ok.json()["allow_large_delta"] is True and ok.json()["formal_guarantee"] is False
    # the population has lost its guarantee everywhere it is shown (issue 31)
    view = (await client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()
    assert view["formal_guarantee"] is False and view["epsilon_pld"] is None and view["smallest_n"] == 50
    assert view["entries"][0]["formal_guarantee"] is False
    # deltas add up: with 0.02 spent, another 0.0199 takes the population's total past 1/n
    more = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1.0, "delta": 0.0199}
    )
    assert more.status_code == 409 and "delta adds up" in more.json()["detail"], more.text
    assert "not below 1/n = 0.02 (n = 50" in more.json()["detail"]
    # just below 1/n on a population of its own: a release with a guarantee
    other = np.random.default_rng(5).normal(size=(50, 3)) + 0.321
    fresh = (await upload(client, make_csv(other), delta_budget=0.5)).json()["id"]
    fine = await client.post(
        f"/v1/datasets/{fresh}/releases", headers=ADMIN, json={"epsilon": 1.0, "delta": 0.0199}
    )
    assert fine.status_code == 201 and fine.json()["formal_guarantee"] is True


async def test_a_gaussian_projection_must_reduce_the_dimension(world: World) -> None:
    ds = world.dataset["id"]
    r = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 6}
    )
    assert r.status_code == 422
    assert r.json()["detail"] == (
        "r = 6 is not below d = 6: a Gaussian release projects only to fewer dimensions than the dataset's 6 "
        "features; omit r to release all 6 noisy features"
    )
    full = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5}
    )
    assert full.status_code == 201 and full.json()["r"] == 6


async def test_ledger_keeps_native_parameters_and_a_tighter_composition(world: World) -> None:
    ds = world.dataset["id"]
    second = await world.client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 2, "delta": 1e-5}
    )
    assert second.status_code == 201
    ledger = (await world.client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()
    first, two = ledger["entries"]
    cal = calibrate(1.0, 1e-5, 6)
    assert first["native"] == {
        "kind": "gaussian",
        "noise_multiplier": pytest.approx(cal.noise_multiplier, rel=1e-12),
        "sensitivity": pytest.approx(cal.sensitivity, rel=1e-12),
        "sigma": pytest.approx(world.release["noise_std"], rel=1e-12),
        "charge_factor": 1.0,
        # the sampler's margins of the claim, folded into epsilon_pld
        "epsilon_margin": pytest.approx(cal.sampler.epsilon, rel=1e-12),
        "delta_margin": pytest.approx(cal.sampler.delta, rel=1e-12),
    }
    assert two["native"]["noise_multiplier"] == pytest.approx(calibrate(2.0, 1e-5, 6).noise_multiplier)
    assert ledger["epsilon_spent"] == 3.0 and ledger["delta_spent"] == pytest.approx(2e-5)
    assert 2.0 < ledger["epsilon_pld"] < 3.0  # composed at delta 2e-5: tighter than the sum


async def test_reconstruction_attack_fails_against_the_default_release_over_http(
    client: httpx.AsyncClient,
) -> None:
    """The partner knows d + 1 rows and the release; Algorithm 1 gives every other row away, the
    Gaussian release leaves the adversary at the noise level."""
    X = np.random.default_rng(4).normal(loc=[60, 120, 200], scale=[15, 17, 40], size=(300, 3)) + 0.01
    ds = (await upload(client, make_csv(X), epsilon_budget=20)).json()["id"]
    d = X.shape[1]

    def attack(Z: np.ndarray) -> np.ndarray:
        B = np.linalg.solve(X[1 : d + 1] - X[0], Z[1 : d + 1] - Z[0])
        return (Z - Z[0]) @ np.linalg.pinv(B) + X[0]

    alg1 = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5, "r": 5, **ALG1}
    )
    Z1 = await _partner_rows(client, alg1.json()["id"])
    assert np.abs(attack(Z1) - X).max() < 1e-8 * np.abs(X).max()  # every row, exactly

    default = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 1, "delta": 1e-5}
    )
    assert default.json()["mechanism"] == "gaussian"
    Z = await _partner_rows(client, default.json()["id"])
    error = np.sqrt(np.mean((attack(Z) - X)[d + 1 :] ** 2))
    assert error > 0.5 * default.json()["noise_std"]


async def test_privacy_report_states_the_guarantee_in_the_curators_units(client: httpx.AsyncClient) -> None:
    X = np.random.default_rng(6).normal(loc=[60, 120], scale=[15, 17], size=(400, 2)) + 0.01
    up = await upload(client, make_csv(X, names=["age", "bp"]), scaling='{"age": 0.4}', noise_std=0.5)
    ds = up.json()["id"]
    report = (
        await client.get(f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1.0, "delta": 1e-5})
    ).json()
    assert report["mechanism"] == "gaussian" and report["formal_guarantee"] is True
    assert report["noise_std"] == pytest.approx(calibrate(1.0, 1e-5, 2).sigma)
    assert report["features"] == [
        {"feature": "age", "scale": 0.4, "covered_change": 0.4, "reference_change": 0.4},
        {"feature": "bp", "scale": 1.0, "covered_change": 1.0, "reference_change": 1.0},
    ]
    assert report["charge_factor"] == 1.0 and report["charged_epsilon"] == 1.0
    assert "age alone by up to 0.4, bp alone by up to 1" in report["guarantee"]
    changes = report["larger_changes"]
    assert changes[0] == {"change": 1.0, "epsilon": pytest.approx(1.0, rel=1e-6)}
    assert [c["epsilon"] for c in changes] == sorted(c["epsilon"] for c in changes)
    assert (
        "outcomes as they are measured" in report["outcomes"]
        and "not a privacy mechanism" in report["outcomes"]
    )
    assert "n = 400 rows and d = 2 features (n > d + 1)" in report["po_gp_ucb"]
    assert report["large_delta"] is False and report["warnings"] == []
    big = (
        await client.get(f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1.0, "delta": 0.01})
    ).json()
    assert big["large_delta"] is True and big["formal_guarantee"] is False
    assert big["warnings"][0].startswith("delta = 0.01 is not below 1/n = 0.0025")
