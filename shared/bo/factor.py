"""The GP's cross-covariance factor ``A = L^{-1} k(Z_I, Z)`` [t, n], kept in row blocks that never move.

An incremental GP-UCB loop over n candidates reads A once per step (``l^T A``, GPML Alg. 2.1 line 5 grown by
one row) and writes one new row: T steps read ``8 n T (T + 1) / 2`` bytes, the loop's memory-bandwidth floor
(``pobo bench perf``). Storing A as one array that doubles when full would also copy every row at each
doubling (and fault in twice the memory); here rows go into fixed-size blocks, allocated when the previous
one is full, so each row is written once and read once per step, block by block with one BLAS gemv each
(``project_columns``, on the chunk of columns the GP's pass is working on).

Fresh memory is expensive to touch for the first time (the kernel zeroes every page, and a virtual machine
whose host backs guest memory lazily adds a fault per page: ~2 ms per MB on our CI machines, more than reading
it). Blocks of a factor that is released or garbage-collected therefore go to a small process-wide spare list
(at most ``SPARE_LIMIT_BYTES``) and are handed to the next factor over the same n instead of new memory.

Blocks live in memory, or, when a ``spill_directory`` is given and a new block would not fit in the memory
the operating system reports available (``MemAvailable``, less a margin), in a memory-mapped file there: an
anonymous temporary file (``tempfile.TemporaryFile``), so nothing is left behind when the GP goes away.
``spill="always"`` memory-maps every block (the n = 10 000 000 benchmark uses it to exercise the path).
Factors without a directory of their own use the process default (``set_default_spill_directory``): the
modeler service sets ``<data dir>/factor-spill``.
"""

from __future__ import annotations

import tempfile
import threading
import weakref
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

__all__ = ["FactorRows", "available_memory_bytes", "give_back", "set_default_spill_directory", "take_spare"]

#: Rows per block: large enough that one dgemv per block runs at full bandwidth, small enough that the
#: unused tail of the last block (allocated, never touched) is at most 31 rows.
BLOCK_ROWS = 32

#: Memory left to everything else when deciding whether a block fits (the spill rule).
SPILL_MARGIN_BYTES = 1 << 30

#: In-memory blocks kept for reuse after their factor is gone (process-wide, all n together).
SPARE_LIMIT_BYTES = 3 << 29

#: Smaller arrays are better left to malloc: glibc serves an array below its mmap threshold from its heap and
#: raises that threshold (up to 32 MiB) when it frees a larger mapped one, after which arrays of that size
#: are reused without faulting in fresh pages. Keeping such arrays on the spare list instead would stop the
#: threshold from rising, and every temporary of their size would then be fresh memory (measured: the
#: n = 100 000 TGP-UCB step at 1.3x its time). GPs keep their work arrays as spares only from this size up.
SPARE_MIN_BYTES = 32 << 20

#: Where ``spill="auto"`` factors without their own ``spill_directory`` go (the modeler sets its data dir's
#: ``factor-spill`` at start-up: ``set_default_spill_directory``). None: such factors stay in memory.
_default_spill_directory: Path | None = None

_spares: list[FloatArray] = []
_spares_lock = threading.Lock()


def give_back(blocks: list[FloatArray]) -> None:
    """Keep released in-memory arrays (a factor's blocks, a GP's work arrays) for reuse, up to
    ``SPARE_LIMIT_BYTES`` in all (newest kept)."""
    with _spares_lock:
        _spares.extend(b for b in blocks if not isinstance(b, np.memmap))
        while sum(b.nbytes for b in _spares) > SPARE_LIMIT_BYTES:
            _spares.pop(0)


