"""Reading the curator's rows for a release: validation and row blocks (shared by every release mechanism).

Notation::

    X   [n, d]  the curator's scaled rows; may be a numpy.memmap, read in row blocks and never copied whole
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError

__all__ = ["BLOCK_BYTES", "FloatArray", "check_matrix", "raise_not_finite", "read_block", "row_blocks"]

FloatArray = npt.NDArray[np.float64]

#: Bytes of one row block read from X at a time (64 MiB keeps the working set small for memmaps).
BLOCK_BYTES = 64 * 2**20


def check_matrix(X: npt.ArrayLike) -> np.ndarray:
    """X as a 2-D numeric array of at least 2 rows and 1 column (a memmap stays a memmap)."""
    if not isinstance(X, np.ndarray):
        try:
            X = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputDataError(f"X must be a 2-D array of numbers: {exc}") from None
    if X.ndim != 2:
        raise InputDataError(f"X must be 2-D (n rows x d features), got {X.ndim} dimension(s)")
    if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
        raise InputDataError(f"X must hold real numbers, got dtype {X.dtype}")
    n, d = X.shape
    if n < 2:
        raise InputDataError(f"X needs at least 2 rows, got {n}")
    if d < 1:
        raise InputDataError("X needs at least 1 column, got 0")
    return X


def row_blocks(n: int, d: int, block_rows: int | None) -> range:
    """Start offsets of the row blocks (``range.step`` is the block length)."""
    step = block_rows or max(1, BLOCK_BYTES // (8 * max(d, 1)))
    return range(0, n, step)


def read_block(X: np.ndarray, start: int, stop: int) -> FloatArray:
    """Rows ``start:stop`` of X as float64 (a copy only when X is not float64 already)."""
    return np.asarray(X[start:stop], dtype=np.float64)


def raise_not_finite(B: FloatArray, offset: int) -> None:
    """Raise InputDataError naming the first non-finite cell of block ``B`` (by position, never by value),
    or, when every cell is finite, the row whose square overflowed."""
    bad = np.argwhere(~np.isfinite(B))
    if bad.size:
        row, col = bad[0]
        raise InputDataError(
            f"X must be finite: row {offset + int(row)}, column {int(col)} is NaN or infinite"
        )
    row = int(np.argmax(np.abs(B).max(axis=1)))
    raise InputDataError(
        f"X has values too large to square in float64 (overflow) around row {offset + row}: "
        "rescale the features"
    )
