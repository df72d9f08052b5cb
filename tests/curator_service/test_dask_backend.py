"""The curator on Dask (setting ``backend = "dask"``): a release made on a local cluster (``dask_address``
unset) succeeds, is stored like any release, and is charged exactly like a local one; a gradient oracle's
step gives the local step's answer bit for bit (with both services' noise generators seeded).

SQLite only: the backend does not touch the database (the charge is made before and after the mechanism).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("distributed")

from curator_service.config import Settings  # noqa: E402
from curator_service.main import create_app  # noqa: E402
from shared.distributed import gradients as dask_gradients  # noqa: E402
from shared.distributed import release as dask_release  # noqa: E402
from shared.privacy.gaussian import calibrate  # noqa: E402
from shared.privacy.rng import seeded_rng  # noqa: E402
from tests.curator_service.conftest import ADMIN, ADMIN_TOKEN, bearer, make_csv, synthetic, upload  # noqa: E402

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

PARAMS = {"epsilon": 1.0, "delta": 1e-5, "r": 4}


@pytest.fixture
def settings(database_url: str, data_dir: Path) -> Settings:
    return Settings(
        database_url=database_url,
        data_dir=data_dir,
        admin_token=ADMIN_TOKEN,
        backend="dask",
        dask_local_workers=1,
    )


@pytest.fixture
def app(settings: Settings) -> Iterator[Any]:
    application = create_app(settings)
    yield application
    application.state.components.compute_backend.close()  # the lifespan's shutdown: the local cluster stops
    application.state.components.db.dispose()


async def _release(client: httpx.AsyncClient, rows: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    response = await upload(client, rows, name="cohort", objective="outcome", epsilon_budget=5)
    assert response.status_code == 201, response.text
    ds = response.json()["id"]
    response = await client.post(f"/v1/datasets/{ds}/releases", headers=ADMIN, json=PARAMS)
    assert response.status_code == 201, response.text
    ledger = (await client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()
    return response.json(), ledger


@pytest.mark.anyio
@SQLITE_ONLY
async def test_a_dask_release_is_stored_and_charged_like_a_local_one(
    client: httpx.AsyncClient, app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = dask_release.gaussian_release_dask

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dask_release, "gaussian_release_dask", counted)
    X, y = synthetic(n=300, d=6)
    rows = make_csv(X, y)
    backend = app.state.components.compute_backend
    assert backend.kind == "dask"

    release, ledger = await _release(client, rows)
    assert calls == [1]  # the mechanism ran on the cluster ...
    assert backend._client is not None and backend.client().scheduler.address.startswith("tls://")
    assert release["mechanism"] == "gaussian" and release["formal_guarantee"] is True
    assert (release["n"], release["r"]) == (300, 4)
    assert release["noise_std"] == calibrate(1.0, 1e-5, 6).sigma
    response = await client.get(  # ... and Z is stored like any release: n x r, centred
        f"/v1/releases/{release['id']}/rows", headers={**ADMIN, "Accept": "application/x-npy"}
    )
    assert response.status_code == 200
    Z = np.load(io.BytesIO(response.content), allow_pickle=False)
    assert hashlib.sha256(response.content).hexdigest() == release["sha256"]
    assert Z.shape == (300, 4) and np.allclose(Z.mean(axis=0), 0.0, atol=1e-9 * release["noise_std"])

    # the same dataset released by a local curator: the same charge, field by field
    local_settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'local.db'}",
        data_dir=tmp_path / "local",
        admin_token=ADMIN_TOKEN,
    )
    local_app = create_app(local_settings)
    try:
        assert local_app.state.components.compute_backend.kind == "local"
        transport = httpx.ASGITransport(app=local_app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://curator.test", timeout=60
        ) as other:
            local_release, local_ledger = await _release(other, rows)
    finally:
        local_app.state.components.db.dispose()
    assert calls == [1]
    keep = ("mechanism", "epsilon", "delta", "nominal_epsilon", "formal_guarantee", "native", "status")
    assert [{k: e[k] for k in keep} for e in ledger["entries"]] == [
        {k: e[k] for k in keep} for e in local_ledger["entries"]
    ]
    assert (ledger["epsilon_spent"], ledger["delta_spent"]) == (
        local_ledger["epsilon_spent"],
        local_ledger["delta_spent"],
    )
    for key in ("n", "r", "epsilon", "delta", "noise_std", "formal_guarantee"):
        assert release[key] == local_release[key]


async def _gradient(client: httpx.AsyncClient, rows: bytes) -> list[float]:
    response = await upload(client, rows, name="cohort", objective="label", epsilon_budget=20)
    assert response.status_code == 201, response.text
    body = {"loss": "logistic-regression", "dimension": 3, "bounds": [[-5.0, 5.0]] * 3, "clip": 1.0}
    body |= {"mu": 1.0, "steps": 4, "delta": 1e-5}
    response = await client.post(
        f"/v1/datasets/{response.json()['id']}/gradient-oracles", headers=ADMIN, json=body
    )
    assert response.status_code == 201, response.text
    oracle = response.json()["id"]
    partner = {"name": "tuner", "release_ids": [], "max_queries": 0, "gradient_oracle_ids": [oracle]}
    response = await client.post("/v1/partners", headers=ADMIN, json=partner)
    assert response.status_code == 201, response.text
    step = {
        "theta": [0.2, -0.1, 0.0],
        "points": [[0.1, 0.0, 0.0], [0.0, 0.1, 0.0], [0.0, 0.0, 0.1], [-0.1, -0.1, -0.1]],
        "kernel": {"kind": "se", "lengthscale": 1.0},
    }
    headers = bearer(response.json()["token"])
    response = await client.post(f"/v1/gradient-oracles/{oracle}/steps", headers=headers, json=step)
    assert response.status_code == 201, response.text
    gradient: list[float] = response.json()["gradient"]
    return gradient


@pytest.mark.anyio
@SQLITE_ONLY
async def test_a_dask_gradient_step_is_the_local_step_bit_for_bit(
    client: httpx.AsyncClient, app: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shared.bo.gibo import private_gradient

    for module in (private_gradient, dask_gradients):  # the same noise in both services (tests only)
        monkeypatch.setattr(module, "os_entropy_rng", lambda: seeded_rng(2024))
    calls: list[int] = []
    real = dask_gradients.oracle_gradient_dask

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dask_gradients, "oracle_gradient_dask", counted)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(5_000, 3))
    y = (X @ np.array([1.5, -1.0, 0.5]) + 0.3 * rng.normal(size=5_000) > 0).astype(float)
    rows = make_csv(X, y, objective="label")
    on_dask = await _gradient(client, rows)
    assert calls == [1]
    local_settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'local.db'}",
        data_dir=tmp_path / "local",
        admin_token=ADMIN_TOKEN,
    )
    local_app = create_app(local_settings)
    try:
        transport = httpx.ASGITransport(app=local_app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://curator.test") as other:
            local = await _gradient(other, rows)
    finally:
        local_app.state.components.db.dispose()
    assert calls == [1] and len(local) == 3
    assert on_dask == local  # floats through JSON: the same bits


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"dask_address": "scheduler:8786"}, "must start with tls:// or tcp://"),
        ({"dask_address": "tls://scheduler:8786"}, "needs POBO_CURATOR_DASK_TLS_CA"),
        ({"dask_tls_ca": "ca.pem"}, "go together"),
        (
            {
                "dask_address": "tcp://scheduler:8786",
                "dask_tls_ca": "a",
                "dask_tls_cert": "b",
                "dask_tls_key": "c",
            },
            "use tls://",
        ),
        ({"backend": "spark"}, "backend"),
    ],
)
def test_the_dask_settings_are_checked(env: dict[str, str], message: str, tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        Settings(data_dir=tmp_path, admin_token=ADMIN_TOKEN, **env)