def take_spare(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    """A kept array of exactly this shape and dtype (its contents are stale), or None."""
    with _spares_lock:
        for k, block in enumerate(_spares):
            if block.shape == shape and block.dtype == dtype:
                return _spares.pop(k)
    return None


def set_default_spill_directory(directory: str | Path | None) -> None:
    """Memory-map the blocks that do not fit in memory into ``directory`` (created, mode 0700) for every
    factor that names no ``spill_directory`` of its own; None turns it off. Per process."""
    global _default_spill_directory
    if directory is not None:
        Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
    _default_spill_directory = Path(directory) if directory is not None else None


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo (Linux), or None where that is not available."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class FactorRows:
    """Rows of A [t, n] in blocks of ``block_rows`` rows; row ``t`` is filled in place, then ``commit``-ted.

    ``spill``: ``"auto"`` memory-maps a block into ``spill_directory`` only when it would not fit in memory,
    ``"always"`` memory-maps every block (``spill_directory`` or the system temporary directory), ``"never"``
    keeps every block in memory.

    ``dtype`` float32 stores the rows rounded to single precision (half the bytes to read per step) and
    forms ``x^T A`` with single-precision BLAS (``sgemv``); the caller works in float64 on a copy of each row
    and stores it rounded (``shared.bo.gp``). The default float64 is exact.
    """

    def __init__(
        self,
        n: int,
        *,
        block_rows: int = BLOCK_ROWS,
        spill: Literal["auto", "always", "never"] = "auto",
        spill_directory: str | Path | None = None,
        dtype: type[np.floating[Any]] = np.float64,
        reuse: bool = True,
    ) -> None:
        self.n = int(n)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise ValueError(f"the factor is float64 or float32, not {self.dtype}")
        self._g: Any = None  # project()'s result buffer
        self.block_rows = int(block_rows)
        self.spill = spill
        self.spill_directory = Path(spill_directory) if spill_directory is not None else None
        self._blocks: list[FloatArray] = []
        self._files: list[IO[bytes]] = []
        self.t = 0
        self.reuse = reuse
        if reuse:
            weakref.finalize(self, give_back, self._blocks)

    # -- storage ---------------------------------------------------------------------------------------
    @property
    def memory_mapped_blocks(self) -> int:
        return len(self._files)

    def _spills(self, nbytes: int) -> bool:
        if self.spill == "always":
            return True
        if self.spill == "never" or self._directory() is None:
            return False
        available = available_memory_bytes()
        return available is not None and nbytes > available - SPILL_MARGIN_BYTES

    def _directory(self) -> Path | None:
        return self.spill_directory if self.spill_directory is not None else _default_spill_directory

    def _new_block(self) -> FloatArray:
        shape = (self.block_rows, self.n)
        nbytes = self.dtype.itemsize * self.block_rows * self.n
        if not self._spills(nbytes):
            spare = take_spare(shape, self.dtype) if self.reuse else None
            return spare if spare is not None else np.empty(shape, dtype=self.dtype)
        fh = tempfile.TemporaryFile(dir=self._directory())  # noqa: SIM115 - closed in release()
        fh.truncate(nbytes)
        self._files.append(fh)
        block: FloatArray = np.memmap(fh, dtype=self.dtype, mode="r+", shape=shape)
        return block

    def view(self) -> FactorRows:
        """Another factor over the same blocks with its own row count (a later version of a partition,
        ``shared.bo.partition``): rows are only ever appended, so each reads only rows below its own t. Only
        for factors made with ``reuse=False`` (no block goes back to the spare list while a view holds it)."""
        if self.reuse:
            raise ValueError("a factor whose blocks go back to the spare list has no views")
        other = object.__new__(FactorRows)
        other.__dict__.update(self.__dict__)
        other._g = None
        return other

    def clear(self) -> None:
        """Forget every row (t = 0); the blocks stay allocated for the rows written next (a refit's rebuild
        reuses them instead of faulting in fresh memory)."""
        self.t = 0

    def release(self) -> None:
        """Give every block up (in-memory ones to the spare list; memory-mapped files are closed)."""
        give_back(self._blocks)
        self._blocks.clear()
        for fh in self._files:
            fh.close()
        self._files.clear()
        self.t = 0

    def next_row(self) -> FloatArray:
        """Row ``t`` [n] (a view into its block, allocating the block when needed), to be filled in place."""
        b, r = divmod(self.t, self.block_rows)
        if b == len(self._blocks):
            self._blocks.append(self._new_block())
        row: FloatArray = self._blocks[b][r]
        return row

    def commit(self) -> None:
        """Row ``t`` (from ``next_row``) is complete: t grows by one."""
        self.t += 1

    def _used(self) -> list[FloatArray]:
        """The filled part of every block: views [rows_b, n] in order, covering rows 0..t-1."""
        out, left = [], self.t
        for block in self._blocks:
            if left <= 0:
                break
            out.append(block[: min(left, self.block_rows)])
            left -= self.block_rows
        return out

    def load(self, A: FloatArray) -> None:
        """Replace the contents with the rows of A [t, n] (a batch rebuild)."""
        self.clear()
        for row in A:
            self.next_row()[:] = row
            self.commit()

    # -- products --------------------------------------------------------------------------------------
    def project_columns(
        self, x: npt.NDArray[Any], s: slice, out: npt.NDArray[Any], tmp: npt.NDArray[Any]
    ) -> None:
        """``out <- x^T A[:, s]`` in the factor's precision (float32: single-precision sums, as ``sgemv``): x
        [t] and the buffers out, tmp [len(s)] of the factor's dtype; one BLAS gemv per block over its columns
        s (``tmp`` holds a block's part before it is added). The GP's step calls it chunk by chunk inside its
        pass over n, so the product of a chunk is used while it is in cache. t = 0: zeros."""
        start = 0
        for block in self._used():
            rows = block.shape[0]
            if start == 0:
                np.matmul(x[:rows], block[:, s], out=out)
            else:
                np.matmul(x[start : start + rows], block[:, s], out=tmp)
                np.add(out, tmp, out=out)
            start += rows
        if start == 0:
            out.fill(0.0)

    def gemv_into(self, x: FloatArray, y: FloatArray, *, alpha: float, beta: float) -> None:
        """``y <- beta y + alpha x^T A`` in place, x [t], y [n] float64 (contiguous), float64 factor: one
        BLAS dgemv per block, each reading its rows once (the first block applies ``beta``; with t = 0,
        ``y <- beta y``)."""
        from scipy.linalg.blas import dgemv

        if self.dtype != np.float64:
            raise ValueError("gemv_into needs a float64 factor; a float32 one uses project()")
        start, scale = 0, float(beta)
        for block in self._used():
            rows = block.shape[0]
            dgemv(float(alpha), block.T, x[start : start + rows], beta=scale, y=y, overwrite_y=1)
            start, scale = start + rows, 1.0
        if start == 0 and scale != 1.0:
            y *= scale

    def project(self, x: npt.NDArray[Any]) -> Any:
        """``x^T A`` [n] over all n in the factor's precision (float32: sgemv, single-precision sums), x [t]
        of the factor's dtype: one BLAS call per block accumulating into a buffer reused by the next call
        (its threads stay busy for the whole product); None when t = 0."""
        from scipy.linalg.blas import dgemv, sgemv

        blocks = self._used()
        if not blocks:
            return None
        if self._g is None:
            self._g = np.empty(self.n, dtype=self.dtype)
        gemv = sgemv if self.dtype == np.float32 else dgemv
        g, start = self._g, 0
        for block in blocks:
            rows = block.shape[0]
            gemv(1.0, block.T, x[start : start + rows], beta=0.0 if start == 0 else 1.0, y=g, overwrite_y=1)
            start += rows
        return g

    def columns(self, indices: npt.NDArray[np.int64]) -> FloatArray:
        """``A[:, indices]`` [t, p] (float64)."""
        parts = [block[:, indices] for block in self._used()]
        return np.concatenate(parts, axis=0).astype(np.float64) if parts else np.empty((0, indices.size))

    def gram_columns(self, columns: FloatArray) -> FloatArray:
        """``C^T A`` [p, n] for ``C`` = some candidates' columns of the factor [t, p] (``columns``, float64),
        block by block as ``gram_rows`` (the same products when C = ``A[:, indices]``: a partition of a
        distributed GP given the columns of candidates held by other partitions, ``shared.bo.dask_gp``)."""
        out = np.zeros((columns.shape[1], self.n))
        start = 0
        for block in self._used():
            rows = block.shape[0]
            out += columns[start : start + rows].T @ np.asarray(block, dtype=np.float64)
            start += rows
        return out

    def gram_rows(self, indices: npt.NDArray[np.int64]) -> FloatArray:
        """``A[:, indices]^T A`` [p, n], block by block (in float64 whatever the storage)."""
        out = np.zeros((indices.size, self.n))
        for block in self._used():
            out += np.asarray(block[:, indices].T, dtype=np.float64) @ np.asarray(block, dtype=np.float64)
        return out
