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
    N     [D]   N(0, sigma^2 I)
    V     [D]   a dither, uniform on (-w/2, w/2), w = 2^-4 sigma (``DITHER_WIDTH``), independent of N
    E     [D]   rint((N + V) / g): integer noise
    out   [D]   g (A + E)

Why the guarantee holds (for an ideal sampler). ``g A`` is a deterministic function of the data whose value on
neighbouring datasets differs by at most s' in L2. ``out = g rint((g A + N + V) / g)`` is a function of the
Gaussian mechanism's output ``g A + N`` and of V, which does not depend on the data (post-processing), and
``g A + N`` with std z s' is (1/z)-GDP for that sensitivity (Dong, Roth & Su 2022, Thm 2.7). So the mechanism
keeps the claim of its noise multiplier z; the lattice costs s' / s - 1 = g sqrt(D) / s of extra noise, at
most 2^-20 unless sigma / g would exceed 2^45 (then g grows with z: ``lattice_gaussian``), and the dither adds
w^2 / 12 = 2^-8 / 12 of the noise variance. ``A + E`` is exact integer arithmetic (float64 while every value
is below 2^52 lattice steps, int64 above); the float64 multiplication of an integer by a power of two is exact
below 2^53 and a data-independent rounding of the integer above it. The float rounding inside
``(N + V) / g`` is a function of the noise only, at most 2^-44 of w.

The sampler, honestly. N is numpy's ``standard_normal`` (a ziggurat) on ``os_entropy_rng()`` (AES-CTR keyed
from the OS), and it takes finitely many values: 2^52 per layer in the body, and in the tail beyond
r = 3.654 the values r + (53 ln 2 - ln j) / r for integers j >= 1 (Marsaglia's tail), ever sparser, none
beyond 12.23 sigma. Far out they are further apart than a cell, so without the dither a cell there could be
empty under one dataset and reachable under its neighbour. With it, each cell's probability is the sampler's
mass under a trapezoid kernel of width w + g, a Riemann sum of the ideal probability: wherever the window
holds K = 2^b of the sampler's values (within ``dense_until(b)`` sigma of the mean: 8.75 sigma for K = 2^24,
5.7 for 2^40; ~2^46 everywhere in the body) it is within a factor e^(+-4 / K) of the ideal one. Call an
output good when, for every entry that can differ between the neighbours, the noise lies within
dense_until(b) - w sigma of both datasets' means. On good outputs both implemented distributions are within
e^(+-a) of the ideal ones (a = 4 entries / K), so for any set S ``P'(S) <= e^a P(S & good) + P'(bad) <=
e^(eps + 2a) Q'(S) + e^a delta + P'(bad)``: the implemented mechanism is (eps + 2a, e^a delta + P'(bad))-DP
when the ideal one is (eps, delta)-DP. ``sampler_margins`` bounds P'(bad) from the Gaussian's tails (a
factor 2 for numpy's tail, whose mass is the same kind of Riemann sum; the neighbour's mean lies up to
sigma / z away), adds the margins over adaptive draws (composition, a union bound), and picks K from the
claim's delta: typically the epsilon margin is ~1e-9 and the delta margin ~1e-3 of delta. Every mechanism
folds them into what it prints: the release calibrates for the ideal (epsilon - margin, delta less margin),
the gradient oracle and the federation add the margin to the epsilon they report at the delta they report,
and all refuse a claim the margins would take half of (a tiny delta at a large epsilon: the neighbour's mean
then lies many sigma away). ``tests/shared/test_lattice.py`` feeds numpy's sampler chosen bits to check the
tail values this relies on, so a change of numpy's algorithm fails the tests instead of the claim; the noise
is also compared with OpenDP's exact discrete Gaussian (``tests/shared/test_gaussian.py``).

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
    "DITHER_WIDTH",
    "MAX_LATTICE_VALUE",
    "MAX_SIGMA_STEPS",
    "RELAXATION",
    "ExactSum",
    "LatticeGaussian",
    "SamplerMargins",
    "add_lattice_noise",
    "check_sampler_margins",
    "dense_until",
    "exact_sum",
    "lattice_gaussian",
    "lattice_noise",
    "sampler_margins",
    "snap",
    "sum_slack",
    "sum_step",
]

