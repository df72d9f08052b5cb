"""The reconstruction attack of docs/privacy.md, against both releases.

An adversary who knows d + 1 rows x_0..x_d (and sees their released rows) solves z_i - z_0 = (x_i - x_0) B
for the d x r matrix B, recovers the column means from z_0 = (x_0 - mu) B, and inverts every other row.
Against the paper's Algorithm 1 (with r >= d) that recovers every row to rounding error, at any epsilon;
against the Gaussian release the same attack (and the better one that knows B = I) stays at the noise level.
"""

from __future__ import annotations

import numpy as np
import pytest

from shared.privacy.gaussian import gaussian_release
from shared.privacy.po_gp_ucb import release_projection


def attack(X: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """Every row, reconstructed from the release Z and the first d + 1 rows of X."""
    d = X.shape[1]
    D = X[1 : d + 1] - X[0]  # [d, d]
    B = np.linalg.solve(D, Z[1 : d + 1] - Z[0])  # [d, r]
    return (Z - Z[0]) @ np.linalg.pinv(B) + X[0]


@pytest.fixture
def X() -> np.ndarray:
    return np.random.default_rng(0).normal(loc=[60, 120, 200], scale=[15, 17, 40], size=(200, 3)) / 0.5


@pytest.mark.parametrize("lift", ["auto", "always"])
@pytest.mark.parametrize("epsilon", [0.1, 1.0])
def test_algorithm_1_gives_every_row_away(X: np.ndarray, lift: str, epsilon: float) -> None:
    Z = release_projection(X, epsilon=epsilon, delta=1e-5, r=5, lift=lift, rng=np.random.default_rng(1)).Z  # type: ignore[arg-type]
    error = np.abs(attack(X, Z) - X).max()
    assert error < 1e-8 * np.abs(X).max()


def test_the_gaussian_release_resists_it(X: np.ndarray) -> None:
    rel = gaussian_release(X, epsilon=1.0, delta=1e-5, rng=np.random.default_rng(1))
    sigma = rel.calibration.sigma
    unknown = slice(X.shape[1] + 1, None)
    rms = np.sqrt(np.mean((attack(X, rel.Z) - X)[unknown] ** 2))
    assert rms > 0.5 * sigma  # at the noise level, not 1e-14
    # the adversary's best linear guess (B = I known): z_j - z_0 + x_0 misses row j by noise_j - noise_0, so
    # across rows the error spreads like the noise itself (std sigma), around the one offset noise_0
    best = rel.Z - rel.Z[0] + X[0]
    spread = (best - X)[unknown].std(axis=0)
    np.testing.assert_allclose(spread, sigma, rtol=0.15)
