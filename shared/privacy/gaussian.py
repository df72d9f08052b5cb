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

``noisy_rows`` is the mechanism itself (Y of one row block); ``gaussian_release`` streams the blocks through
it and post-processes (centring, projection). The privacy audit attacks ``noisy_rows``'s output bit by bit
(``shared.privacy.audit``) and the release's whole output by its distribution.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

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
from shared.privacy.rng import derived_rng, os_entropy_rng
from shared.privacy.rows import FloatArray, check_matrix, raise_not_finite, read_block, row_blocks

__all__ = [
    "MAX_LATTICE_VALUE",
    "MAX_SIGMA_STEPS",
    "RELAXATION",
    "GaussianCalibration",
    "GaussianRelease",
    "calibrate",
    "epsilon_for_change",
    "gaussian_release",
    "lattice_noise",
    "noisy_rows",
]


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
    benchmarks. One streaming pass over the rows: noise, column sums and the projection block by block.
    """
    X = check_matrix(X)
    n, d = X.shape
    cal = calibrate(epsilon, delta, d)
    if r is not None:
        if check_r(r) >= d:
            raise InputDataError(
                f"r = {int(r)} is not below d = {d}: a Gaussian release projects only to fewer dimensions "
                f"than the {d} features; omit r to release all {d} noisy features"
            )
    rng = rng if rng is not None else os_entropy_rng()
    B: FloatArray | None = None
    if r is not None:
        B = rng.standard_normal((d, int(r))) / math.sqrt(int(r))  # M / sqrt(r); never stored
    dither = derived_rng(rng)  # the dither's own stream: the blocks' size does not change the noise
    Z = np.empty((n, d if B is None else B.shape[1]))
    colsum = np.zeros(d)
    limit = cal.max_abs_value
    blocks = row_blocks(n, d, block_rows)
    for start in blocks:
        stop = min(n, start + blocks.step)
        Xb = read_block(X, start, stop)
        with np.errstate(invalid="ignore"):
            peak = float(np.abs(Xb).max())
        if not math.isfinite(peak):
            raise_not_finite(Xb, start)
        if peak >= limit:
            raise InputDataError(
                f"a feature value reaches |x| >= {limit:.3g} (scaled units) around rows {start}..{stop - 1}; "
                "the Gaussian release represents |x| below that: rescale the features"
            )
        # the mechanism's output; everything below is post-processing
        Yb = noisy_rows(Xb, cal, rng, checked=True, dither_rng=dither)
        colsum += Yb.sum(axis=0)
        if B is None:
            Z[start:stop] = Yb
        else:
            np.matmul(Yb, B, out=Z[start:stop])
    mean = colsum / n
    Z -= mean if B is None else mean @ B
    return GaussianRelease(Z=Z, calibration=cal, projected=B is not None)
