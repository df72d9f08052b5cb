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
CCS 2012). Here the output is an integer multiple of g, a lattice that does not depend on the data; the
integer arithmetic ``A + E`` is exact (int64); and the noise is drawn at a resolution far finer than the
lattice (sigma / g <= 2^46, so one lattice step spans thousands of float64 values of ``N / g``). What remains
is the accuracy of numpy's Gaussian sampler itself. OpenDP's exact discrete-Gaussian sampler would remove
that too, but it takes ~70 microseconds per entry at its default granularity (an hour for 10^6 x 50 rows,
against ~2 s here; ``pobo bench perf``); the tests compare this sampler with OpenDP's
(``tests/shared/test_gaussian.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError
from shared.privacy.params import check_epsilon_delta, check_r
from shared.privacy.rng import os_entropy_rng
from shared.privacy.rows import FloatArray, check_matrix, raise_not_finite, read_block, row_blocks

__all__ = [
    "GaussianCalibration",
    "GaussianRelease",
    "calibrate",
    "epsilon_for_change",
    "gaussian_release",
    "lattice_noise",
]

#: Largest extra sensitivity the lattice rounding may add (g sqrt(d) <= RELAXATION): about 1e-6 of the unit.
RELAXATION = 2.0**-20
#: Largest noise scale in lattice steps (sigma / g): float64 then resolves N / g to ~2^-6 of a step.
MAX_SIGMA_STEPS = 2.0**45
#: |X| / g must stay below this so that A + E fits int64 with room for the noise.
MAX_LATTICE_VALUE = 2.0**61


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

    @property
    def max_abs_value(self) -> float:
        """Largest |x| (scaled units) the lattice represents exactly."""
        return MAX_LATTICE_VALUE * self.granularity


@dataclass(frozen=True)
class GaussianRelease:
    """The released Z and its public calibration (nothing here is curator-private)."""

    Z: FloatArray  # [n, r]
    calibration: GaussianCalibration
    projected: bool  # True when Z = Yc M / sqrt(r) with r < d


@functools.lru_cache(maxsize=256)
def _calibrate(epsilon: float, delta: float, d: int) -> GaussianCalibration:
    # z: the smallest sigma with Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s) <= delta (Balle & Wang,
    # Thm. 8), found by dp_accounting's bracketed root search; nudged up by 1e-9 (relative) so that the
    # root finder's tolerance can only ever add noise, never remove it.
    from dp_accounting.gaussian_mechanism import get_sigma_gaussian  # (imported when first used: ~1 s)

    z = get_sigma_gaussian(epsilon, delta) * (1.0 + 1e-9)
    if not (math.isfinite(z) and z > 0):
        raise InputDataError(f"no finite Gaussian noise achieves epsilon={epsilon:g}, delta={delta:g}")
    k = max(
        math.floor(math.log2(RELAXATION / math.sqrt(d))),
        math.ceil(math.log2(2.0 * z / MAX_SIGMA_STEPS)),  # (2 z: Delta <= 2, so sigma / g <= 2^45)
    )
    g = math.ldexp(1.0, k)
    sensitivity = 1.0 + g * math.sqrt(d)
    return GaussianCalibration(
        epsilon=epsilon,
        delta=delta,
        d=d,
        granularity_exponent=k,
        granularity=g,
        sensitivity=sensitivity,
        noise_multiplier=z,
        sigma=z * sensitivity,
    )


def calibrate(epsilon: float, delta: float, d: int) -> GaussianCalibration:
    """The noise of an (epsilon, delta)-DP Gaussian release of d features (cached: a pure function)."""
    eps, dlt = check_epsilon_delta(epsilon, delta)
    if isinstance(d, bool) or not isinstance(d, int | np.integer) or int(d) < 1:
        raise InputDataError(f"d must be an integer >= 1, got {d!r}")
    return _calibrate(eps, dlt, int(d))


def epsilon_for_change(calibration: GaussianCalibration, change: float) -> float:
    """The epsilon (at the release's delta) protecting a row change of norm ``change`` in scaled units.

    A change of norm c moves the mechanism's mean by c Delta, so it is protected like a unit change with
    noise multiplier z / c (group privacy for the Gaussian mechanism is exact in this form).
    """
    if not (math.isfinite(change) and change > 0):
        raise InputDataError(f"change must be a finite number > 0, got {change!r}")
    from dp_accounting.gaussian_mechanism import get_epsilon_gaussian

    return float(get_epsilon_gaussian(calibration.noise_multiplier / change, calibration.delta))


def lattice_noise(shape: tuple[int, ...], steps: float, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """E = round(N / g) with N / g ~ N(0, steps^2): integer Gaussian noise in lattice steps."""
    out = rng.standard_normal(shape)
    out *= steps
    np.rint(out, out=out)
    return out.astype(np.int64)


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
    g = cal.granularity
    steps = cal.sigma / g
    B: FloatArray | None = None
    if r is not None:
        B = rng.standard_normal((d, int(r))) / math.sqrt(int(r))  # M / sqrt(r); never stored
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
        A = np.rint(Xb / g).astype(np.int64)  # exact: g is a power of two
        A += lattice_noise(A.shape, steps, rng)
        Yb = A.astype(np.float64)
        Yb *= g  # Y = g (A + E), the mechanism's output; everything below is post-processing
        colsum += Yb.sum(axis=0)
        if B is None:
            Z[start:stop] = Yb
        else:
            np.matmul(Yb, B, out=Z[start:stop])
    mean = colsum / n
    Z -= mean if B is None else mean @ B
    return GaussianRelease(Z=Z, calibration=cal, projected=B is not None)
