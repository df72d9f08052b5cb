"""Production randomness: a fresh generator per use, seeded from OS entropy.

A generator created before a server forks would repeat its stream in every worker, and a user-chosen seed
would let whoever chose it undo the noise; so every release and every noise draw calls ``os_entropy_rng()``
at the moment it needs randomness. Seeds exist for tests and benchmarks only.
"""

from __future__ import annotations

import secrets

import numpy as np

__all__ = ["os_entropy_rng"]


def os_entropy_rng() -> np.random.Generator:
    """A fresh generator seeded from OS entropy (``secrets``): safe after fork, never user-chosen."""
    return np.random.default_rng(secrets.randbits(128))
