"""P hyper-rectangle sub-regions of equal volume, and the round-robin assignment of agents to them.

Paper: DP-FTS-DE (Dai, Low & Jaillet, NeurIPS 2021), Section 3.2 and footnote 6 ("we choose the
sub-regions to be hyper-rectangles with equal volumes and assign an approximately equal number of agents
(~ N/P) to explore every sub-region"); Algorithm 2 line 2 (initial points in X_{i_n}) and line 8 (i[x], the
sub-region x belongs to). The authors' landmine code: P = 4 on a 2 x 2 grid, agent n -> region n mod 4.

Construction: a grid. P is factored into primes p_1 >= p_2 >= ...; each factor in turn multiplies the cell
count of the axis whose current cell is widest (ties: lowest axis index), so cells stay as square as the
factors allow. All cells have the same widths, hence the same volume, and together they tile the box.

Supported P: every integer 1 <= P <= 4096 whose prime factors are all <= 7 (1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
12, 14, 15, 16, ...). Other values (11, 13, 22, ...) are refused with InputDataError: a prime factor above 7
would cut one axis into many thin slabs.

Notation (shapes in brackets)::

    lower, upper [d]     the box X = prod_j [lower_j, upper_j]
    counts       [d]     cells per axis (prod = P);  widths [d] = (upper - lower) / counts
    lo, hi     [P, d]    the cells X_1..X_P, numbered in C order of their grid index
    i[x]                 the cell of x: cells are half-open [lo, hi) except on the box's upper face
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = ["MAX_REGIONS", "SUPPORTED_PRIMES", "Regions", "as_box", "round_robin", "split_box"]

SUPPORTED_PRIMES = (2, 3, 5, 7)
MAX_REGIONS = 4096


def as_box(lower: npt.ArrayLike, upper: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Validate a box: two finite vectors of the same shape [d] with lower < upper."""
    lo = np.atleast_1d(np.asarray(lower, dtype=np.float64))
    hi = np.atleast_1d(np.asarray(upper, dtype=np.float64))
    if lo.ndim != 1 or lo.shape != hi.shape or lo.size < 1:
        raise InputDataError(
            f"lower and upper must be vectors of the same length, got {lo.shape} and {hi.shape}"
        )
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise InputDataError("lower and upper must be finite")
    if not (lo < hi).all():
        raise InputDataError("every lower bound must be < its upper bound")
    return lo, hi


def _factor(P: int) -> list[int]:
    if isinstance(P, bool) or not isinstance(P, int | np.integer) or not 1 <= P <= MAX_REGIONS:
        raise InputDataError(f"P must be an integer in [1, {MAX_REGIONS}], got {P!r}")
    rest, factors = int(P), []
    for p in SUPPORTED_PRIMES[::-1]:
        while rest % p == 0:
            factors.append(p)
            rest //= p
    if rest != 1:
        raise InputDataError(
            f"P must be a product of the primes {SUPPORTED_PRIMES} (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, ...), "
            f"got {P} (factor {rest} left)"
        )
    return factors  # descending


@dataclass(frozen=True)
class Regions:
    """The grid of P equal-volume cells of a box (Section 3.2, footnote 6)."""

    lower: FloatArray  # [d]
    upper: FloatArray  # [d]
    counts: IntArray  # [d], prod = P

    @property
    def d(self) -> int:
        return int(self.lower.shape[0])

    @property
    def P(self) -> int:
        return int(np.prod(self.counts))

    @property
    def widths(self) -> FloatArray:
        """Cell widths per axis [d]."""
        return (self.upper - self.lower) / self.counts

    @property
    def lo(self) -> FloatArray:
        """Lower corners of the cells [P, d], C order of the grid index."""
        grid = np.stack(np.unravel_index(np.arange(self.P), tuple(int(c) for c in self.counts)), axis=1)
        return self.lower + grid * self.widths

    @property
    def hi(self) -> FloatArray:
        """Upper corners of the cells [P, d]; the last cell of an axis ends exactly on the box."""
        grid = np.stack(np.unravel_index(np.arange(self.P), tuple(int(c) for c in self.counts)), axis=1)
        return np.where(grid + 1 == self.counts, self.upper, self.lower + (grid + 1) * self.widths)

    def volumes(self) -> FloatArray:
        """Volume of each cell [P] (all equal to the box volume / P)."""
        vol: FloatArray = np.prod(self.hi - self.lo, axis=1)
        return vol

    def region_of(self, X: npt.ArrayLike) -> IntArray:
        """i[x] for each row of X [k, d] -> [k] (Algorithm 2, line 8, footnote 9).

        Cells are half-open [lo, hi) along each axis, except that the box's upper face belongs to the last
        cell, so the cells partition the closed box. Points outside the box are refused.
        """
        A = np.asarray(X, dtype=np.float64)
        if A.ndim == 1 and A.shape == (self.d,):
            A = A[None, :]
        if A.ndim != 2 or A.shape[1] != self.d:
            raise InputDataError(f"X must have shape [k, {self.d}], got shape {A.shape}")
        if not (np.isfinite(A).all() and (A >= self.lower).all() and (A <= self.upper).all()):
            raise InputDataError("X must be finite and inside the box")
        idx = np.floor((A - self.lower) / self.widths).astype(np.int64)
        idx = np.clip(idx, 0, self.counts - 1)
        shape = tuple(int(c) for c in self.counts)
        flat: IntArray = np.ravel_multi_index(tuple(idx.T), shape).astype(np.int64)
        return flat


def split_box(lower: npt.ArrayLike, upper: npt.ArrayLike, P: int) -> Regions:
    """Split the box into P equal-volume hyper-rectangles on a grid (see the module docstring).

    Each prime factor of P (largest first) multiplies the cell count of the currently widest axis; e.g. the
    unit square with P = 4 gives the authors' 2 x 2 grid and [0, 2] x [0, 1] with P = 2 cuts the first axis.
    """
    lo, hi = as_box(lower, upper)
    counts = np.ones(lo.shape[0], dtype=np.int64)
    for p in _factor(P):
        j = int(np.argmax((hi - lo) / counts))  # the first widest axis
        counts[j] *= p
    return Regions(lower=lo, upper=hi, counts=counts)


def round_robin(N: int, P: int) -> IntArray:
    """Region of each agent of the frozen list [N]: agent n -> n mod P (footnote 6; authors' code)."""
    if isinstance(N, bool) or not isinstance(N, int | np.integer) or N < 1:
        raise InputDataError(f"N must be an integer >= 1, got {N!r}")
    _factor(P)
    return np.arange(int(N), dtype=np.int64) % int(P)
