"""Streaming CSV parser: a header row, then numeric rows, read in ~16 MiB chunks of whole lines.

Never holds the file as one string. Each chunk is parsed by numpy's C reader (``np.loadtxt`` on the
chunk's lines, the fast path); if that fails, or yields a non-finite value, or the fields per line do not
match the header, the chunk is re-parsed by a strict line-by-line parser that is the authority: it either
returns the values or raises ``InvalidInput`` naming the first bad cell by line, data row and column.

Rules: UTF-8 (a BOM is allowed), comma-delimited, ``"``-quoting allowed; blank lines are skipped; every
line has exactly as many fields as the header; a *selected* cell (a feature or the objective) must be a
finite decimal number (no NaN, no infinity, no empty cell). Columns that are not selected may hold
anything, but the *id column* (``ChunkParser(id_col=...)``), read as text, must hold a non-empty printable
id of at most ``ID_MAX_BYTES`` UTF-8 bytes in every row. Error messages name positions only, never a cell's
content. A file that is not comma-separated (semicolons, tabs) is named as such (``delimiter_hint``).
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import math
import multiprocessing as mp
import threading
import unicodedata
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from curator_service.exceptions import InvalidInput

CHUNK_BYTES = 16 * 2**20
MAX_HEADER_BYTES = 4 * 2**20
#: Longest sample id (UTF-8 bytes) of an id column.
ID_MAX_BYTES = 200
#: Delimiters other than the comma that spreadsheets export, with their names for messages.
_OTHER_DELIMITERS = {";": "semicolon", "\t": "tab", "|": "pipe"}


class RowError(InvalidInput):
    """A problem at a data row; chunks parsed in worker processes count rows from 1 and are shifted after."""

    def __init__(self, row: int, rest: str) -> None:
        super().__init__(f"data row {row} {rest}")
        self.row = row
        self.rest = rest

    def __reduce__(self) -> tuple[type[RowError], tuple[int, str]]:
        return (RowError, (self.row, self.rest))

    def shifted(self, offset: int) -> RowError:
        return RowError(self.row + offset, self.rest)


def _ordinal(j: int) -> str:
    return f"column {j + 1}"


_SAVE_AS_COMMA = (
    'pobo reads comma-separated CSV: save the file as "CSV UTF-8 (comma delimited)", or replace the '
    "delimiters by commas (and decimal commas by points)"
)


def delimiter_hint(text: str) -> str | None:
    """ "the file looks semicolon-separated" (or tab-, pipe-) when ``text`` (the first line or lines of a
    file) has no comma but splits on another delimiter that ``csv.Sniffer`` finds; else None."""
    if "," in text:
        return None
    sample = text if text.endswith("\n") else text + "\n"
    try:
        found: str | None = csv.Sniffer().sniff(sample, delimiters="".join(_OTHER_DELIMITERS)).delimiter
    except csv.Error:
        found = None
    if found not in _OTHER_DELIMITERS:  # a sniffer that gives up: the most frequent of the others, if any
        counts = {d: text.count(d) for d in _OTHER_DELIMITERS}
        best = max(counts, key=lambda d: counts[d])
        found = best if counts[best] else None
    if found is None:
        return None
    return f"the file looks {_OTHER_DELIMITERS[found]}-separated"


@dataclass(frozen=True)
class Header:
    names: list[str]

    def describe(self, j: int) -> str:
        return f"column {self.names[j]!r} ({_ordinal(j)})"


class CsvStream:
    """Reads a CSV from a binary file object; hashes every byte it reads (``sha256``)."""

    def __init__(self, fh: BinaryIO, chunk_bytes: int | None = None) -> None:
        self.fh = fh
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self._hash = hashlib.sha256()
        self.header = self._read_header()

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def _read(self, size: int) -> bytes:
        data = self.fh.read(size)
        self._hash.update(data)
        return data

    def _readline(self, limit: int = -1) -> bytes:
        data = self.fh.readline(limit)
        self._hash.update(data)
        return data

    def _read_header(self) -> Header:
        raw = self._readline(MAX_HEADER_BYTES)
        if not raw.strip():
            if raw:  # a blank first line: the header is required to be line 1
                raise InvalidInput("line 1 is blank; the CSV must start with a header row of column names")
            raise InvalidInput("the file is empty; expected a header row and at least 2 data rows")
        if not raw.endswith(b"\n") and len(raw) >= MAX_HEADER_BYTES:
            raise InvalidInput(f"the header row (line 1) is longer than {MAX_HEADER_BYTES} bytes")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise InvalidInput("line 1 (the header) is not valid UTF-8 text") from None
        try:
            names = [name.strip() for name in next(csv.reader([text.rstrip("\r\n")]))]
        except csv.Error as exc:  # e.g. a lone carriage return inside the header row
            why = "a carriage return (\\r) inside the row" if "\r" in text.rstrip("\r\n") else str(exc)
            raise InvalidInput(
                f"line 1 (the header) is not a valid CSV row: {why}; end lines with \\n or \\r\\n only and "
                "put any name that contains a comma, a quote or a line break in double quotes"
            ) from None
        if len(names) == 1:
            hint = delimiter_hint(text)
            if hint is not None:
                raise InvalidInput(f"{hint}: its header row (line 1) has no comma. {_SAVE_AS_COMMA}")
        for j, name in enumerate(names):
            if not name:
                raise InvalidInput(f"the header (line 1) has an empty name in {_ordinal(j)}")
            control = next((c for c in name if unicodedata.category(c) == "Cc"), None)
            if control is not None:  # NUL, a quoted line break, a tab...: never echoed raw
                raise InvalidInput(
                    f"the header (line 1) has a control character (U+{ord(control):04X}) in the name in "
                    f"{_ordinal(j)}; column names must be printable text"
                )
        seen: set[str] = set()
        dups = [name for name in names if name in seen or seen.add(name)]  # type: ignore[func-returns-value]
        if dups:
            listed = ", ".join(repr(d) for d in dict.fromkeys(dups))
            raise InvalidInput(f"the header (line 1) has duplicate column names: {listed}")
        return Header(names)

    def chunks(self) -> Iterator[tuple[int, bytes]]:
        """(file line number of the chunk's first line, bytes of whole lines)."""
        line = 2
        while True:
            buf = self._read(self.chunk_bytes)
            if not buf:
                return
            if not buf.endswith(b"\n"):
                buf += self._readline()
            yield line, buf
            line += buf.count(b"\n")


#: The sample ids of a chunk's rows: UTF-8 bytes, fixed width (numpy ``S``).
Ids = npt.NDArray[np.bytes_]


class ChunkParser:
    """Parses chunks into float64 arrays of the selected columns (``usecols``, in that order), and the text
    of the id column ``id_col`` when there is one (``parse_rows``)."""

    def __init__(self, header: Header, usecols: list[int], id_col: int | None = None) -> None:
        self.header = header
        self.ncols = len(header.names)
        self.usecols = usecols
        self.id_col = id_col
        self._all = usecols == list(range(self.ncols))

    def parse(self, first_line: int, first_row: int, buf: bytes) -> npt.NDArray[np.float64]:
        """Values [k, len(usecols)] of the chunk's non-blank lines; ``first_row`` is the 1-based data row."""
        return self.parse_rows(first_line, first_row, buf)[0]

    def parse_rows(
        self, first_line: int, first_row: int, buf: bytes
    ) -> tuple[npt.NDArray[np.float64], Ids | None]:
        """The values (as ``parse``) and, with an id column, the k ids of the same rows."""
        try:
            text = buf.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad_line = first_line + buf[: exc.start].count(b"\n")
            raise InvalidInput(f"line {bad_line} is not valid UTF-8 text") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        fast = self._fast(buf, lines)
        if fast is not None:
            if self.id_col is None:
                return fast, None
            cut = _fast_ids(buf, self.ncols, self.id_col)
            if cut is not None and cut.shape[0] == fast.shape[0]:
                return fast, cut
            j = self.id_col  # no quote in the chunk and every line has ncols fields (checked by _fast)
            cells = [(line_no, line.rstrip("\r")) for line_no, line in enumerate(lines, start=first_line)]
            rows = [(n, line.split(",")[j]) for n, line in cells if line.strip()]
            return fast, self._ids(first_row, rows)
        ids: list[tuple[int, str]] | None = [] if self.id_col is not None else None
        values = self._strict(first_line, first_row, lines, ids)
        return values, None if ids is None else self._ids(first_row, ids)

    def _ids(self, first_row: int, cells: list[tuple[int, str]]) -> Ids:
        """The id cells (line number, text) of consecutive rows, checked, as UTF-8 bytes."""
        assert self.id_col is not None
        column = f"the id column {self.header.names[self.id_col]!r} ({_ordinal(self.id_col)})"
        out: list[bytes] = []
        for k, (line_no, cell) in enumerate(cells):
            value = cell.strip()
            where = f"(line {line_no}), {column}"
            if not value:
                raise RowError(first_row + k, f"{where}: the id is empty; every row needs its own id")
            if any(unicodedata.category(c) == "Cc" for c in value):
                raise RowError(first_row + k, f"{where}: the id holds a control character; ids must be text")
            encoded = value.encode("utf-8")
            if len(encoded) > ID_MAX_BYTES:
                raise RowError(first_row + k, f"{where}: the id is longer than {ID_MAX_BYTES} bytes")
            out.append(encoded)
        return np.array(out, dtype=np.bytes_) if out else np.empty(0, dtype="S1")

    def _fast(self, buf: bytes, lines: list[str]) -> npt.NDArray[np.float64] | None:
        if b'"' in buf:
            return None  # quoted fields: let the csv module count the fields
        raw = np.frombuffer(buf, dtype=np.uint8)
        ends = np.flatnonzero(raw == 10)
        if ends.size == 0 or ends[-1] != raw.size - 1:
            ends = np.append(ends, raw.size)
        starts = np.concatenate(([0], ends[:-1] + 1))
        commas = np.concatenate(([0], np.cumsum(raw == 44)))
        per_line = commas[ends] - commas[starts]
        length = ends - starts
        cr_only = (length == 1) & (raw[np.minimum(starts, raw.size - 1)] == 13)
        blank = (length == 0) | cr_only
        if np.any(~blank & (per_line != self.ncols - 1)):
            return None
        expected_rows = int(np.count_nonzero(~blank))
        if expected_rows == 0:
            return np.empty((0, len(self.usecols)))
        try:
            values = np.loadtxt(
                lines,
                delimiter=",",
                dtype=np.float64,
                comments=None,
                ndmin=2,
                usecols=None if self._all else self.usecols,
            )
        except ValueError:
            return None
        if values.shape != (expected_rows, len(self.usecols)) or not np.isfinite(values).all():
            return None
        return values

    def _strict(
        self, first_line: int, first_row: int, lines: list[str], ids: list[tuple[int, str]] | None = None
    ) -> npt.NDArray[np.float64]:
        out = np.empty((len(lines), len(self.usecols)))
        k = 0
        row = first_row
        for offset, line in enumerate(lines):
            line_no = first_line + offset
            line = line.rstrip("\r")
            if not line.strip():
                continue
            try:
                fields = next(csv.reader([line], strict=True))
            except csv.Error:
                raise RowError(row, f"(line {line_no}): malformed CSV quoting") from None
            if len(fields) != self.ncols:
                hint = delimiter_hint(line) if len(fields) == 1 else None
                raise RowError(
                    row,
                    f"(line {line_no}) has {len(fields)} field(s) but the header has {self.ncols} columns "
                    + (f"({hint}: {_SAVE_AS_COMMA})" if hint else "(ragged row)"),
                )
            for out_j, j in enumerate(self.usecols):
                out[k, out_j] = _cell(fields[j], row, line_no, self.header.describe(j))
            if ids is not None and self.id_col is not None:
                ids.append((line_no, fields[self.id_col]))
            k += 1
            row += 1
        return out[:k]


def _fast_ids(buf: bytes, ncols: int, j: int) -> Ids | None:
    """Column ``j`` of a chunk without quotes whose every non-blank line has ``ncols`` fields, cut out with
    array operations (no Python loop per line): the stripped ids, or None when any of them is empty, too
    long or holds a control character (the line-by-line reader then names the row)."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    ends = np.flatnonzero(raw == 10)
    if ends.size == 0 or ends[-1] != raw.size - 1:
        ends = np.append(ends, raw.size)
    starts = np.concatenate(([0], ends[:-1] + 1))
    length = ends - starts
    cr_only = (length == 1) & (raw[np.minimum(starts, raw.size - 1)] == 13)
    keep = (length > 0) & ~cr_only
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return np.empty(0, dtype="S1")
    commas = np.flatnonzero(raw == 44)
    first = np.searchsorted(commas, starts)  # each line's first comma
    lo = starts if j == 0 else commas[first + j - 1] + 1
    hi = ends if j == ncols - 1 else commas[first + j]
    width = int((hi - lo).max())
    if width == 0 or width > 4 * ID_MAX_BYTES:  # an empty id everywhere, or a cell far too long
        return None
    at = lo[:, None] + np.arange(width)
    cells = np.where(at < hi[:, None], raw[np.minimum(at, raw.size - 1)], 0).astype(np.uint8)
    ids = np.strings.strip(np.ascontiguousarray(cells).view(f"S{width}").ravel())
    sizes = np.strings.str_len(ids)
    packed = ids.view(np.uint8).reshape(ids.shape[0], -1)
    control = ((packed > 0) & (packed < 32)) | (packed == 127)
    if sizes.min() == 0 or sizes.max() > ID_MAX_BYTES or control.any():
        return None
    return ids


def _cell(text: str, row: int, line_no: int, column: str) -> float:
    where = f"(line {line_no}), {column}"
    cell = text.strip()
    if not cell:
        raise RowError(row, f"{where}: the cell is empty; every selected cell must hold a number")
    try:
        if "_" in cell:
            raise ValueError
        value = float(cell)
    except ValueError:
        raise RowError(row, f"{where}: the cell is not a number") from None
    if math.isnan(value):
        raise RowError(row, f"{where}: the cell is NaN; every selected cell must be a finite number")
    if math.isinf(value):
        raise RowError(
            row, f"{where}: the cell is infinite (or overflows float64); every selected cell must be finite"
        )
    return value


# ------------------------------------------------------------------------------ parallel chunk parsing

_pool: ProcessPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


def _get_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool shared by uploads (created on first use; ``forkserver``: safe in a threaded server)."""
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers != workers:
            if _pool is not None:
                _pool.shutdown(wait=False, cancel_futures=True)
            _pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("forkserver"))
            _pool_workers = workers
        return _pool


