"""Content fingerprints of an upload, to tell when two uploads hold the same people.

A privacy budget belongs to the people in the rows, not to an upload: uploading the same people again (in
another order, with another scaling, with renamed columns, only some of their columns or others beside them,
a column in other units, a value off by one ulp, or the same outcomes with other features) must not get a
fresh budget. Two kinds of fingerprint are kept.

**Column signatures** (``column_signatures``, the rule since issue 31): for every column, features and the
outcome alike, the values are standardised (minus their mean, over their standard deviation: the same for a
column in years or months, in any order), quantised to 2^-20 standard deviations (a one-ulp change moves no
value across a step, bar a chance of ~1e-10 per value), hashed, and the K = 64 smallest distinct hashes are
kept (a bottom-k sketch; Broder 1997, Cohen & Kaplan 2007). Two columns with the same values in other units,
order or names have the same sketch; the fraction of shared hashes among the K smallest of the union
estimates the Jaccard similarity of their value sets (``jaccard``). A column is *informative* when it has
at least 32 distinct values and is not an index (its sketch is not that of 0, 1, ..., n - 1: the row
numbers of every table of n rows). ``same_people`` decides: the same number of rows, and either two pairs of
informative columns with Jaccard >= 0.7, or one such pair of columns with at least n / 2 distinct values
each. A continuous column of n standardised values is not shared by chance (two cohorts would need the same
mean and deviation to one part in a million, and then the same set of values); a column with few, repeated
values can be (a balanced design's 40 dose levels, 5 patients each, are the same column in every such
trial), so it decides only together with another one, and a binary or categorical column never does.
The raw standard deviation of each column is kept too: it gives the unit factor between matched columns
(``populations``: a release of months is charged in the population's years).

**Exact hashes** (``FingerprintBuilder``, kept for uploads made before column signatures existed), computed
while the CSV streams in, on the parsed feature values *before* scaling:

* ``rows``: a multiset hash of the rows (each row hashed with its columns in order; the row hashes summed
  modulo 2^64, twice with independent mixers, 128 bits in all): equal exactly when the row sets are equal,
  up to a 2^-128 chance.
* ``columns``: one multiset hash per feature column (its values as a multiset), ``None`` for a constant
  column (a constant column says nothing about who is in the rows).

``same_rows`` decides from them: the same number of rows, and the non-constant columns of one upload are a
subset of the other's.

Rows added or removed are not caught (the curator declares a ``population`` for those). Hashes, not values:
nothing here can be turned back into a row, and none of it leaves the curator. Populations guard against the
curator's own staff re-using people by mistake, not against a curator who lies: anyone who wants a fresh
budget can add noise to every value.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = [
    "INFORMATIVE_DISTINCT",
    "MATCH_JACCARD",
    "SKETCH_K",
    "ColumnSignature",
    "Fingerprint",
    "FingerprintBuilder",
    "column_signatures",
    "jaccard",
    "matching_columns",
    "same_people",
    "same_rows",
]

#: Hashes kept per column (bottom-k sketch).
SKETCH_K = 64
#: Quantisation step of standardised values: 2^-QUANT_BITS standard deviations.
QUANT_BITS = 20
#: A column with fewer distinct values than this never decides a match alone.
INFORMATIVE_DISTINCT = 32
#: Estimated Jaccard similarity of two columns' value sets from which they are the same column.
MATCH_JACCARD = 0.7
#: Values per block of the signature pass (bounded memory on a memory-mapped array).
_BLOCK_VALUES = 4_000_000

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


def same_rows(a: Fingerprint, n_b: int, rows_b: str, columns_b: Sequence[str | None]) -> str | None:
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


# ------------------------------------------------------------------------------------- column signatures


@dataclass(frozen=True)
class ColumnSignature:
    """One column's signature: its bottom-k sketch of standardised, quantised values and its raw spread."""

    name: str
    role: str  # "feature" or "outcome"
    std: float  # standard deviation of the raw values (the column's own units); 0 for a constant column
    sketch: tuple[int, ...]  # the smallest distinct hashes, ascending (at most SKETCH_K)
    distinct: float  # number of distinct quantised values (exact below SKETCH_K, else estimated)
    informative: bool

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "role": self.role,
            "std": self.std,
            "sketch": "".join(f"{h:016x}" for h in self.sketch),
            "distinct": self.distinct,
            "informative": self.informative,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ColumnSignature:
        text = str(data["sketch"])
        return cls(
            name=str(data["name"]),
            role=str(data["role"]),
            std=float(data["std"]),  # type: ignore[arg-type]
            sketch=tuple(int(text[i : i + 16], 16) for i in range(0, len(text), 16)),
            distinct=float(data["distinct"]),  # type: ignore[arg-type]
            informative=bool(data["informative"]),
        )


