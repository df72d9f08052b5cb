"""DP-GIBO's gradient oracle on Dask (``shared.distributed.gradients``) is the local oracle, bit for bit.

One local cluster of 2 worker processes for the module, closed at the end. Each built-in loss and a plug-in,
with noise (the same seeded generator) and without (mu = inf: the clean clipped average), give the local
``oracle_gradient``'s answer exactly: the rows' clipped gradients are summed as integers on a public lattice,
so the blocks (and their order) cannot change the sum.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")

from shared.bo.gibo.kernels import SEKernel  # noqa: E402
from shared.bo.gibo.oracle import builtin_loss_matrix, oracle_gradient, plugin_loss_matrix  # noqa: E402
from shared.distributed.gradients import (  # noqa: E402
    builtin_loss_factory,
    oracle_gradient_dask,
    plugin_loss_factory,
)
from shared.privacy.rng import seeded_rng  # noqa: E402

N, D = 30_000, 5


@pytest.fixture
def client(dask_client: Any) -> Any:
    """The session's local cluster (tests/conftest.py)."""
    return dask_client


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    X = rng.normal(scale=0.8, size=(N, D))
    X[123, 2] = np.nan  # a row whose loss fails: 0 in both
    y = (X @ np.linspace(-1, 1, D) + rng.normal(size=N) > 0).astype(np.float64)
    return X, y


def squared_plugin(theta_batch: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A plug-in loss: fn(theta_batch [b, p], rows [m, w]) -> [m, b] (the outcome is the last column)."""
    features, outcome = rows[:, :-1], rows[:, -1]
    return (features @ theta_batch.T - outcome[:, None]) ** 2


def step_inputs(p: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-0.5, 0.5, p)
    design = np.vstack([theta, np.clip(theta + 0.3 * rng.uniform(-1, 1, size=(11, p)), -1, 1)])
    return {
        "theta": theta,
        "design": design,
        "bounds": np.array([[-1.0, 1.0]] * p),
        "kernel": SEKernel(lengthscale=0.7, signal_variance=1.0),
        "clip": 1.5,
        "steps": 4,
    }


@pytest.mark.parametrize("mu", [1.0, math.inf])
@pytest.mark.parametrize("loss", ["gaussian-location", "huber-regression", "logistic-regression", "plugin"])
def test_the_dask_oracle_is_the_local_oracle_bit_for_bit(
    client: Any, data: tuple[np.ndarray, np.ndarray], loss: str, mu: float
) -> None:
    X, y = data
    if loss == "plugin":
        rows = np.hstack([X, y[:, None]])
        local_matrix, factory, yy, width, p = (
            plugin_loss_matrix(squared_plugin, rows),
            plugin_loss_factory(squared_plugin),
            y,
            D + 1,
            D,
        )
    else:
        intercept = loss != "gaussian-location"
        yy = None if loss == "gaussian-location" else y
        local_matrix = builtin_loss_matrix(loss, X, yy, intercept=intercept)
        factory = builtin_loss_factory(loss, intercept=intercept)
        width = p = D + 1 if intercept else D
    common = step_inputs(p, seed=len(loss)) | {"n": N, "row_width": width, "mu": mu}
    local = oracle_gradient(local_matrix, rng=seeded_rng(41), **common)
    remote = oracle_gradient_dask(factory, X, yy, rng=seeded_rng(41), client=client, **common)
    assert local.shape == (p,) and np.isfinite(local).all()
    assert np.array_equal(local, remote)
    if math.isfinite(mu):  # the noise is the generator's: another key, another answer
        other = oracle_gradient_dask(factory, X, yy, rng=seeded_rng(42), client=client, **common)
        assert not np.array_equal(other, local)
