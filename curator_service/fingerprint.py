"""Content fingerprints of an upload's feature rows, to tell when two uploads hold the same people.

A privacy budget belongs to the people in the rows, not to an upload: uploading the same rows again (in
another order, with another scaling, or only some of their columns) must not get a fresh budget. Two
order-independent hashes are computed while the CSV streams in, on the parsed values *before* scaling:

* ``rows``: a multiset hash of the rows (each row hashed with its columns in order; the row hashes summed
  modulo 2^64, twice with independent mixers, 128 bits in all): equal exactly when the row sets are equal,
  up to a 2^-128 chance.
* ``columns``: one multiset hash per feature column (its values as a multiset), ``None`` for a constant
  column (a constant column says nothing about who is in the rows).

``same_people`` decides from them: the same number of rows, and the non-constant columns of one upload are a
subset of the other's. That catches re-uploads, row shuffles, renamed columns and feature subsets or
supersets; rows added or removed are not caught (the curator declares a ``population`` for those).

Hashes, not values: nothing here can be turned back into a row. Not adversarial-proof (a curator who wants a
fresh budget can perturb one value); it guards against mistakes, and the ``population`` field is the rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["Fingerprint", "FingerprintBuilder", "same_people"]

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_SALTS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))


def _mix(x: npt.NDArray[np.uint64], salt: np.uint64) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser (Steele, Lea & Flood 2014) of ``x + salt``: a bijective 64-bit mixer."""
    with np.errstate(over="ignore"):
        z = x + salt
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class Fingerprint:
    n: int
    rows: str  # 32 hex digits
    columns: list[str | None]  # 32 hex digits per non-constant feature column, None for constant ones

    def informative_columns(self) -> set[str]:
        return {c for c in self.columns if c is not None}


@dataclass
class FingerprintBuilder:
    """Accumulates the hashes chunk by chunk (vectorised; sums wrap modulo 2^64 by design)."""

    d: int
    n: int = 0
    _rows: list[np.uint64] = field(default_factory=lambda: [np.uint64(0), np.uint64(0)])
    _cols: npt.NDArray[np.uint64] | None = None
    _first: npt.NDArray[np.float64] | None = None
    _constant: npt.NDArray[np.bool_] | None = None

    def add(self, values: npt.NDArray[np.float64]) -> None:
        """Add a chunk of rows [m, d] (raw parsed feature values, before scaling)."""
        if values.shape[0] == 0:
            return
        bits = (values + 0.0).view(np.uint64)  # + 0.0 turns -0.0 into 0.0
        if self._cols is None:
            self._cols = np.zeros((2, self.d), dtype=np.uint64)
            self._first = values[0].copy()
            self._constant = np.ones(self.d, dtype=bool)
        assert self._first is not None and self._constant is not None
        self._constant &= (values == self._first).all(axis=0)
        position = np.arange(self.d, dtype=np.uint64) * np.uint64(0x632BE59BD9B4E019)
        with np.errstate(over="ignore"):
            for k, salt in enumerate(_SALTS):
                cell = _mix(bits, salt)
                self._cols[k] += cell.sum(axis=0, dtype=np.uint64)
                row = _mix(cell + position, salt).sum(axis=1, dtype=np.uint64)  # order within a row counts
                self._rows[k] = np.uint64(self._rows[k] + _mix(row, salt).sum(dtype=np.uint64))
        self.n += values.shape[0]

    def result(self) -> Fingerprint:
        def hexpair(a: np.uint64, b: np.uint64) -> str:
            return f"{int(a):016x}{int(b):016x}"

        if self._cols is None or self._constant is None:
            return Fingerprint(n=0, rows=hexpair(*self._rows), columns=[None] * self.d)
        cols: list[str | None] = [
            None if self._constant[j] else hexpair(self._cols[0, j], self._cols[1, j]) for j in range(self.d)
        ]
        return Fingerprint(n=self.n, rows=hexpair(*self._rows), columns=cols)


def same_people(a: Fingerprint, n_b: int, rows_b: str, columns_b: Sequence[str | None]) -> str | None:
    """How upload ``a`` relates to upload b when they hold the same rows, else None: ``"identical"`` (the
    same rows), ``"same-columns"`` (the same columns, reordered or renamed), ``"subset"`` (some of b's
    columns) or ``"superset"`` (b's columns and more)."""
    if a.n != n_b:
        return None
    if a.rows == rows_b:
        return "identical"
    mine = a.informative_columns()
    theirs = {c for c in columns_b if c is not None}
    if not mine or not theirs:
        return None
    if mine == theirs:
        return "same-columns"
    if mine <= theirs:
        return "subset"
    if theirs <= mine:
        return "superset"
    return None
