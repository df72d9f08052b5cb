"""Issue 5, item 5: production randomness comes from OS entropy, fresh per draw and per forked worker;
M ~ N(0, 1) entry-wise; no curator API accepts a seed."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from scipy import stats

from curator_service.config import Settings as CuratorSettings
from curator_service.main import create_app as create_curator
from shared.privacy.po_gp_ucb import release_projection
from shared.privacy.rng import os_entropy_rng


def _production_M(d: int = 6, r: int = 5) -> np.ndarray:
    """M as a production release draws it: ``release_projection`` with no rng (OS entropy).

    With X = I (centred and full rank, all singular values 1) and lift="always", Z = U sqrt(1 + w^2) V^T M
    / sqrt(r) with U V^T orthogonal, so Z^T Z = (1 + w^2) M^T M / r identifies M^T M; comparing two
    draws' Z is enough to tell whether M differed.
    """
    X = np.vstack([np.eye(d), -np.eye(d)])  # centred, rank d
    return release_projection(X, epsilon=1.0, delta=1e-5, r=r, lift="always").Z


def test_each_release_draws_a_fresh_projection() -> None:
    a, b = _production_M(), _production_M()
    assert not np.allclose(a, b)
    g1, g2 = os_entropy_rng(), os_entropy_rng()
    assert g1.standard_normal(8).tolist() != g2.standard_normal(8).tolist()


def test_forked_workers_draw_different_projections_and_noise() -> None:
    """A generator made before a fork would repeat its stream in every worker; ours are made per draw."""
    _production_M()  # import and use before forking, as a server's parent process would
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: draw through the production paths, send, exit without running pytest's atexit
        try:
            payload = pickle.dumps((_production_M(), os_entropy_rng().standard_normal(4)))
            os.write(write_fd, payload)
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    child_Z, child_noise = pickle.loads(b"".join(chunks))  # noqa: S301 - our own child process
    parent_Z, parent_noise = _production_M(), os_entropy_rng().standard_normal(4)
    assert not np.allclose(child_Z, parent_Z)
    assert not np.allclose(child_noise, parent_noise)


def test_projection_entries_are_standard_normal() -> None:
    """M is drawn as ``rng.standard_normal((d, r))`` inside release_projection; recover M exactly with
    X whose centred SVD is known and test it against N(0, 1) (fixed test seed, so deterministic)."""
    d, r = 40, 50
    X = np.vstack([np.eye(d), -np.eye(d)]) * np.sqrt(0.5)  # centred; X^T X = I, singular values 1
    rel = release_projection(X, epsilon=1.0, delta=1e-5, r=r, lift="always", rng=np.random.default_rng(12345))
    w = rel.omega
    # Z = X V diag(sqrt(1 + w^2)) V^T M / sqrt(r) = X sqrt(1 + w^2) M / sqrt(r) (all s = 1); X^T X = I
    M = X.T @ rel.Z * np.sqrt(r) / np.sqrt(1.0 + w**2)
    reference = np.random.default_rng(12345).standard_normal((d, r))
    np.testing.assert_allclose(M, reference, rtol=1e-8, atol=1e-8)
    result = stats.kstest(M.ravel(), "norm")
    assert result.pvalue > 1e-3, result
    # the test has power: a scaled normal fails it
    assert stats.kstest(1.2 * M.ravel(), "norm").pvalue < 1e-3


def _names(schema: object) -> set[str]:
    """Every property and parameter name anywhere in an OpenAPI document."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                found |= set(value)
            if key == "parameters" and isinstance(value, list):
                found |= {p.get("name", "") for p in value if isinstance(p, dict)}
            found |= _names(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= _names(item)
    return found


@pytest.fixture
def curator_app(tmp_path):  # type: ignore[no-untyped-def]
    app = create_curator(CuratorSettings(data_dir=tmp_path / "c", admin_token="a" * 40))
    yield app
    app.state.components.db.dispose()


def test_no_curator_api_accepts_a_seed(curator_app) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    names = _names(curator_app.openapi())
    assert not {n for n in names if "seed" in n.lower()}, names
    with TestClient(curator_app) as client:
        r = client.post(
            "/v1/datasets/1/releases",
            headers={"Authorization": "Bearer " + "a" * 40},
            json={"epsilon": 1.0, "delta": 1e-5, "r": 2, "seed": 1},
        )
    assert r.status_code == 422
    assert "seed" in r.text
