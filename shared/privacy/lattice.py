"""Exact Gaussian noise: every mechanism whose noise lands on a data-dependent value adds it here.

Adding floating-point noise to a floating-point value, ``fl(v + z)``, leaks through the low-order bits of the
result: which outputs can occur depends on v's binary exponent, so an output can be impossible under one
dataset and possible under its neighbour (Mironov, CCS 2012; Jin et al., IEEE S&P 2022). pobo therefore never
adds noise to a clean value in floating point. It snaps the value to a lattice g Z^D whose step does not
depend on the data, adds integer noise, and multiplies back by g (a power of two: exact).

Notation (shapes in brackets)::

    v     [D]   the clean value (a release's rows, a clipped average gradient, a federation aggregate)
    s           L2 sensitivity of v under the mechanism's neighbouring relation (public)
    z           noise multiplier: the Gaussian mechanism with sensitivity s and std z s is (1/z)-GDP
    g = 2^k     lattice step; k is a function of (s, z, D, a public bound on |v|) only, never of the data
    A     [D]   rint(v / g): exact integers (dividing by a power of two is exact in float64)
    s'          s + g sqrt(D): the sensitivity of g A (snapping moves each entry by <= g / 2, each dataset)
    sigma       z s': the noise standard deviation
    E     [D]   rint(N / g), N ~ N(0, sigma^2 I): integer noise
    out   [D]   g (A + E)

Why the guarantee holds. ``g A`` is a deterministic function of the data whose value on neighbouring datasets
differs by at most s' in L2. ``out = g rint((g A + N) / g)`` is a rounding (post-processing) of the Gaussian
mechanism ``g A + N`` with std z s', which is (1/z)-GDP for that sensitivity (Dong, Roth & Su 2022, Thm 2.7).
So the mechanism keeps the claim of its noise multiplier z exactly; the lattice costs s' / s - 1 <= 2^-20 of
extra noise (``RELAXATION``). ``A + E`` is int64 arithmetic; the float64 multiplication of an integer by a
power of two is exact below 2^53 and a data-independent rounding of the integer above it.

The noise N is drawn as ``rng.standard_normal`` scaled to lattice steps, at a resolution far finer than the
lattice (sigma / g <= 2^45, so one lattice step spans thousands of representable values of N / g); production
passes ``shared.privacy.rng.os_entropy_rng()`` (AES-CTR keyed from the OS). The sampler is tested against
OpenDP's exact discrete Gaussian (``tests/shared/test_gaussian.py``).

Any new mechanism follows the same rule: compute its clean value and sensitivity, call
``lattice_gaussian(s, z, D, value_bound=...)`` once, and release ``add_lattice_noise(mechanism, v, rng)``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError

__all__ = [
    "MAX_LATTICE_VALUE",
    "MAX_SIGMA_STEPS",
    "RELAXATION",
    "LatticeGaussian",
    "add_lattice_noise",
    "lattice_gaussian",
    "lattice_noise",
    "snap",
]

#: Largest extra sensitivity the lattice may add, relative to s (g sqrt(D) <= RELAXATION s): about 1e-6.
RELAXATION = 2.0**-20
#: Largest noise scale in lattice steps (sigma / g): float64 then resolves N / g to ~2^-6 of a step.
MAX_SIGMA_STEPS = 2.0**45
#: |v| / g must stay below this so that A + E fits int64 with room for the noise.
MAX_LATTICE_VALUE = 2.0**61


@dataclass(frozen=True)
class LatticeGaussian:
    """The public parameters of one exact Gaussian mechanism (functions of s, z, D and a value bound)."""

    sensitivity: float  # s, of the clean value
    noise_multiplier: float  # z
    dim: int  # D
    granularity_exponent: int  # k
    granularity: float  # g = 2^k
    lattice_sensitivity: float  # s' = s + g sqrt(D)
    sigma: float  # z s'

    @property
    def steps(self) -> float:
        """sigma / g: the noise standard deviation in lattice steps."""
        return self.sigma / self.granularity

    @property
    def max_abs_value(self) -> float:
        """Largest |v| the lattice represents (an int64 with room for the noise)."""
        return MAX_LATTICE_VALUE * self.granularity

    @property
    def mu(self) -> float:
        """The mechanism is (1/z)-GDP for a change of the clean value of norm <= s."""
        return 1.0 / self.noise_multiplier


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise InputDataError(f"{name} must be a finite number > 0, got {value!r}")
    return value


@functools.lru_cache(maxsize=512)
def _lattice(s: float, z: float, dim: int, value_bound: float | None) -> LatticeGaussian:
    k = max(
        math.floor(math.log2(RELAXATION * s / math.sqrt(dim))),
        math.ceil(math.log2(2.0 * z * s / MAX_SIGMA_STEPS)),  # (2 s bounds s': sigma / g <= 2^45)
    )
    if value_bound is not None:  # a public bound on |v|: every clean value then fits the lattice
        k = max(k, math.ceil(math.log2(value_bound / MAX_LATTICE_VALUE)) + 1)
    g = math.ldexp(1.0, k)
    s_lattice = s + g * math.sqrt(dim)
    return LatticeGaussian(
        sensitivity=s,
        noise_multiplier=z,
        dim=dim,
        granularity_exponent=k,
        granularity=g,
        lattice_sensitivity=s_lattice,
        sigma=z * s_lattice,
    )


def lattice_gaussian(
    sensitivity: float, noise_multiplier: float, dim: int, *, value_bound: float | None = None
) -> LatticeGaussian:
    """The exact Gaussian mechanism for a value of ``dim`` entries with L2 ``sensitivity`` (cached).

    ``value_bound``: a public bound on every entry's |v| (e.g. a clipping bound); the lattice is then coarse
    enough for any clean value, so ``add_lattice_noise`` can never refuse one.
    """
    s = _positive("sensitivity", sensitivity)
    z = _positive("noise_multiplier", noise_multiplier)
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or int(dim) < 1:
        raise InputDataError(f"dim must be an integer >= 1, got {dim!r}")
    bound = None if value_bound is None else _positive("value_bound", value_bound)
    return _lattice(s, z, int(dim), bound)


def lattice_noise(shape: tuple[int, ...], steps: float, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """E = rint(N / g) with N / g ~ N(0, steps^2): integer Gaussian noise in lattice steps."""
    out = rng.standard_normal(shape)
    out *= steps
    np.rint(out, out=out)
    return out.astype(np.int64)


def snap(
    values: npt.NDArray[np.float64], mechanism: LatticeGaussian, *, checked: bool = False
) -> npt.NDArray[np.int64]:
    """A = rint(v / g), exact; refuses a non-finite value or one the lattice cannot hold (never its value).

    ``checked``: the caller has verified that every |v| is finite and below ``mechanism.max_abs_value``.
    """
    v = np.asarray(values, dtype=np.float64)
    if checked:
        return np.rint(v / mechanism.granularity).astype(np.int64)
    with np.errstate(invalid="ignore"):
        peak = float(np.abs(v).max()) if v.size else 0.0
    if not math.isfinite(peak):
        raise InputDataError("the value to privatise is not finite")
    if peak >= mechanism.max_abs_value:
        raise InputDataError(
            f"a value to privatise reaches |v| >= {mechanism.max_abs_value:.3g}, beyond what the noise "
            "lattice represents: rescale the data"
        )
    return np.rint(v / mechanism.granularity).astype(np.int64)  # exact: g is a power of two


def add_lattice_noise(
    mechanism: LatticeGaussian, values: npt.ArrayLike, rng: np.random.Generator, *, checked: bool = False
) -> npt.NDArray[np.float64]:
    """g (rint(v / g) + E): the clean value plus exact Gaussian noise of std ``mechanism.sigma``.

    ``values`` may have any shape (a row block of a release, a vector); every entry gets independent noise.
    ``checked``: as for ``snap``.
    """
    A = snap(np.asarray(values, dtype=np.float64), mechanism, checked=checked)
    A += lattice_noise(A.shape, mechanism.steps, rng)
    out = A.astype(np.float64)
    out *= mechanism.granularity
    return out
