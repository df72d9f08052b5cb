"""The lattice mechanism's integer noise written out by hand, for tests that check a mechanism bit for bit."""

from __future__ import annotations

import numpy as np


def dithered_noise(rng: np.random.Generator, shape: int | tuple[int, ...], steps: float) -> np.ndarray:
    """rint(N steps + V): N standard normal, then the dither V uniform on (-w/2, w/2) with w = 2^-4 steps,
    both drawn from ``rng`` in that order (``shared.privacy.lattice.lattice_noise``, independently)."""
    N = rng.standard_normal(shape)
    U = rng.random(shape)
    width = 2.0**-4 * steps
    return np.rint(N * steps - 0.5 * width + U * width)
