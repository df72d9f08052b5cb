"""Column signatures (``curator_service.fingerprint``): the same people survive every accident of issue 31,
and unrelated tables never match (nor do different people who share one repeated design column).

False matches are measured on the bundled demo and scikit-learn's diabetes and breast-cancer data, each
truncated to the other's number of rows (same-n is the first filter: without truncation nothing could match).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes

from curator_service.fingerprint import (
    INFORMATIVE_DISTINCT,
    ColumnSignature,
    column_signatures,
    jaccard,
    same_people,
)

DEMO = Path(__file__).resolve().parents[2] / "shared" / "tools" / "data" / "demo_hospital.csv"


def _demo() -> tuple[np.ndarray, np.ndarray, list[str]]:
    with DEMO.open() as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    values = np.array([[float(v) for v in r[1:]] for r in body])
    return values[:, :-1], values[:, -1], header[1:-1]


def _signatures(
    X: np.ndarray, y: np.ndarray | None = None, names: list[str] | None = None
) -> list[ColumnSignature]:
    names = names or [f"c{j}" for j in range(X.shape[1])]
    return column_signatures(X, names, [1.0] * X.shape[1], y, None if y is None else "outcome")


def test_the_same_people_match_through_every_accident() -> None:
    X, y, names = _demo()
    n = len(y)
    base = _signatures(X, y, names)
    perm = np.random.default_rng(0).permutation(n)
    ulp = X.copy()
    ulp[100, 2] = np.nextafter(ulp[100, 2], np.inf)
    months = X.copy()
    months[:, 0] *= 12
    variants = {
        "one ulp": _signatures(ulp, y),
        "shuffled, reversed columns": _signatures(X[perm][:, ::-1]),
        "age in months": _signatures(months[:, :2]),
        "a feature subset": _signatures(X[:, [4, 2]]),
        "overlap plus a new column": _signatures(
            np.column_stack([X[:, 5:], np.random.default_rng(1).normal(size=n)])
        ),
        "the outcome only": _signatures(np.random.default_rng(2).normal(size=(n, 2))[perm], y[perm]),
    }
    for label, sig in variants.items():
        assert same_people(n, sig, n, base), label
    # scaled in the curator's own units (a declared scale): the standardised values are the same
    scaled = column_signatures(X / 0.4, names, [0.4] * X.shape[1], y, "outcome")
    assert [s.sketch for s in scaled] == [s.sketch for s in base]
    assert [s.std for s in scaled] == pytest.approx([s.std for s in base])  # reported in raw units
    # and the unit factor between matched columns is their ratio of deviations: 12 for months
    ratio = _signatures(months[:, :1])[0].std / base[0].std
    assert ratio == pytest.approx(12.0)


@pytest.mark.parametrize(
    ("left", "right"), [("demo", "diabetes"), ("demo", "breast-cancer"), ("diabetes", "breast-cancer")]
)
def test_unrelated_tables_never_match(left: str, right: str) -> None:
    tables = {"demo": _demo()[:2]}
    for name, loader in (("diabetes", load_diabetes), ("breast-cancer", load_breast_cancer)):
        data = loader()
        tables[name] = (np.asarray(data.data, dtype=np.float64), np.asarray(data.target, dtype=np.float64))
    (Xa, ya), (Xb, yb) = tables[left], tables[right]
    n = min(len(ya), len(yb))
    a, b = _signatures(Xa[:n], ya[:n]), _signatures(Xb[:n], yb[:n])
    assert same_people(n, a, n, b) == []
    worst = max(jaccard(x.sketch, z.sketch) for x in a if x.informative for z in b if z.informative)
    assert worst < 0.05  # measured: 0.0 on every pair of informative columns


def test_uninformative_columns_never_decide_alone() -> None:
    rng = np.random.default_rng(3)
    n = 500
    sex_a = rng.integers(0, 2, n).astype(float)
    sex_b = rng.permutation(sex_a)  # other people, the same count: the same two standardised values
    index_a, index_b = rng.permutation(n) + 1000.0, rng.permutation(n) + 5.0  # row numbers
    a = _signatures(np.column_stack([sex_a, index_a]))
    b = _signatures(np.column_stack([sex_b, index_b]))
    assert [s.informative for s in a + b] == [False] * 4
    assert a[0].distinct == 2 < INFORMATIVE_DISTINCT and jaccard(a[0].sketch, b[0].sketch) == 1.0
    assert jaccard(a[1].sketch, b[1].sketch) == 1.0  # every index column of n rows looks the same
    assert same_people(n, a, n, b) == []
    constant = _signatures(np.ones((n, 1)))[0]
    assert constant.sketch == () and not constant.informative and constant.std == 0.0


def test_a_repeated_design_column_does_not_decide_alone() -> None:
    """Two trials of 200 patients with the same balanced design (40 dose levels x 5 patients): the dose
    column is the same in both, but they are different people. One shared column with fewer than n / 2
    distinct values is not enough; a second shared column, or one with many distinct values, is."""
    rng = np.random.default_rng(4)
    n = 200
    dose = np.repeat(np.arange(40) * 2.5 + 10, 5)
    a = _signatures(np.column_stack([rng.permutation(dose), rng.normal(size=n)]))
    b = _signatures(np.column_stack([rng.permutation(dose), rng.normal(size=n)]))
    assert a[0].informative and b[0].informative and a[0].distinct < n / 2
    assert same_people(n, a, n, b) == []  # the design alone
    weight = rng.normal(70, 12, n).round(1)
    c = _signatures(np.column_stack([dose, weight]))
    d = _signatures(np.column_stack([dose, weight])[rng.permutation(n)])
    assert len(same_people(n, c, n, d)) == 2  # the design and a second column: the same people
    e = _signatures(rng.normal(size=(n, 1)))
    f = _signatures(e_values := rng.normal(size=(n, 1)))
    assert same_people(n, e, n, f) == []
    g = _signatures(e_values[rng.permutation(n)])
    assert same_people(n, g, n, f)  # one continuous column (n distinct values) decides alone


def test_signatures_survive_extreme_values_and_round_trip_through_json() -> None:
    X = np.array([[1e300, 1.0], [-1.7e308, 2.0], [0.5, 3.0]] * 20) + np.arange(60)[:, None] * [1e290, 0.001]
    sig = _signatures(X)
    assert all(np.isfinite(s.std) for s in sig)
    again = [ColumnSignature.from_json(s.to_json()) for s in sig]
    assert again == sig