def shutdown_pool() -> None:
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
            _pool = None


Parsed = tuple[npt.NDArray[np.float64], Ids | None]


def _parse_in_worker(
    names: list[str], usecols: list[int], id_col: int | None, first_line: int, buf: bytes
) -> Parsed:
    return ChunkParser(Header(names), usecols, id_col).parse_rows(first_line, 1, buf)


def iter_values(
    stream: CsvStream, parser: ChunkParser, *, workers: int = 1
) -> Iterator[npt.NDArray[np.float64]]:
    """The parsed chunks' values (``iter_rows`` without the ids)."""
    for values, _ids in iter_rows(stream, parser, workers=workers):
        yield values


def iter_rows(stream: CsvStream, parser: ChunkParser, *, workers: int = 1) -> Iterator[Parsed]:
    """The parsed chunks of ``stream`` in file order: (values, ids or None).

    A file of several chunks is parsed by ``workers`` processes (numpy's parser holds the GIL, so threads
    would not help); a chunk's rows are numbered from 1 there and shifted here, so error messages name the
    same data row as a serial parse. At most ``2 * workers`` chunks are in flight (bounded memory).
    """
    rows = 0
    chunks = stream.chunks()
    head = list(itertools.islice(chunks, 2))
    if workers <= 1 or len(head) < 2:
        for first_line, buf in itertools.chain(head, chunks):
            parsed = parser.parse_rows(first_line, rows + 1, buf)
            rows += parsed[0].shape[0]
            yield parsed
        return
    pool = _get_pool(workers)
    names = parser.header.names
    pending: deque[Future[Parsed]] = deque()

    def take() -> Parsed:
        nonlocal rows
        try:
            parsed = pending.popleft().result()
        except RowError as exc:
            raise exc.shifted(rows) from None
        rows += parsed[0].shape[0]
        return parsed

    try:
        for first_line, buf in itertools.chain(head, chunks):
            if len(pending) >= 2 * workers:
                yield take()
            pending.append(
                pool.submit(_parse_in_worker, names, parser.usecols, parser.id_col, first_line, buf)
            )
        while pending:
            yield take()
    finally:
        for future in pending:
            future.cancel()
