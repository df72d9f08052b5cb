"""Array storage: float64 .npy files in the data dir, written atomically, verified by sha256 on read.

Every file is written under a temporary name in its final directory, fsynced, then renamed (and the
directory fsynced), so a reader sees either the whole file or nothing. The database row that refers to a
file is committed only after the rename; if that commit fails the caller deletes the file
(``ArrayStore.delete``), and ``ArrayStore.sweep`` removes any leftover of a crash at start-up.

Paths stored in the database are relative to the data dir, so the data dir can be moved as a whole.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import numpy.typing as npt

from curator_service.exceptions import StorageCorrupted
from shared.files import fsync_dir

logger = logging.getLogger(__name__)

_TMP_MARK = ".tmp-"
#: Fixed size of the .npy header we write when streaming (the shape is patched in at the end).
_STREAM_HEADER_BYTES = 128
_HASH_CHUNK = 8 * 2**20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _npy_header(shape: tuple[int, ...], total: int | None = None) -> bytes:
    """A version 1.0 .npy header for a C-ordered little-endian float64 array, padded to ``total`` bytes."""
    shape_txt = f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(str(s) for s in shape) + ")"
    body = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape_txt}, }}"
    size = total if total is not None else -(-(10 + len(body) + 1) // 64) * 64
    pad = size - 10 - len(body) - 1
    if pad < 0:
        raise ValueError(f"shape {shape} does not fit a {size}-byte .npy header")
    header = (body + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


class _HashingWriter:
    """File-like wrapper that hashes what it writes (lets ``np.save`` stream into a sha256)."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.hash = hashlib.sha256()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.hash.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


