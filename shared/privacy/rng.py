"""Production randomness: a fresh cryptographically secure generator per use, keyed from OS entropy.

Every noise draw of a privacy mechanism (the release's noise and projection, the gradient oracle's and the
federation's noise, the federation's Poisson sample) comes from ``os_entropy_rng()``: numpy's ``Generator``
over AES-128 in counter mode (``randomgen.AESCounter``, hardware AES where the CPU has it), with a 128-bit
key taken from ``secrets`` (the OS's CSPRNG) and set directly, not through a seed-mixing step. A counter-mode
block cipher is a standard cryptographic generator (NIST SP 800-90A's CTR_DRBG is built the same way): its
output cannot be predicted, and its key cannot be recovered, from any amount of earlier output. PCG64,
numpy's default, is fast but not cryptographic; state-recovery attacks on it are published, and our threat
model includes partners who know some rows exactly (and so see the noise added to them).

A generator created before a server forks would repeat its stream in every worker, and a user-chosen seed
would let whoever chose it undo the noise; so every release and every noise draw calls ``os_entropy_rng()``
at the moment it needs randomness. ``derived_rng(rng)`` keys a second, independent AES-CTR stream from 128
bits of ``rng``; ``derived_key(rng)`` draws such a key without building the generator, and ``keyed_rng(key)``
builds it later, elsewhere (the Gaussian release gives every row block a noise stream and a dither stream of
their own this way, so that a block's noise is the same whichever process, or Dask worker, draws it). No
API accepts a seed for production noise. ``seeded_rng(seed)`` builds the same generator from a fixed key,
for tests, benchmarks and the privacy audit (which must be reproducible and should exercise the production
generator).
"""

from __future__ import annotations

import secrets

import numpy as np
from randomgen import AESCounter

__all__ = ["derived_key", "derived_rng", "keyed_rng", "os_entropy_rng", "seeded_rng"]

_KEY_BITS = 128


def os_entropy_rng() -> np.random.Generator:
    """A fresh AES-128-CTR generator keyed from ``secrets``: cryptographic, fork-safe, never user-chosen."""
    return np.random.Generator(AESCounter(key=secrets.randbits(_KEY_BITS)))


def seeded_rng(seed: int) -> np.random.Generator:
    """The production generator with a fixed key (tests, benchmarks, audits; never production noise)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= int(seed) < 2**_KEY_BITS:
        raise ValueError(f"seed must be an integer in [0, 2^{_KEY_BITS}), got {seed!r}")
    return np.random.Generator(AESCounter(key=int(seed)))


def derived_key(rng: np.random.Generator) -> int:
    """128 bits drawn from ``rng`` (two 64-bit words, high first): the key of a derived AES-CTR stream."""
    hi, lo = (int(w) for w in rng.integers(0, 2**64, size=2, dtype=np.uint64))
    return (hi << 64) | lo


def keyed_rng(key: int) -> np.random.Generator:
    """The AES-128-CTR generator keyed by ``key`` (from ``derived_key``: never a user-chosen value)."""
    return np.random.Generator(AESCounter(key=int(key)))


def derived_rng(rng: np.random.Generator) -> np.random.Generator:
    """A second AES-128-CTR generator keyed by 128 bits drawn from ``rng``: as unpredictable as ``rng``, and
    independent of the rest of its stream (the key is never output)."""
    return keyed_rng(derived_key(rng))
