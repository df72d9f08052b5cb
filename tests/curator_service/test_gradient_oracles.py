"""Private gradient oracles (DP-GIBO) on the curator: creation and its ledger charge, refusals, grants, steps
(bounds checked before any row is read, the step counter under concurrency, Idempotency-Key replays, T + 1
refused), answers that are the gradient and nothing else, and plug-in losses."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from curator_service.config import Settings
from curator_service.main import create_app
from shared.privacy.gdp import gdp_epsilon, gdp_epsilon_pld
from shared.privacy.lattice import sampler_margins
from tests.curator_service.conftest import ADMIN, ADMIN_TOKEN, bearer, make_csv, upload

pytestmark = pytest.mark.anyio

D = 3
BOUNDS = [[-5.0, 5.0]] * D
SE = {"kind": "se", "lengthscale": 1.0}


def _labelled(n: int = 200, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)) + rng.uniform(0.001, 0.002, size=(n, D))
    y = (X @ np.array([1.5, -1.0, 0.5]) + 0.3 * rng.normal(size=n) > 0).astype(float)
    return X, y


async def _dataset(client: httpx.AsyncClient, X: np.ndarray, y: np.ndarray | None, **form: Any) -> dict:
    fields = {"name": "cohort", "objective": "label" if y is not None else None, "epsilon_budget": 20} | form
    response = await upload(client, make_csv(X, y, objective="label"), **fields)
    assert response.status_code == 201, response.text
    return response.json()


def _oracle_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "loss": "logistic-regression",
        "dimension": D,
        "bounds": BOUNDS,
        "clip": 1.0,
        "mu": 1.0,
        "steps": 4,
        "delta": 1e-5,
    }
    return body | over


async def _oracle(client: httpx.AsyncClient, dataset_id: int, **over: Any) -> httpx.Response:
    return await client.post(
        f"/v1/datasets/{dataset_id}/gradient-oracles", headers=ADMIN, json=_oracle_body(**over)
    )


async def _partner(client: httpx.AsyncClient, oracle_ids: list[int]) -> dict[str, str]:
    response = await client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "tuner", "release_ids": [], "max_queries": 0, "gradient_oracle_ids": oracle_ids},
    )
    assert response.status_code == 201, response.text
    assert response.json()["gradient_oracle_ids"] == oracle_ids
    return bearer(response.json()["token"])


def _step_body(theta: list[float] | None = None, points: list[list[float]] | None = None) -> dict[str, Any]:
    theta = [0.0] * D if theta is None else theta
    if points is None:
        points = [[0.1 * (j == k) for k in range(D)] for j in range(D)] + [[-0.1] * D]
    return {"theta": theta, "points": points, "kernel": SE}


async def _step(
    client: httpx.AsyncClient, oracle_id: int, headers: dict[str, str], body: dict[str, Any], key: str | None
) -> httpx.Response:
    extra = {"Idempotency-Key": key} if key else {}
    return await client.post(f"/v1/gradient-oracles/{oracle_id}/steps", headers=headers | extra, json=body)


async def test_creation_charges_the_whole_gdp_cost_to_the_ledger(client: httpx.AsyncClient) -> None:
    X, y = _labelled()
    dataset = await _dataset(client, X, y)
    response = await _oracle(client, dataset["id"], mu=1.0, steps=30, delta=1e-5)
    assert response.status_code == 201, response.text
    oracle = response.json()
    assert oracle["steps_used"] == 0 and oracle["steps_left"] == 30 and oracle["mu_spent"] == 0.0
    # closed form (Dong, Roth & Su) and dp-accounting's PLD under add-or-remove agree; REPLACE_ONE would
    # have charged about 10.0 instead of 4.38. The sampler's margins (30 draws of 3 entries) are folded in:
    # the ideal mechanism's epsilon at delta less the margin, plus the epsilon margin
    margins = sampler_margins(3, math.sqrt(30) / 1.0, 1e-5, 30)
    ideal = gdp_epsilon(1.0, margins.ideal_delta(1e-5)) + margins.epsilon
    assert oracle["epsilon"] == pytest.approx(ideal, rel=1e-12)
    assert gdp_epsilon(1.0, 1e-5) < oracle["epsilon"] < gdp_epsilon(1.0, 1e-5) * (1 + 1e-4)
    assert oracle["epsilon"] == pytest.approx(gdp_epsilon_pld(1.0, 30, 1e-5), rel=1e-3)
    assert oracle["epsilon"] == pytest.approx(4.377, abs=2e-3)
    assert oracle["noise_std"] == pytest.approx(2 * 1.0 * math.sqrt(30) / (200 * 1.0))
    ledger = (await client.get(f"/v1/datasets/{dataset['id']}/ledger", headers=ADMIN)).json()
    entries = [e for e in ledger["entries"] if e["gradient_oracle_id"] == oracle["id"]]
    assert len(entries) == 1
    assert entries[0]["mechanism"] == "dp-gibo" and entries[0]["status"] == "spent"
    assert entries[0]["epsilon"] == oracle["epsilon"] and entries[0]["native"]["mu"] == 1.0
    assert ledger["epsilon_spent"] == pytest.approx(oracle["epsilon"])
    # a second oracle that does not fit the 20-epsilon budget: 409 and nothing written
    response = await _oracle(client, dataset["id"], mu=10.0, steps=100)
    assert response.status_code == 409, response.text
    assert "budget" in response.json()["detail"]
    listed = (await client.get("/v1/gradient-oracles", headers=ADMIN)).json()
    assert listed["count"] == 1
    after = (await client.get(f"/v1/datasets/{dataset['id']}/ledger", headers=ADMIN)).json()
    assert len(after["entries"]) == len(ledger["entries"])


async def test_what_would_break_the_guarantee_is_refused_at_creation(client: httpx.AsyncClient) -> None:
    X, y = _labelled()
    dataset = await _dataset(client, X, y)
    # the same people in other units: they join the first upload's population (issue 31)
    scaled = await _dataset(client, X * 1.01, y, scaling="max_norm:1")
    manual = await _dataset(client, X * 1.02, None)
    assert scaled["population_id"] == manual["population_id"] == dataset["population_id"]
    cases = [
        (scaled["id"], {}, "max_norm"),
        (dataset["id"], {"dimension": D + 1}, "dimension"),
        (dataset["id"], {"dimension": D + 1, "intercept": True, "bounds": BOUNDS + [[-1.0, 1.0]]}, None),
        (dataset["id"], {"delta": 0.01}, "1/n"),
        (dataset["id"], {"loss": "no-such-loss"}, "unknown loss"),
        (dataset["id"], {"bounds": BOUNDS[:2]}, "bounds"),
        (dataset["id"], {"bounds": [[1.0, -1.0]] * D}, "lo < hi"),
        (dataset["id"], {"delta_huber": 1.0}, "huber"),
        (dataset["id"], {"mu": 0.0}, "mu"),
        (dataset["id"], {"steps": 0}, "steps"),
        (dataset["id"], {"clip": float("nan")}, None),
        (
            dataset["id"],
            {
                "loss": "gaussian-location",
                "intercept": True,
                "dimension": D + 1,
                "bounds": BOUNDS + [[-1.0, 1.0]],
            },
            "intercept",
        ),
        (manual["id"], {"loss": "huber-regression"}, "outcome column"),
    ]
    for dataset_id, over, needle in cases:
        body = json.loads(json.dumps(_oracle_body(**over), allow_nan=True).replace("NaN", '"nan"'))
        response = await client.post(f"/v1/datasets/{dataset_id}/gradient-oracles", headers=ADMIN, json=body)
        if needle is None and "intercept" in over:
            assert response.status_code == 201, response.text  # d + 1 with an intercept is right
            continue
        assert response.status_code == 422, (over, response.text)
        if needle:
            assert needle in json.dumps(response.json()), (needle, response.text)
    # logistic-regression over a column that is not 0/1
    cont = await _dataset(client, X * 1.03, X[:, 0])  # the same people again: their population
    response = await _oracle(client, cont["id"])
    assert response.status_code == 422 and "0/1" in response.text
    assert (await client.get("/v1/gradient-oracles", headers=ADMIN)).json()["count"] == 1


async def test_steps_answer_only_the_gradient_within_bounds_and_stop_at_T(client: httpx.AsyncClient) -> None:
    X, y = _labelled()
    dataset = await _dataset(client, X, y)
    oracle = (await _oracle(client, dataset["id"], steps=3)).json()
    other = (await _oracle(client, dataset["id"], steps=3, mu=0.5)).json()
    partner = await _partner(client, [oracle["id"]])
    # not granted: the same 404 as an id that does not exist
    assert (await client.get(f"/v1/gradient-oracles/{other['id']}", headers=partner)).status_code == 404
    assert (await _step(client, other["id"], partner, _step_body(), None)).status_code == 404
    assert (await client.get("/v1/gradient-oracles/999", headers=partner)).status_code == 404
    me = (await client.get("/v1/partners/me", headers=partner)).json()
    assert me["gradient_oracle_ids"] == [oracle["id"]]
    # the admin cannot step; inputs outside the public bounds are refused before any row is read
    assert (await _step(client, oracle["id"], ADMIN, _step_body(), None)).status_code == 403
    for body in (
        _step_body(theta=[6.0, 0.0, 0.0]),
        _step_body(points=[[0.0, 0.0, -5.5]]),
        _step_body(theta=[0.0, 0.0]),
        _step_body(points=[[0.0, 0.0]]),
        _step_body(points=[]),  # the first step needs a design
        {**_step_body(), "kernel": {"kind": "se", "degree": 2}},
        {**_step_body(), "kernel": {"kind": "se", "lengthscale": -1.0}},
        {**_step_body(), "seed": 3},
    ):
        response = await _step(client, oracle["id"], partner, body, None)
        assert response.status_code == 422, (body, response.text)
    assert (await client.get(f"/v1/gradient-oracles/{oracle['id']}", headers=partner)).json()[
        "steps_used"
    ] == 0
    answers = []
    for t in range(3):
        response = await _step(client, oracle["id"], partner, _step_body(points=[[0.05 * t] * D]), f"k{t}")
        assert response.status_code == 201, response.text
        body = response.json()
        assert set(body) == {"step", "gradient", "steps_left"}
        assert body["step"] == t + 1 and body["steps_left"] == 2 - t and len(body["gradient"]) == D
        assert all(math.isfinite(v) for v in body["gradient"])
        answers.append(body)
    response = await _step(client, oracle["id"], partner, _step_body(points=[[0.2] * D]), "k3")
    assert response.status_code == 409 and "all of its 3 steps" in response.text
    # a replay returns the stored answer; the same key with another body is a 409
    replay = await _step(client, oracle["id"], partner, _step_body(points=[[0.05] * D]), "k1")
    assert replay.status_code == 201 and replay.json() == answers[1]
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert (
        await _step(client, oracle["id"], partner, _step_body(points=[[0.3] * D]), "k1")
    ).status_code == 409
    shown = (await client.get(f"/v1/gradient-oracles/{oracle['id']}", headers=partner)).json()
    assert shown["steps_used"] == 3 and shown["mu_spent"] == pytest.approx(1.0)
    steps = (await client.get(f"/v1/gradient-oracles/{oracle['id']}/steps", headers=partner)).json()
    assert [s["step"] for s in steps["data"]] == [1, 2, 3]
    assert [s["gradient"] for s in steps["data"]] == [a["gradient"] for a in answers]
    # nothing row-level anywhere a partner can read
    for text in (json.dumps(steps), json.dumps(shown), json.dumps(answers)):
        for value in (X[0, 0], X[17, 2], X[-1, 1]):
            assert repr(float(value)) not in text


async def test_an_oracle_serves_one_partner(client: httpx.AsyncClient) -> None:
    """Issue 31: an oracle's steps, design and answers are shared by whoever steps it, so a second grantee
    would read the first one's queries in them: an oracle is granted to one partner only."""
    X, y = _labelled()
    dataset = await _dataset(client, X, y)
    oracle = (await _oracle(client, dataset["id"], steps=3)).json()
    first = await client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "a", "release_ids": [], "max_queries": 0, "gradient_oracle_ids": [oracle["id"]]},
    )
    assert first.status_code == 201
    second = await client.post(
        "/v1/partners",
        headers=ADMIN,
        json={"name": "b", "release_ids": [], "max_queries": 0, "gradient_oracle_ids": [oracle["id"]]},
    )
    assert second.status_code == 409 and "already granted to partner" in second.json()["detail"]
    assert (await client.get("/v1/partners", headers=ADMIN)).json()["count"] == 1  # nothing written
    other = await client.post(
        "/v1/partners", headers=ADMIN, json={"name": "b", "release_ids": [], "max_queries": 0}
    )
    grant = await client.post(
        f"/v1/partners/{other.json()['id']}/grants",
        headers=ADMIN,
        json={"gradient_oracle_ids": [oracle["id"]]},
    )
    assert grant.status_code == 409
    again = await client.post(
        f"/v1/partners/{first.json()['id']}/grants",
        headers=ADMIN,
        json={"gradient_oracle_ids": [oracle["id"]]},
    )
    assert again.status_code == 200  # granting it again to its own partner changes nothing