#: Largest extra sensitivity the lattice may add, relative to s (g sqrt(D) <= RELAXATION s): about 1e-6.
RELAXATION = 2.0**-20
#: Largest noise scale in lattice steps (sigma / g): float64 then resolves N / g to ~2^-6 of a step.
MAX_SIGMA_STEPS = 2.0**45
#: |v| / g must stay below this so that A + E fits int64 with room for the noise.
MAX_LATTICE_VALUE = 2.0**61
#: Width of the dither V, in units of sigma (it adds w^2 / 12 = 2^-8 / 12 of sigma^2 to the noise variance).
DITHER_WIDTH = 2.0**-4
#: numpy's ziggurat: the start of its tail (``ziggurat_nor_r``) and the bits of its uniforms.
ZIGGURAT_R = 3.6541528853610088
ZIGGURAT_BITS = 53
#: The implemented mass beyond t sigma of the mean is at most this factor times the ideal one (numpy's tail
#: values are Marsaglia's r - ln(U) / r, accepted with probability exp(-x^2 / 2) discretised to 2^-53; both
#: are Riemann sums with more than 10^7 terms there: a factor 2 is slack).
TAIL_SLACK = 2.0
#: The analysis may take any K = 2^b sampler values per dither window (module docstring); these b are tried.
WINDOW_BITS = tuple(range(20, 45))


def dense_until(window_bits: int) -> float:
    """How far from the mean (in sigma) every dither window holds >= 2^``window_bits`` of the sampler's
    values: in the tail the values r + (53 ln 2 - ln j) / r lie j r apart per unit, so a window of width w
    holds j r w of them, and j = 2^53 exp(-(x - r) r) at x (the body, within r, holds 2^46 per window)."""
    r = ZIGGURAT_R
    j = math.ldexp(1.0, window_bits) / (r * DITHER_WIDTH)
    return r + (ZIGGURAT_BITS * math.log(2.0) - math.log(j)) / r


def _tail(t: float) -> float:
    """P(|N(0, 1)| > t) (1 for t <= 0)."""
    return 1.0 if t <= 0 else math.erfc(t / math.sqrt(2.0))


@dataclass(frozen=True)
class SamplerMargins:
    """How far the implemented mechanism (numpy's sampler) can be from the ideal Gaussian one: if the ideal
    mechanism is (epsilon_0, delta_0)-DP, the implemented one is (epsilon_0 + ``epsilon``,
    e^(``epsilon`` / 2) delta_0 + ``delta``)-DP (module docstring)."""

    epsilon: float
    delta: float
    window_bits: int  # the K = 2^b of the analysis (within dense_until(b) sigma of the mean)

    def ideal_delta(self, delta: float) -> float:
        """delta_0: what the ideal mechanism must meet for the implemented one to meet ``delta``."""
        return (delta - self.delta) * math.exp(-0.5 * self.epsilon)


def _margins(entries: int, shift: float, draws: int, bits: int) -> SamplerMargins:
    t = dense_until(bits) - DITHER_WIDTH  # the noise within t keeps the cell's window within dense_until
    spread = math.inf
    m = 1
    while True:
        spread = min(spread, min(m, entries) * _tail(t - shift) + entries * _tail(t - shift / math.sqrt(m)))
        if m >= entries:
            break
        m *= 2
    per_draw = TAIL_SLACK * (entries * _tail(t) + spread)
    return SamplerMargins(
        epsilon=entries * draws * math.ldexp(8.0, -bits),  # 2 datasets x e^(+-4 / K) per entry
        delta=min(1.0, draws * per_draw),
        window_bits=bits,
    )