class NpyStreamWriter:
    """Appends row blocks to a float64 .npy whose length is unknown in advance.

    Usage: ``append(block)`` any number of times, ``finish()`` (writes the real shape), optionally edit the
    temporary file through ``open_memmap()`` (e.g. a scaling pass), then ``commit()`` (fsync, hash, rename)
    or ``abort()``.
    """

    def __init__(self, final_path: Path, ncols: int | None) -> None:
        self.final_path = final_path
        self.tmp_path = final_path.with_name(final_path.name + _TMP_MARK + uuid.uuid4().hex)
        self.ncols = ncols
        self.rows = 0
        self._fh: BinaryIO | None = _open_private(self.tmp_path)
        self._fh.write(b"\0" * _STREAM_HEADER_BYTES)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rows,) if self.ncols is None else (self.rows, self.ncols)

    def append(self, block: npt.NDArray[np.float64]) -> None:
        assert self._fh is not None, "writer already finished"
        block = np.ascontiguousarray(block, dtype="<f8")
        expected = 1 if self.ncols is None else 2
        if block.ndim != expected or (self.ncols is not None and block.shape[1] != self.ncols):
            raise ValueError(f"block shape {block.shape} does not match columns {self.ncols}")
        self._fh.write(block.data.cast("B"))
        self.rows += block.shape[0]

    def finish(self) -> None:
        if self._fh is None:
            return
        self._fh.seek(0)
        self._fh.write(_npy_header(self.shape, _STREAM_HEADER_BYTES))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None

    def open_memmap(self) -> np.memmap:
        self.finish()
        return cast(np.memmap, np.load(self.tmp_path, mmap_mode="r+"))

    def commit(self) -> str:
        """fsync, hash and rename into place; returns the sha256 of the final file."""
        self.finish()
        with open(self.tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        digest = sha256_file(self.tmp_path)
        os.replace(self.tmp_path, self.final_path)
        fsync_dir(self.final_path.parent)
        return digest

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self.tmp_path.unlink(missing_ok=True)


def _open_private(path: Path) -> BinaryIO:
    """A new file for writing, mode 0600 whatever the process's umask (it holds raw rows)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")


#: Read-only maps an ``ArrayStore`` keeps for reuse (each costs an open file and address space, no memory).
MAPPED_ARRAYS = 32
#: How often (seconds, at most) ``load`` drops kept maps of files deleted meanwhile, e.g. by another worker
#: process: a map keeps an unlinked file's disk space until it is closed.
UNLINKED_CHECK_SECONDS = 10.0
#: Resolved paths an ``ArrayStore`` remembers (forgotten all at once beyond this many).
_RESOLVED_PATHS = 4096


class ArrayStore:
    """The data dir's ``arrays/`` tree: ``datasets/<uuid>-features.npy``, ``releases/<uuid>-z.npy``, ..."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.root = self.data_dir / "arrays"
        for sub in ("datasets", "releases"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        self._verified: dict[str, tuple[int, int, str]] = {}
        self._resolved: dict[str, Path] = {}
        self._mapped: dict[str, tuple[tuple[int, int, str], np.memmap]] = {}
        self._lock = threading.Lock()
        self._unlinked_checked = time.monotonic()

    # -- names
    def new_relpath(self, kind: str, suffix: str) -> str:
        return f"arrays/{kind}/{uuid.uuid4().hex}-{suffix}.npy"

    def abspath(self, relpath: str) -> Path:
        """The absolute path of a stored array, which must lie inside the data dir. Resolved once per
        ``relpath`` (each query reads its outcome through here; resolving walks every component)."""
        path = self._resolved.get(relpath)
        if path is not None:
            return path
        path = (self.data_dir / relpath).resolve()
        if self.data_dir not in path.parents:
            raise StorageCorrupted("a stored array path points outside the data directory")
        with self._lock:
            if len(self._resolved) >= _RESOLVED_PATHS:
                self._resolved.clear()
            self._resolved[relpath] = path
        return path

    # -- writing
    def stream_writer(self, relpath: str, ncols: int | None) -> NpyStreamWriter:
        return NpyStreamWriter(self.abspath(relpath), ncols)

    def save(self, relpath: str, array: npt.NDArray[Any], *, dtype: str | None = "<f8") -> str:
        """Atomically write ``array`` as .npy (as float64, or in its own dtype with ``dtype=None``: the
        sample ids' fixed-width bytes); returns the file's sha256."""
        final = self.abspath(relpath)
        tmp = final.with_name(final.name + _TMP_MARK + uuid.uuid4().hex)
        try:
            with _open_private(tmp) as fh:
                writer = _HashingWriter(fh)
                np.save(writer, np.ascontiguousarray(array, dtype=dtype), allow_pickle=False)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            fsync_dir(final.parent)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        digest = writer.hash.hexdigest()
        self._remember(final, digest)
        return digest

    def delete(self, relpath: str | None) -> None:
        if not relpath:
            return
        path = self.abspath(relpath)
        with self._lock:
            self._verified.pop(str(path), None)
            self._mapped.pop(str(path), None)
        path.unlink(missing_ok=True)

    def committed(self, relpath: str, sha256: str) -> None:
        """Record the digest a stream writer computed when it committed ``relpath`` (its first read then
        needs no second hashing pass)."""
        self._remember(self.abspath(relpath), sha256)

    # -- reading
    def _remember(self, path: Path, digest: str) -> None:
        st = path.stat()
        with self._lock:
            self._verified[str(path)] = (st.st_size, st.st_mtime_ns, digest)

    def verify(self, relpath: str, sha256: str) -> Path:
        """The file's path after checking its sha256 (cached per process while size and mtime hold)."""
        path = self.abspath(relpath)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise StorageCorrupted(
                "a stored array is missing from the data directory; restore the data dir from a backup"
            ) from None
        with self._lock:
            cached = self._verified.get(str(path))
        if cached == (st.st_size, st.st_mtime_ns, sha256):
            return path
        digest = sha256_file(path)
        if digest != sha256:
            logger.error("integrity check failed for %s", relpath)
            raise StorageCorrupted(
                "a stored array failed its sha256 integrity check (the file was altered or damaged); "
                "restore the data dir from a backup"
            )
        self._remember(path, digest)
        return path

    def load(self, relpath: str, sha256: str) -> np.memmap:
        """Memory-map a verified array read-only. The map is kept (the last ``MAPPED_ARRAYS``) and handed out
        again while the file's size, mtime and hash are the ones verified: a query reads one outcome
        without parsing the file's header and mapping it again."""
        path = self.verify(relpath, sha256)
        if time.monotonic() - self._unlinked_checked >= UNLINKED_CHECK_SECONDS:
            self._drop_unlinked()
        with self._lock:
            verified = self._verified.get(str(path))
            mapped = self._mapped.get(str(path))
        if mapped is not None and verified is not None and mapped[0] == verified:
            return mapped[1]
        array = cast(np.memmap, np.load(path, mmap_mode="r", allow_pickle=False))
        if verified is not None:
            with self._lock:
                self._mapped.pop(str(path), None)
                self._mapped[str(path)] = (verified, array)
                while len(self._mapped) > MAPPED_ARRAYS:
                    del self._mapped[next(iter(self._mapped))]  # the least recently mapped
        return array

    def _drop_unlinked(self) -> None:
        """Forget the kept maps (and verifications) of files that no longer exist: another worker process
        deleted their dataset or release. Closing the map frees the unlinked file's disk space."""
        self._unlinked_checked = time.monotonic()
        with self._lock:
            kept = list(self._mapped)
        gone = [name for name in kept if not os.path.exists(name)]
        if gone:
            with self._lock:
                for name in gone:
                    self._mapped.pop(name, None)
                    self._verified.pop(name, None)

    # -- housekeeping
    def sweep(self, referenced: set[str], min_age_seconds: float = 3600.0) -> int:
        """Delete temporaries and unreferenced arrays older than ``min_age_seconds`` (crash leftovers)."""
        now = time.time()
        removed = 0
        for path in self.root.rglob("*"):
            if not path.is_file():
                continue
            rel = path.relative_to(self.data_dir).as_posix()
            if rel in referenced:
                continue
            try:
                if now - path.stat().st_mtime < min_age_seconds:
                    continue
                path.unlink()
                removed += 1
            except FileNotFoundError:  # pragma: no cover - raced with another sweeper
                continue
        if removed:
            logger.info("removed %d orphaned array file(s) from the data dir", removed)
        return removed