async def test_the_step_counter_is_exact_under_concurrency(client: httpx.AsyncClient) -> None:
    X, y = _labelled()
    dataset = await _dataset(client, X, y)
    oracle = (await _oracle(client, dataset["id"], steps=4)).json()
    partner = await _partner(client, [oracle["id"]])
    first = await _step(client, oracle["id"], partner, _step_body(), "first")
    assert first.status_code == 201
    responses = await asyncio.gather(
        *[
            _step(client, oracle["id"], partner, _step_body(points=[[0.01 * j] * D]), f"c{j}")
            for j in range(6)
        ]
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [201, 201, 201, 409, 409, 409]
    assert sorted(r.json()["step"] for r in responses if r.status_code == 201) == [2, 3, 4]


async def test_gradient_is_the_average_per_row_gradient_when_noise_is_tiny(client: httpx.AsyncClient) -> None:
    """gaussian-location with a degree-2 polynomial kernel and 10 design points in d = 3 (the quadratic's
    feature space has 10 dimensions, so the GP's mean gradient is exact): theta - x_i per row, clipped."""
    rng = np.random.default_rng(11)
    X = rng.normal(loc=1.0, size=(3000, D))
    dataset = await _dataset(client, X, None, population="location", epsilon_budget=1e5)
    # mu = 100 in one step is refused: the neighbour's mean would lie 100 sigma away, where no sampler of
    # floats is accurate (the claim could not be backed); mu = 4 is the least noise one step can have here
    refused = await _oracle(client, dataset["id"], loss="gaussian-location", clip=3.0, mu=100.0, steps=1)
    assert refused.status_code == 422 and "choose a larger delta" in refused.json()["detail"].lower()
    assert (await client.get("/v1/gradient-oracles", headers=ADMIN)).json()["count"] == 0
    response = await _oracle(client, dataset["id"], loss="gaussian-location", clip=3.0, mu=4.0, steps=1)
    assert response.status_code == 201, response.text
    oracle = response.json()
    partner = await _partner(client, [oracle["id"]])
    theta = np.array([0.5, 0.0, -0.5])
    points = (theta + 0.3 * rng.uniform(-1, 1, size=(10, D))).tolist()
    body = {"theta": theta.tolist(), "points": points, "kernel": {"kind": "polynomial", "degree": 2}}
    response = await _step(client, oracle["id"], partner, body, None)
    assert response.status_code == 201, response.text
    G = theta[None, :] - X
    norms = np.linalg.norm(G, axis=1, keepdims=True)
    expected = (G * np.minimum(1.0, 3.0 / norms)).mean(axis=0)
    noise_std = oracle["noise_std"]
    assert noise_std == pytest.approx(2 * 3.0 / (3000 * 4.0))
    np.testing.assert_allclose(response.json()["gradient"], expected, atol=1e-5 + 6 * noise_std)


async def test_extreme_rows_never_make_an_error(client: httpx.AsyncClient) -> None:
    """A row whose loss overflows to inf counts as a zero gradient: the answer stays finite and a 201."""
    X, y = _labelled(n=150)
    X[7] = [1e300, -1e300, 1e300]
    dataset = await _dataset(client, X, y)
    for loss in ("logistic-regression", "gaussian-location"):
        oracle = (await _oracle(client, dataset["id"], loss=loss, mu=2.0, steps=1)).json()
        partner = await _partner(client, [oracle["id"]])
        response = await _step(client, oracle["id"], partner, _step_body(theta=[5.0, -5.0, 5.0]), None)
        assert response.status_code == 201, response.text
        assert all(math.isfinite(v) for v in response.json()["gradient"])


@pytest.fixture
async def plugin_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    plugins = {
        "sq-distance": "tests.curator_service.gradient_plugins:squared_distance",
        "centred": "tests.curator_service.gradient_plugins:centred_distance",
        "fragile": "tests.curator_service.gradient_plugins:fragile",
        "missing": "tests.curator_service.gradient_plugins:nothing_here",
    }
    app = create_app(settings.model_copy(update={"gradient_losses": plugins}))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://curator.test", timeout=60) as c:
        yield c
    app.state.components.db.dispose()


async def test_plug_in_losses_must_be_row_independent(plugin_client: httpx.AsyncClient) -> None:
    client = plugin_client
    X, y = _labelled(n=60)  # at most 64 rows: the registration check reads every one of them
    X[3, 0] = 500.0  # the fragile plug-in raises on this row
    dataset = await _dataset(client, X, y)
    ok = await _oracle(client, dataset["id"], loss="sq-distance")
    assert ok.status_code == 201, ok.text
    refused = await _oracle(client, dataset["id"], loss="centred")
    assert refused.status_code == 422 and "not row-independent" in refused.text
    fragile = await _oracle(client, dataset["id"], loss="fragile")
    assert fragile.status_code == 422 and "500" not in fragile.json()["detail"]
    missing = await _oracle(client, dataset["id"], loss="missing")
    assert missing.status_code == 422 and "cannot be imported" in missing.text
    partner = await _partner(client, [ok.json()["id"]])
    response = await _step(client, ok.json()["id"], partner, _step_body(), None)
    assert response.status_code == 201 and len(response.json()["gradient"]) == D


def test_plugin_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="built-in"):
        Settings(admin_token=ADMIN_TOKEN, gradient_losses={"gaussian-location": "a.b:c"})
    with pytest.raises(ValueError, match="package.module:function"):
        Settings(admin_token=ADMIN_TOKEN, gradient_losses={"mine": "not a path"})