def sampler_margins(
    entries: int, noise_multiplier: float, delta: float, draws: int = 1, *, window_bits: int | None = None
) -> SamplerMargins:
    """The margins of ``draws`` (adaptive) draws, each of a value whose ``entries`` entries may differ between
    neighbours, moving it by L2 <= sigma / ``noise_multiplier`` (the noise multiplier for the change
    considered: z / c for a change of c sensitivities), for a claim at ``delta``.

    For K = 2^b values per window: epsilon = entries x draws x 8 / K; delta = the probability that some
    entry's noise lands where the sampler is not proven dense around either dataset's mean: beyond
    t = dense_until(b) - w from its own mean (2 Phi(-t)), or beyond t from the neighbour's mean, Delta_j sigma
    away (<= 2 Phi(-(t - Delta_j))), where sum_j Delta_j^2 <= 1 / z^2: fewer than m entries move by more than
    1 / (z sqrt m), for any m, so sum_j 2 Phi(-(t - Delta_j)) <= m 2 Phi(-(t - 1/z)) + entries
    2 Phi(-(t - 1/(z sqrt m))) (least over m = 2^i); times TAIL_SLACK, summed over the draws (a union bound).
    The bound holds for every b at once, so b is chosen (a public function of the arguments): the largest
    with delta margin <= delta / 1024, else the largest with delta margin < delta / 2, else the smallest.
    ``window_bits``: this b instead.
    """
    e = max(1, int(entries))
    rounds = max(1, int(draws))
    shift = 1.0 / _positive("noise_multiplier", noise_multiplier)
    if window_bits is not None:
        return _margins(e, shift, rounds, int(window_bits))
    options = [_margins(e, shift, rounds, b) for b in WINDOW_BITS]
    for room in (delta / 1024.0, delta / 2.0):
        fitting = [m for m in options if m.delta <= room]
        if fitting:
            return fitting[-1]
    return options[0]


def check_sampler_margins(
    epsilon: float, delta: float, entries: int, noise_multiplier: float, draws: int = 1
) -> SamplerMargins:
    """The margins, after refusing (InputDataError) a claim they would take half of or more."""
    margins = sampler_margins(entries, noise_multiplier, delta, draws)
    what = f"{draws} draws of {entries} entries" if draws > 1 else f"{entries} entries"
    if margins.delta >= 0.5 * delta:
        raise InputDataError(
            f"delta = {delta:g} is too small for pobo's Gaussian sampler to back at this noise (noise "
            f"multiplier {noise_multiplier:.3g} over {what}): the sampler can differ from the ideal Gaussian "
            f"mechanism with probability up to {margins.delta:.2g}. Choose a larger delta, or a smaller "
            "epsilon (more noise)"
        )
    if margins.epsilon >= 0.5 * epsilon:
        raise InputDataError(
            f"epsilon = {epsilon:g} is too small for pobo's Gaussian sampler to back over {what}: its "
            f"privacy loss can differ from the ideal mechanism's by {margins.epsilon:.2g}; choose epsilon >= "
            f"{2 * margins.epsilon:.2g}"
        )
    return margins


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
        """The mechanism is (1/z)-GDP for a change of the clean value of norm <= s (ideal sampler)."""
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
    if z * s_lattice * DITHER_WIDTH < g:  # the sampler's margins assume a cell no wider than the dither
        raise InputDataError(
            f"the noise (std {z * s_lattice:.3g}) is too small for the lattice its values need (step "
            f"{g:.3g}): add noise (a larger noise multiplier) or rescale the values"
        )
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


def lattice_noise(
    shape: tuple[int, ...],
    steps: float,
    rng: np.random.Generator,
    *,
    dither_rng: np.random.Generator | None = None,
) -> npt.NDArray[np.float64]:
    """E = rint((N + V) / g) with N / g ~ N(0, steps^2) from ``rng`` and the dither V / g uniform on
    (-w/2, w/2), w = DITHER_WIDTH steps, from ``dither_rng`` (default ``rng``; a stream of its own lets a
    caller draw the noise in blocks of any size with the same result): integer Gaussian noise in lattice
    steps, as float64 (integers, exact below 2^53: |E| < 13 steps <= 2^49)."""
    out = rng.standard_normal(shape)
    width = DITHER_WIDTH * steps
    out *= steps
    out -= 0.5 * width
    dither = (rng if dither_rng is None else dither_rng).random(shape)
    dither *= width
    out += dither
    np.rint(out, out=out)
    return out


def _check_values(v: npt.NDArray[np.float64], mechanism: LatticeGaussian) -> float:
    """The largest |v|, after refusing a non-finite value or one the lattice cannot hold (never its value)."""
    with np.errstate(invalid="ignore"):
        peak = float(np.abs(v).max()) if v.size else 0.0
    if not math.isfinite(peak):
        raise InputDataError("the value to privatise is not finite")
    if peak >= mechanism.max_abs_value:
        raise InputDataError(
            f"a value to privatise reaches |v| >= {mechanism.max_abs_value:.3g}, beyond what the noise "
            "lattice represents: rescale the data"
        )
    return peak


