"""The Gaussian release: pobo's default, (epsilon, delta)-differentially private release of the rows.

The guarantee is the textbook one: the Gaussian mechanism (Dwork & Roth 2014, Thm. A.1) with the exact
"analytic" calibration of Balle & Wang (ICML 2018, Thm. 8), followed by post-processing. The neighbouring
relation is the PO-GP-UCB paper's own (Kharkovskii, Dai & Low, ICML 2020, Definition 1): two datasets differ
in one row, and that row moves by Euclidean norm <= 1 in the released (scaled) units.

Notation (shapes in brackets)::

    X     [n, d]  the curator's scaled rows (may be a numpy.memmap; read in row blocks)
    g             lattice step 2^k; k depends on (epsilon, delta, d) only, never on the data
    A     [n, d]  round(X / g), exact integers (dividing by a power of two is exact in float64)
    Delta         1 + g sqrt(d): L2 sensitivity of g A (one row moves by <= 1, plus rounding <= g per entry)
    z             sigma_1(epsilon, delta): the analytic Gaussian noise at sensitivity 1 (Balle & Wang, Thm 8)
    sigma         z Delta: the noise standard deviation (public: ``noise_std``)
    E     [n, d]  round(N / g) with N ~ N(0, sigma^2) i.i.d.: integer noise
    Y     [n, d]  g (A + E): the Gaussian mechanism's output, on the lattice g Z
    Yc    [n, d]  Y - 1 mean(Y)^T: centred columns (post-processing)
    M     [d, r]  i.i.d. N(0, 1), only when r < d (post-processing: a Johnson-Lindenstrauss projection)
    Z     [n, r]  Yc M / sqrt(r), or Yc (r = d) when no projection is asked for

Why it is (epsilon, delta)-DP. g A is a deterministic function of X whose value on neighbouring datasets
differs only in the moved row, by at most ||v|| + g sqrt(d) <= Delta. Since g A lies on the lattice g Z,
``Y = g round((g A + N) / g) = g (A + round(N / g))`` is a rounding (post-processing) of the Gaussian
mechanism ``g A + N``, which is (epsilon, delta)-DP because sigma >= Delta sigma_1(epsilon, delta). Centring
and projecting Y are post-processing again. (Centring *after* the noise keeps the sensitivity a single row's,
and spends nothing: the column means of the output are computed from the output.)

Floating point. Textbook floating-point noise leaks through the low-order bits of ``x + noise`` (Mironov,
CCS 2012). Here the noise is added by ``shared.privacy.lattice`` (the one place every pobo mechanism adds
Gaussian noise): the output is an integer multiple of g, a lattice that does not depend on the data; the
integer arithmetic ``A + E`` is exact (int64); and the noise is drawn at a resolution far finer than the
lattice (sigma / g <= 2^45, so one lattice step spans thousands of float64 values of ``N / g``). What remains
is the accuracy of numpy's Gaussian sampler itself. OpenDP's exact discrete-Gaussian sampler would remove
that too, but it takes ~70 microseconds per entry at its default granularity (an hour for 10^6 x 50 rows,
against ~2 s here; ``pobo bench perf``); the tests compare this sampler with OpenDP's
(``tests/shared/test_gaussian.py``). The noise comes from ``os_entropy_rng()``: AES-CTR keyed from the OS.

Streams. The rows are cut into noise blocks whose boundaries depend on (n, d) only (``noise_blocks``). The
master generator draws the projection M first (when r < d), then two 128-bit keys per block, in block order
(``noise_keys``): block b's noise N comes from the AES-CTR stream keyed by its first key, its dither from the
stream keyed by its second (``shared.privacy.rng.keyed_rng``). Each entry's noise is still exact lattice noise
from a cryptographic stream, and the streams are independent (AES-CTR under independent uniformly random
keys), so the mechanism and its guarantee are those above; what the blocks buy is that a block's Y is a
function of its rows and its keys alone, computed the same wherever it is computed: in this process
(``gaussian_release``) or as a Dask task on the curator's cluster (``shared.distributed.release``), with the
same Z bit for bit. The column sums of Y are summed per block (``release_block``) and the blocks' sums added
in block order, in both.

``noisy_rows`` is the mechanism itself (Y of one row block); ``release_block`` is one block of the release
(the mechanism, its column sums, the projection); ``gaussian_release`` runs the blocks in order and centres.
The privacy audit attacks ``noisy_rows``'s output bit by bit (``shared.privacy.audit``) and the release's
whole output by its distribution.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError
from shared.privacy.gdp import gdp_epsilon, noise_multiplier_for
from shared.privacy.lattice import (
    MAX_LATTICE_VALUE,
    MAX_SIGMA_STEPS,
    RELAXATION,
    LatticeGaussian,
    SamplerMargins,
    add_lattice_noise,
    check_sampler_margins,
    lattice_gaussian,
    lattice_noise,
    sampler_margins,
)
from shared.privacy.params import check_epsilon_delta, check_r
from shared.privacy.rng import derived_key, keyed_rng, os_entropy_rng
from shared.privacy.rows import BLOCK_BYTES, FloatArray, check_matrix, raise_not_finite, read_block

__all__ = [
    "MAX_LATTICE_VALUE",
    "MAX_SIGMA_STEPS",
    "RELAXATION",
    "GaussianCalibration",
    "GaussianRelease",
    "NoiseKeys",
    "calibrate",
    "check_release_r",
    "epsilon_for_change",
    "gaussian_release",
    "lattice_noise",
    "noise_blocks",
    "noise_keys",
    "noisy_rows",
    "release_block",
    "release_projection_matrix",
]

#: The release's noise blocks: at least this many rows (a block's two keys and generators cost ~10 us) ...
NOISE_BLOCK_MIN_ROWS = 4096
#: ... aiming at this many blocks (work for a cluster's workers), and at most ``BLOCK_BYTES`` of X each.
NOISE_BLOCKS_TARGET = 64


@dataclass(frozen=True)
class GaussianCalibration:
    """The public parameters of a Gaussian release (functions of epsilon, delta and d only)."""

    epsilon: float
    delta: float
    d: int
    granularity_exponent: int  # k
    granularity: float  # g = 2^k
    sensitivity: float  # Delta = 1 + g sqrt(d)
    noise_multiplier: float  # z = sigma / Delta = sigma_1(epsilon, delta)
    sigma: float  # noise standard deviation, in scaled units
    sampler: SamplerMargins  # the sampler's margins calibrated for: (epsilon - margin, delta less margin)

    @property
    def max_abs_value(self) -> float:
        """Largest |x| (scaled units) the lattice represents exactly."""
        return MAX_LATTICE_VALUE * self.granularity

    @property
    def mechanism(self) -> LatticeGaussian:
        """The exact Gaussian mechanism on one row (sensitivity 1, d entries) that adds the noise."""
        return lattice_gaussian(1.0, self.noise_multiplier, self.d)


@dataclass(frozen=True)
class GaussianRelease:
    """The released Z and its public calibration (nothing here is curator-private)."""

    Z: FloatArray  # [n, r]
    calibration: GaussianCalibration
    projected: bool  # True when Z = Yc M / sqrt(r) with r < d


@functools.lru_cache(maxsize=256)
def _calibrate(epsilon: float, delta: float, d: int) -> GaussianCalibration:
    # z: the smallest noise multiplier with Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z) <= delta
    # (Balle & Wang, Thm. 8), verified in log space and stepped up until it holds (``noise_multiplier_for``),
    # for (epsilon, delta) less the sampler's margins on one row's d entries (``shared.privacy.lattice``):
    # the implemented release then is (epsilon, delta)-DP. The delta margin only shrinks as z grows, so the
    # margins at z0 <= z cover the calibrated z.
    z0 = noise_multiplier_for(epsilon, delta)
    margins = check_sampler_margins(epsilon, delta, d, z0)
    z = noise_multiplier_for(epsilon - margins.epsilon, margins.ideal_delta(delta))
    mech = lattice_gaussian(1.0, z, d)  # one row moves by norm <= 1: the lattice adds g sqrt(d)
    return GaussianCalibration(
        epsilon=epsilon,
        delta=delta,
        d=d,
        granularity_exponent=mech.granularity_exponent,
        granularity=mech.granularity,
        sensitivity=mech.lattice_sensitivity,
        noise_multiplier=z,
        sigma=mech.sigma,
        sampler=margins,
    )


def calibrate(epsilon: float, delta: float, d: int) -> GaussianCalibration:
    """The noise of an (epsilon, delta)-DP Gaussian release of d features (cached: a pure function)."""
    eps, dlt = check_epsilon_delta(epsilon, delta)
    if isinstance(d, bool) or not isinstance(d, int | np.integer) or int(d) < 1:
        raise InputDataError(f"d must be an integer >= 1, got {d!r}")
    return _calibrate(eps, dlt, int(d))


def epsilon_for_change(calibration: GaussianCalibration, change: float, *, rows: int = 1) -> float:
    """The epsilon (at the release's delta) protecting a change of norm ``change`` in scaled units, spread
    over at most ``rows`` rows (a person's rows).

    A change of norm c moves the mechanism's mean by c Delta, so it is protected like a unit change with
    noise multiplier z / c: the mechanism is (c / z)-GDP for it (group privacy for the Gaussian mechanism is
    exact in this form), and ``gdp_epsilon`` never returns too small an epsilon. The sampler's margins on the
    rows' d entries each are folded in (``shared.privacy.lattice.sampler_margins``), as at calibration;
    InputDataError when they cannot be (a change many noise standard deviations wide at a small delta).
    """
    if not (math.isfinite(change) and change > 0):
        raise InputDataError(f"change must be a finite number > 0, got {change!r}")
    z = calibration.noise_multiplier / change
    margins = sampler_margins(max(1, int(rows)) * calibration.d, z, calibration.delta)
    if margins.delta >= 0.5 * calibration.delta:
        raise InputDataError(
            f"a change of norm {change:g} is not covered by a proven epsilon at delta = "
            f"{calibration.delta:g}: it moves the release's mean by {1.0 / z:.3g} noise standard deviations, "
            "where pobo's Gaussian sampler is not proven accurate enough; release with a larger delta or a "
            "smaller epsilon"
        )
    return gdp_epsilon(1.0 / z, margins.ideal_delta(calibration.delta)) + margins.epsilon


def noisy_rows(
    Xb: FloatArray,
    calibration: GaussianCalibration,
    rng: np.random.Generator,
    *,
    checked: bool = False,
    dither_rng: np.random.Generator | None = None,
) -> FloatArray:
    """Y = g (rint(X / g) + E) for one block of scaled rows: the Gaussian mechanism, noise added exactly.

    Everything the release does after this (centring, projecting) is post-processing of Y. ``checked``: the
    caller verified that X is finite and inside the lattice's range (``gaussian_release`` does, naming rows).
    ``dither_rng``: the dither's own stream (``shared.privacy.lattice.lattice_noise``).
    """
    return add_lattice_noise(calibration.mechanism, Xb, rng, checked=checked, dither_rng=dither_rng)


def check_release_r(r: int | None, d: int) -> int | None:
    """``r`` of a Gaussian release of d features: None (no projection) or 1 <= r < d (InputDataError else)."""
    if r is None:
        return None
    if check_r(r) >= d:
        raise InputDataError(
            f"r = {int(r)} is not below d = {d}: a Gaussian release projects only to fewer dimensions "
            f"than the {d} features; omit r to release all {d} noisy features"
        )
    return int(r)


def release_projection_matrix(rng: np.random.Generator, d: int, r: int | None) -> FloatArray | None:
    """B = M / sqrt(r) [d, r], M i.i.d. N(0, 1): the first draw of the master generator (None when r is
    None). Never stored."""
    if r is None:
        return None
    return rng.standard_normal((d, int(r))) / math.sqrt(int(r))


def noise_blocks(n: int, d: int) -> range:
    """Start offsets of the release's noise blocks (``range.step`` rows each, the last one shorter).

    A function of (n, d) only, never of how X is stored, read or chunked on a cluster: a block's noise is
    drawn from its own streams, so the boundaries are part of the mechanism's definition (any boundaries
    give the same distribution, fixed ones give the same bits). At least ``NOISE_BLOCK_MIN_ROWS`` rows,
    about n / ``NOISE_BLOCKS_TARGET``, at most ``BLOCK_BYTES`` of float64 rows.
    """
    most = max(1, BLOCK_BYTES // (8 * max(d, 1)))
    rows = min(most, max(NOISE_BLOCK_MIN_ROWS, -(-n // NOISE_BLOCKS_TARGET)))
    return range(0, n, rows)


@dataclass(frozen=True)
class NoiseKeys:
    """The keys of one noise block's two AES-CTR streams (curator-private: whoever holds them can subtract
    the block's noise; they travel only to the curator's own cluster, and are never stored or printed)."""

    noise: int = field(repr=False)
    dither: int = field(repr=False)


def noise_keys(rng: np.random.Generator, blocks: int) -> list[NoiseKeys]:
    """Two 128-bit keys per block, drawn from the master generator in block order (noise key, then dither
    key): each block's streams are independent of each other and of the master's remaining stream."""
    return [NoiseKeys(noise=derived_key(rng), dither=derived_key(rng)) for _ in range(blocks)]


def _noisy_checked(
    Xb: FloatArray,
    start: int,
    cal: GaussianCalibration,
    rng: np.random.Generator,
    dither: np.random.Generator,
) -> FloatArray:
    """Y of rows ``start:start+len(Xb)`` after refusing non-finite values or values beyond the lattice (by
    position, never by value)."""
    stop = start + Xb.shape[0]
    with np.errstate(invalid="ignore"):
        peak = float(np.abs(Xb).max())
    if not math.isfinite(peak):
        raise_not_finite(Xb, start)
    limit = cal.max_abs_value
    if peak >= limit:
        raise InputDataError(
            f"a feature value reaches |x| >= {limit:.3g} (scaled units) around rows {start}..{stop - 1}; "
            "the Gaussian release represents |x| below that: rescale the features"
        )
    return noisy_rows(Xb, cal, rng, checked=True, dither_rng=dither)


def _project(Yb: FloatArray, B: FloatArray | None) -> FloatArray:
    return Yb if B is None else Yb @ B


def release_block(
    Xb: npt.ArrayLike,
    start: int,
    calibration: GaussianCalibration,
    keys: NoiseKeys,
    B: FloatArray | None,
) -> tuple[FloatArray, FloatArray]:
    """One noise block of the release: (Y_b, or Y_b B when projecting; the column sums of Y_b [d]).

    ``Xb``: the block's rows (rows ``start`` on, for error messages). A pure function of its arguments:
    ``gaussian_release`` calls it in this process, ``shared.distributed.release`` as a Dask task (which a
    cluster may run twice, after losing a worker: with the same result). The rows are made C-contiguous
    float64 first, so that the column sums are always the same sequence of float additions.
    """
    Xc = np.ascontiguousarray(Xb, dtype=np.float64)
    Yb = _noisy_checked(Xc, int(start), calibration, keyed_rng(keys.noise), keyed_rng(keys.dither))
    return _project(Yb, B), Yb.sum(axis=0)


def gaussian_release(
    X: npt.ArrayLike,
    *,
    epsilon: float,
    delta: float,
    r: int | None = None,
    rng: np.random.Generator | None = None,
    block_rows: int | None = None,
) -> GaussianRelease:
    """Release Z [n, r] (or [n, d] when ``r`` is None), (epsilon, delta)-DP for one row moving by norm <= 1.

    ``r`` (optional, 1 <= r < d) adds a Gaussian random projection ``Z = Yc M / sqrt(r)`` as post-processing.
    ``rng`` defaults to a fresh generator seeded from OS entropy (production); pass one only in tests and
    benchmarks: it draws M, then the noise blocks' keys (module docstring). One streaming pass over the rows,
    block by block (``release_block``); ``block_rows`` (tests) reads fewer rows at a time inside a noise block
    without changing its noise (its column sums may then differ in the last bits). The same master generator
    gives the same Z, bit for bit, as ``shared.distributed.release.gaussian_release_dask``.
    """
    X = check_matrix(X)
    n, d = X.shape
    cal = calibrate(epsilon, delta, d)
    r = check_release_r(r, d)
    rng = rng if rng is not None else os_entropy_rng()
    B = release_projection_matrix(rng, d, r)
    blocks = noise_blocks(n, d)
    keys = noise_keys(rng, len(blocks))
    Z = np.empty((n, d if B is None else B.shape[1]))
    colsum = np.zeros(d)
    for start, key in zip(blocks, keys, strict=True):
        stop = min(n, start + blocks.step)
        if block_rows is None or block_rows >= stop - start:
            Z[start:stop], part = release_block(read_block(X, start, stop), start, cal, key, B)
            colsum += part
            continue
        noise, dither = keyed_rng(key.noise), keyed_rng(key.dither)
        for lo in range(start, stop, max(1, int(block_rows))):  # the block's streams, read in pieces
            hi = min(stop, lo + max(1, int(block_rows)))
            Xb = np.ascontiguousarray(read_block(X, lo, hi))
            Yb = _noisy_checked(Xb, lo, cal, noise, dither)
            colsum += Yb.sum(axis=0)
            Z[lo:hi] = _project(Yb, B)
    mean = colsum / n
    Z -= mean if B is None else mean @ B
    return GaussianRelease(Z=Z, calibration=cal, projected=B is not None)
