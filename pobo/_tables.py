"""Tables in and out of the SDK: an in-memory table written as the CSV the curator reads, and the optional
pandas import (pandas is not a dependency of pobo)."""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PANDAS_MISSING", "as_csv", "require_pandas"]

#: The message of the ImportError raised where pandas is needed and not installed.
PANDAS_MISSING = "this needs pandas, which pobo does not install: pip install pandas"


def require_pandas() -> Any:
    """The ``pandas`` module, or an ImportError saying how to install it."""
    try:
        import pandas
    except ImportError as exc:
        raise ImportError(PANDAS_MISSING) from exc
    return pandas


@contextmanager
def as_csv(table: Any, columns: Sequence[str] | None = None) -> Iterator[Path]:
    """A CSV file holding ``table``: a path (used as it is), a pandas DataFrame (its columns; the index is
    not written) or a 2-D numpy array (with ``columns``, one name per column). A temporary file is deleted
    on exit."""
    if isinstance(table, str | os.PathLike):
        if columns is not None:
            raise TypeError("columns= names the columns of an array; a CSV file has its own header row")
        yield Path(table)
        return
    with tempfile.TemporaryDirectory(prefix="pobo-sdk-") as tmp:
        path = Path(tmp) / "table.csv"
        if hasattr(table, "to_csv") and hasattr(table, "columns"):  # a pandas DataFrame (duck-typed)
            if columns is not None:
                raise TypeError("columns= names the columns of an array; a DataFrame has its own")
            table.to_csv(path, index=False)
        else:
            _write_array(path, table, columns)
        yield path


def _write_array(path: Path, table: Any, columns: Sequence[str] | None) -> None:
    array = np.asarray(table)
    if array.ndim != 2:
        raise ValueError(f"a table must be 2-D (rows x columns); got an array of shape {array.shape}")
    if columns is None:
        raise TypeError("an array has no column names: pass columns=[...] (one name per column)")
    if len(columns) != array.shape[1]:
        raise ValueError(f"columns= has {len(columns)} names for an array of {array.shape[1]} columns")
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(list(columns))
        for row in array.tolist():
            writer.writerow([repr(v) if isinstance(v, float) else v for v in row])