def snap(
    values: npt.NDArray[np.float64], mechanism: LatticeGaussian, *, checked: bool = False
) -> npt.NDArray[np.int64]:
    """A = rint(v / g), exact; refuses a non-finite value or one the lattice cannot hold (never its value).

    ``checked``: the caller has verified that every |v| is finite and below ``mechanism.max_abs_value``.
    """
    v = np.asarray(values, dtype=np.float64)
    if not checked:
        _check_values(v, mechanism)
    return np.rint(v / mechanism.granularity).astype(np.int64)  # exact: g is a power of two


def add_lattice_noise(
    mechanism: LatticeGaussian,
    values: npt.ArrayLike,
    rng: np.random.Generator,
    *,
    checked: bool = False,
    dither_rng: np.random.Generator | None = None,
) -> npt.NDArray[np.float64]:
    """g (rint(v / g) + E): the clean value plus exact Gaussian noise of std ``mechanism.sigma``.

    ``values`` may have any shape (a row block of a release, a vector); every entry gets independent noise.
    ``checked``: as for ``snap``. ``dither_rng``: as for ``lattice_noise``. While every |v| / g is below 2^51
    the integers are added in float64 (exact there, and two passes fewer); beyond, in int64.
    """
    v = np.asarray(values, dtype=np.float64)
    g = mechanism.granularity
    if checked:
        with np.errstate(invalid="ignore"):
            peak = float(np.abs(v).max()) if v.size else 0.0
    else:
        peak = _check_values(v, mechanism)
    E = lattice_noise(v.shape, mechanism.steps, rng, dither_rng=dither_rng)
    if peak / g < 2.0**51:  # A + E < 2^52: float64 integers, exact
        out = v / g
        np.rint(out, out=out)
        out += E
    else:
        total = np.rint(v / g).astype(np.int64)
        total += E.astype(np.int64)
        out = total.astype(np.float64)
    out *= g
    return out


# ------------------------------------------------------------------------------------ exact sums of rows


@dataclass(frozen=True)
class ExactSum:
    """A sum (or mean) of rows computed exactly, and the lattice its rows were snapped to."""

    value: npt.NDArray[np.float64]  # sum_i snap(row_i) as float64 (divided by n for a mean)
    step: float  # h: every row was snapped to h Z^D before the integer sum


def sum_step(n: int, bound: float) -> float:
    """h = 2^(floor(log2 bound) - bits), with bits (<= 40) leaving the int64 sum of n rows room."""
    bits = min(40, 61 - math.ceil(math.log2(n + 1)) - 1)
    return math.ldexp(1.0, math.floor(math.log2(bound)) - bits)


def sum_slack(n: int, bound: float, dim: int, *, mean: bool) -> float:
    """What ``exact_sum`` adds to a sensitivity argument, from public quantities only: one row's replacement
    changes the computed sum by its own change plus at most h sqrt(D) (snapping), and each side's final
    conversion by at most 2^-52 of |sum| per entry (|sum| <= n bound; a mean: bound, and the snapping / n)."""
    b = _positive("bound", bound)
    h = sum_step(n, b)
    root = math.sqrt(dim)
    if mean:
        return h * root / n + 2.0**-50 * b * root
    return h * root + 2.0**-50 * n * b * root


def exact_sum(rows: npt.ArrayLike, bound: float, *, mean: bool = False) -> ExactSum:
    """sum_i rows[i] over the first axis (or the mean), exactly: every row snapped to a public lattice h Z^D
    and summed as int64, with no rounding that depends on the other rows; then converted (and divided by n
    for a mean) in float64.

    Why. A float sum's rounding depends on every summand, so on neighbouring datasets the computed sums can
    differ by more than the summand that changed (at n = 2^20 a mean of clipped gradients moved by 1.0000153
    times its sensitivity, beyond what the noise lattice's rounding covers). Here the change is the changed
    row's snapped change, and ``sum_slack`` bounds the rest. ``bound``: a public bound on every entry's
    |value| (a clip).
    """
    x = np.asarray(rows, dtype=np.float64)
    b = _positive("bound", bound)
    n = int(x.shape[0])
    h = sum_step(n, b)
    total = np.rint(x / h).astype(np.int64).sum(axis=0)  # exact: n |entries| / h < 2^62
    value = total.astype(np.float64) * h
    if mean:
        value = value / float(n)
    return ExactSum(value=np.asarray(value, dtype=np.float64), step=h)
