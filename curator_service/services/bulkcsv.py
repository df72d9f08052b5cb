"""The CSV of a bulk measurement upload (``POST /v1/queries/results``), read into ``Measurement`` lines.

Header (names case-insensitive, any order; other columns are ignored, e.g. a lab's notes):

* ``y``: the measured outcome (a finite number) -- required;
* the query, by the first of: ``query_id`` (the curator's query), ``sample_id`` (the dataset's id column),
  ``index`` (row index; needs a release);
* ``release_id`` (optional): the release a ``sample_id`` or ``index`` belongs to; the request's form field
  ``release_id`` applies to every line that leaves it blank.

Blank lines are skipped; every other line must be complete. Errors name the line (the header is line 1)
and the column, never a cell's content. A sheet exported by the console (``queries.csv``) can be filled in
and uploaded as it is; its text cells may start with the apostrophe that keeps spreadsheets from reading them
as formulas (``formula_safe``), which is removed here.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from curator_service.csvparse import delimiter_hint
from curator_service.exceptions import InvalidInput

__all__ = ["KEY_COLUMNS", "MAX_LINES", "Measurement", "formula_safe", "parse_measurements"]

#: Columns that name a line's query, in order of precedence.
KEY_COLUMNS = ("query_id", "sample_id", "index")
#: Most measurement lines in one upload.
MAX_LINES = 100_000
_ID_MAX = 2**31 - 1
#: First characters a spreadsheet reads as a formula (OWASP "CSV injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Measurement:
    """One line: its number in the file, the value, and what names its query."""

    line: int
    y: float
    query_id: int | None = None
    sample_id: str | None = None
    index: int | None = None
    release_id: int | None = None


def formula_safe(text: str) -> str:
    """A text cell for a CSV export: an apostrophe before a leading formula character, so a spreadsheet
    shows the text instead of evaluating it (``parse_measurements`` removes it again)."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def _unescape(text: str) -> str:
    return text[1:] if text.startswith("'") and text[1:].startswith(_FORMULA_START) else text


def _integer(cell: str, line: int, column: str, *, low: int) -> int:
    try:
        value = int(cell)
    except ValueError:
        raise InvalidInput(f"line {line}, column {column!r}: not a whole number") from None
    if not low <= value <= _ID_MAX:
        raise InvalidInput(f"line {line}, column {column!r}: out of range ({low}..{_ID_MAX})")
    return value


def _value(cell: str, line: int) -> float:
    if not cell:
        raise InvalidInput(
            f"line {line}, column 'y': the value is empty; enter the measurement or delete the line"
        )
    try:
        value = float(cell)
    except ValueError:
        raise InvalidInput(
            f"line {line}, column 'y': not a number (write decimals with a point, e.g. 0.731)"
        ) from None
    if not math.isfinite(value):
        raise InvalidInput(f"line {line}, column 'y': the value must be a finite number")
    return value


def parse_measurements(data: bytes, release_id: int | None = None) -> list[Measurement]:
    """The measurement lines of ``data`` (a CSV file's bytes); ``release_id``: the form field's default."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InvalidInput(f"line {line} is not valid UTF-8 text; save the file as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise InvalidInput(
                "the file is empty or its first line is blank: it needs a header row with y and one of "
                f"{', '.join(KEY_COLUMNS)}, then one line per measurement"
            )
        names = [h.strip().lower() for h in header]
        if len(names) == 1:
            hint = delimiter_hint(text.split("\n", 1)[0])
            if hint:
                raise InvalidInput(f"{hint}: its header row (line 1) has no comma; save it comma-separated")
        twice = sorted({n for n in names if names.count(n) > 1 and n in (*KEY_COLUMNS, "y", "release_id")})
        if twice:
            raise InvalidInput(f"the header (line 1) names column(s) {', '.join(map(repr, twice))} twice")
        where = {name: j for j, name in enumerate(names)}
        key = next((k for k in KEY_COLUMNS if k in where), None)
        if "y" not in where or key is None:
            raise InvalidInput(
                f"the header (line 1) needs a column y and one of {', '.join(KEY_COLUMNS)} (found: "
                f"{', '.join(repr(n) for n in names)})"
            )
        out: list[Measurement] = []
        for fields in reader:
            line = reader.line_num
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != len(names):
                raise InvalidInput(
                    f"line {line} has {len(fields)} field(s) but the header has {len(names)} columns"
                )
            if len(out) >= MAX_LINES:
                raise InvalidInput(f"more than {MAX_LINES} measurement lines: split the file")
            out.append(_line(fields, where, key, line, release_id))
    except csv.Error:
        raise InvalidInput(f"line {reader.line_num}: malformed CSV quoting") from None
    if not out:
        raise InvalidInput("the file has a header but no measurement line")
    return out


def _line(fields: list[str], where: dict[str, int], key: str, line: int, default: int | None) -> Measurement:
    cell = {name: fields[j].strip() for name, j in where.items()}
    rel_cell = cell.get("release_id", "")
    release = _integer(rel_cell, line, "release_id", low=1) if rel_cell else default
    y = _value(cell["y"], line)
    raw = cell[key]
    if not raw:
        raise InvalidInput(f"line {line}, column {key!r}: empty; every line must name its query")
    if key == "query_id":
        return Measurement(line, y, query_id=_integer(raw, line, key, low=1), release_id=release)
    if key == "index":
        return Measurement(line, y, index=_integer(raw, line, key, low=0), release_id=release)
    return Measurement(line, y, sample_id=_unescape(raw), release_id=release)