def _hashes(quantised: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    return _mix(quantised.view(np.uint64), _SALTS[0])


def _smallest_distinct(values: npt.NDArray[np.uint64], k: int) -> npt.NDArray[np.uint64]:
    """The k smallest distinct values (fewer if there are fewer): partition first, sort only what is left."""
    take = min(values.size, 2 * k)
    while True:
        head = np.unique(np.partition(values, take - 1)[:take]) if take < values.size else np.unique(values)
        if head.size >= k or take >= values.size:
            return head[:k]
        take = min(values.size, 4 * take)


def _sketch_and_distinct(hashes: npt.NDArray[np.uint64]) -> tuple[tuple[int, ...], float]:
    sketch = hashes[:SKETCH_K]
    if sketch.size < SKETCH_K:
        return tuple(int(h) for h in sketch), float(sketch.size)
    kth = float(sketch[-1]) / 2.0**64  # (k - 1) / U_(k): the KMV estimate of the number of distinct values
    return tuple(int(h) for h in sketch), (SKETCH_K - 1) / max(kth, 1e-300)


@functools.lru_cache(maxsize=16)
def _index_sketch(n: int) -> tuple[int, ...]:
    """The sketch of 0, 1, ..., n - 1: what a row-number column of any table of n rows looks like."""
    index = np.arange(n, dtype=np.float64)
    u = (index - index.mean()) / index.std()
    q = np.rint(u * 2.0**QUANT_BITS).astype(np.int64)
    return _sketch_and_distinct(_smallest_distinct(_hashes(q), SKETCH_K))[0]


def column_signatures(
    features: np.ndarray,
    names: Sequence[str],
    factors: Sequence[float],
    outcome: np.ndarray | None = None,
    outcome_name: str | None = None,
) -> list[ColumnSignature]:
    """Signatures of every feature column of ``features`` [n, d] (e.g. the stored, memory-mapped array) and
    of ``outcome`` [n]. ``factors``: per feature, from the stored values to the raw ones (the declared scale
    of a scaled feature, else 1); the standard deviations are reported in raw units.

    Three passes over blocks of rows (each bounded in memory): the largest |value| per column, the moments of
    the values over it (shifted sums: no overflow, no cancellation), then the hashes of the standardised
    values; every column's bottom-k set is merged block by block.
    """
    n, d = features.shape
    width = d + (outcome is not None)
    if width == 0 or n == 0:
        return []
    step = max(1, _BLOCK_VALUES // width)

    def block(start: int) -> npt.NDArray[np.float64]:
        part = np.asarray(features[start : start + step], dtype=np.float64)
        if outcome is None:
            return part
        return np.column_stack([part, np.asarray(outcome[start : start + step], dtype=np.float64)])

    peak = np.zeros(width)  # pass 1: each column's largest |value| (work in value / peak: no overflow)
    for start in range(0, n, step):
        np.maximum(peak, np.abs(block(start)).max(axis=0), out=peak)
    unit = np.where(peak > 0, peak, 1.0)
    shift = block(0)[0] / unit
    s1, s2 = np.zeros(width), np.zeros(width)
    for start in range(0, n, step):  # pass 2: the moments of value / peak, shifted (no cancellation)
        centred = block(start) / unit - shift
        s1 += centred.sum(axis=0)
        s2 += np.einsum("ij,ij->j", centred, centred)
    mean_c = s1 / n
    mean, std = shift + mean_c, np.sqrt(np.maximum(s2 / n - mean_c * mean_c, 0.0))
    safe = np.where(std > 0, std, 1.0)
    kept: list[npt.NDArray[np.uint64]] = [np.zeros(0, dtype=np.uint64) for _ in range(width)]
    for start in range(0, n, step):  # pass 3: hashes of the standardised, quantised values
        quantised = np.rint((block(start) / unit - mean) / safe * 2.0**QUANT_BITS).astype(np.int64)
        hashes = _hashes(quantised)
        for j in range(width):  # (a loop over columns, not rows: each merges its block's smallest hashes)
            head = _smallest_distinct(np.ascontiguousarray(hashes[:, j]), SKETCH_K)
            kept[j] = _smallest_distinct(np.concatenate([kept[j], head]), SKETCH_K)
    with np.errstate(over="ignore"):
        raw_std = std * unit  # (inf for a spread beyond float64: recorded as 0, no unit factor)
    index = _index_sketch(n)
    labels = [(str(name), "feature", float(f)) for name, f in zip(names, factors, strict=True)]
    if outcome is not None:
        labels.append((str(outcome_name), "outcome", 1.0))
    out = []
    for j, (name, role, factor) in enumerate(labels):
        sketch, distinct = _sketch_and_distinct(kept[j])
        constant = not std[j] > 0
        informative = (
            not constant and distinct >= INFORMATIVE_DISTINCT and jaccard(sketch, index) < MATCH_JACCARD
        )
        out.append(
            ColumnSignature(
                name=name,
                role=role,
                std=float(raw_std[j] * factor) if np.isfinite(raw_std[j] * factor) else 0.0,
                sketch=() if constant else sketch,
                distinct=1.0 if constant else distinct,
                informative=informative,
            )
        )
    return out


def jaccard(a: Sequence[int], b: Sequence[int]) -> float:
    """Estimated Jaccard similarity of two columns' value sets from their bottom-k sketches (exact when
    both sets are smaller than k)."""
    if not a or not b:
        return 0.0
    sa, sb = set(a), set(b)
    if len(sa) < SKETCH_K and len(sb) < SKETCH_K:
        return len(sa & sb) / len(sa | sb)
    union = sorted(sa | sb)[:SKETCH_K]
    return sum(1 for h in union if h in sa and h in sb) / len(union)


def matching_columns(
    mine: Sequence[ColumnSignature], theirs: Sequence[ColumnSignature]
) -> list[tuple[int, int, float]]:
    """(my column, their column, Jaccard) of every pair of informative columns that are the same column."""
    pairs = []
    for i, a in enumerate(mine):
        if not a.informative:
            continue
        for j, b in enumerate(theirs):
            if b.informative:
                similarity = jaccard(a.sketch, b.sketch)
                if similarity >= MATCH_JACCARD:
                    pairs.append((i, j, similarity))
    return pairs


def same_people(
    n_a: int, mine: Sequence[ColumnSignature], n_b: int, theirs: Sequence[ColumnSignature]
) -> list[tuple[int, int, float]]:
    """The matching informative columns of two uploads of the same number of rows when they decide that the
    people are the same (two of them, or one with at least n / 2 distinct values on both sides); else
    empty."""
    if n_a != n_b:
        return []
    pairs = matching_columns(mine, theirs)
    many = [p for p in pairs if min(mine[p[0]].distinct, theirs[p[1]].distinct) >= n_a / 2]
    return pairs if len({i for i, _, _ in pairs}) >= 2 or many else []
