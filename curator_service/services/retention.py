"""Retention of the access log (setting ``access_log_retention_days``): old entries are archived, then
deleted; never dropped unarchived.

An entry written before the cut-off (now minus the retention) goes, in batches of at most
:data:`BATCH_ROWS` by id, to ``<data_dir>/archive/access-log-<first id>-<last id>.jsonl.gz``: gzip, one
JSON object per entry (its columns: ``id, at, actor, partner_id, method, path, status_code,
duration_ms``), mode 0600. Beside it ``access-log-<first id>-<last id>.json`` (the sidecar) holds the
file's sha256, its row count, its first and last id and the cut-off. Order, so that a crash loses nothing
and archives nothing twice:

1. the archive is written to a temporary file, fsync'd, read back and checked (every id, the checksum);
2. so is the sidecar; the archive is renamed into place, then the sidecar (the sidecar is the commit
   point: an archive without one is incomplete), and the directory is fsync'd;
3. only then are exactly the archived ids deleted from the table, in one transaction.

A crash before 2 ends leaves a temporary file or an archive without a sidecar: both are removed by the
next run, and its rows, still in the table, are archived again under the same name. A crash (or a failed
delete) between 2 and 3 leaves rows that are already in a complete archive: the next run finds them (ids
up to the last archived id still in the table), reads the archives covering them, checks their checksums,
and deletes the rows those archives hold before it archives anything new, so no entry is ever in two
archives. A damaged archive (checksum) stops the run and deletes nothing.

Only exact ids are deleted, never an id range: an entry committed late with a smaller id than one already
archived (a request's transaction that took long) stays until a later run archives it.

One run at a time: an ``flock`` of ``archive/.lock`` held for the whole run, across the service's worker
processes and the ``pobo curator archive-access-log`` command; a run that finds it held skips.

The query logs' hash chains (and the modeler's audit log) are never pruned: see docs/operations.md.
"""

from __future__ import annotations

import asyncio
import bisect
import fcntl
import gzip
import hashlib
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from curator_service import repository as repo
from curator_service.config import Settings
from curator_service.db import Database
from curator_service.models import AccessLog
from shared.files import fsync_dir
from shared.servicekit.db import transaction

__all__ = [
    "ARCHIVE_DIR",
    "ArchiveError",
    "ArchiveFile",
    "ArchiveResult",
    "archive_access_log",
    "archives",
    "periodic_archiving",
    "read_archive",
]

logger = logging.getLogger("curator_service.retention")

#: The archive directory, inside the data dir.
ARCHIVE_DIR = "archive"
#: Most entries in one archive file (one read, one file, one delete transaction).
BATCH_ROWS = 50_000
#: Seconds between two runs in a serving process.
INTERVAL_SECONDS = 3600.0
LOCK_FILE = ".lock"
FORMAT = 1
_SIDECAR = re.compile(r"access-log-(\d+)-(\d+)\.json")
_ARCHIVE = re.compile(r"access-log-(\d+)-(\d+)\.jsonl\.gz")
_COLUMNS = ("id", "at", "actor", "partner_id", "method", "path", "status_code", "duration_ms")


class ArchiveError(Exception):
    """A run that cannot go on without risking an entry: nothing more was deleted; the message says why."""


@dataclass(frozen=True)
class ArchiveFile:
    """One complete archive (from its sidecar)."""

    name: str
    first_id: int
    last_id: int
    rows: int
    sha256: str


@dataclass
class ArchiveResult:
    """What one run did."""

    #: Entries written to new archive files.
    archived: int = 0
    #: Entries deleted from the table (those of interrupted runs included).
    deleted: int = 0
    #: The new archive files.
    files: list[Path] = field(default_factory=list)
    #: Another run held the lock: this one did nothing.
    skipped: bool = False


def _archive_name(first_id: int, last_id: int) -> str:
    return f"access-log-{first_id}-{last_id}.jsonl.gz"


def _sidecar_name(first_id: int, last_id: int) -> str:
    return f"access-log-{first_id}-{last_id}.json"


def _record(entry: AccessLog) -> dict[str, Any]:
    return {
        "id": entry.id,
        "at": entry.at.astimezone(UTC).isoformat(),
        "actor": entry.actor,
        "partner_id": entry.partner_id,
        "method": entry.method,
        "path": entry.path,
        "status_code": entry.status_code,
        "duration_ms": entry.duration_ms,
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_private(path: Path, data: bytes) -> None:
    """``data`` in a new file (mode 0600), fsync'd."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def read_archive(directory: Path, archive: ArchiveFile) -> list[dict[str, Any]]:
    """The entries of ``archive``, after checking its sha256 and row count against its sidecar."""
    path = directory / archive.name
    if not path.is_file():
        raise ArchiveError(f"{path} is missing but its sidecar is there: restore it from a backup")
    if _sha256(path) != archive.sha256:
        raise ArchiveError(f"{path}: sha256 differs from its sidecar (damaged): restore it from a backup")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    ids = [row["id"] for row in rows]
    if len(rows) != archive.rows or (ids and (min(ids) != archive.first_id or max(ids) != archive.last_id)):
        raise ArchiveError(f"{path}: its rows do not match its sidecar (damaged): restore it from a backup")
    return rows


def archives(directory: Path) -> list[ArchiveFile]:
    """The complete archives in ``directory`` (those with a sidecar), by first id."""
    found = []
    if not directory.is_dir():
        return []
    for path in directory.iterdir():
        match = _SIDECAR.fullmatch(path.name)
        if match is None:
            continue
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            found.append(
                ArchiveFile(
                    name=_archive_name(int(match[1]), int(match[2])),
                    first_id=int(meta["first_id"]),
                    last_id=int(meta["last_id"]),
                    rows=int(meta["rows"]),
                    sha256=str(meta["sha256"]),
                )
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArchiveError(
                f"{path} is damaged ({type(exc).__name__}): restore it from a backup"
            ) from None
    return sorted(found, key=lambda a: (a.first_id, a.last_id))


def _remove_incomplete(directory: Path) -> None:
    """Temporary files and archives without a sidecar: left by a run that stopped before its commit point
    (their entries are still in the table)."""
    for path in directory.iterdir():
        incomplete_archive = (
            _ARCHIVE.fullmatch(path.name) is not None
            and not (directory / (path.name.removesuffix(".jsonl.gz") + ".json")).exists()
        )
        if (path.name.startswith(".access-log-") and path.name.endswith(".tmp")) or incomplete_archive:
            logger.info("removing %s, left by an interrupted archive run", path.name)
            path.unlink(missing_ok=True)


def _write_archive(directory: Path, rows: Sequence[dict[str, Any]], before: datetime) -> ArchiveFile:
    """Steps 1 and 2: the archive and its sidecar, durable, checked."""
    first_id, last_id = rows[0]["id"], rows[-1]["id"]
    name, sidecar = _archive_name(first_id, last_id), _sidecar_name(first_id, last_id)
    if (directory / name).exists() or (directory / sidecar).exists():  # never overwrite an archive
        raise ArchiveError(f"{directory / name} exists already: nothing was deleted; check the archive dir")
    lines = "".join(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows)
    tag = uuid.uuid4().hex[:12]
    tmp, tmp_sidecar = directory / f".{name}.{tag}.tmp", directory / f".{sidecar}.{tag}.tmp"
    try:
        _write_private(tmp, gzip.compress(lines.encode("utf-8"), mtime=0))
        archive = ArchiveFile(name, first_id, last_id, len(rows), _sha256(tmp))
        meta = {
            "format": FORMAT,
            "file": name,
            "rows": archive.rows,
            "sha256": archive.sha256,
            "first_id": first_id,
            "last_id": last_id,
            "before": before.isoformat(),
            "archived_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        _write_private(tmp_sidecar, (json.dumps(meta, indent=1) + "\n").encode("utf-8"))
        check = ArchiveFile(tmp.name, first_id, last_id, len(rows), archive.sha256)
        if [row["id"] for row in read_archive(directory, check)] != [row["id"] for row in rows]:
            raise ArchiveError(f"{tmp}: read back, its ids differ from those written")  # pragma: no cover
        os.rename(tmp, directory / name)
        os.rename(tmp_sidecar, directory / sidecar)  # the commit point
        fsync_dir(directory)
    finally:
        tmp.unlink(missing_ok=True)
        tmp_sidecar.unlink(missing_ok=True)
    return archive


def _delete(db: Database, ids: Sequence[int]) -> int:
    """Step 3: delete exactly ``ids``, in one transaction."""
    with transaction(db, write=True) as session:
        return repo.delete_access_log(session, ids)


def _finish_interrupted(db: Database, directory: Path, index: Sequence[ArchiveFile]) -> int:
    """Delete the entries still in the table that a complete archive already holds (a run stopped between
    its archive's commit point and its delete); the number deleted."""
    if not index:
        return 0
    with db.session(write=False) as session:
        left = repo.access_log_ids_up_to(session, max(a.last_id for a in index))
    if not left:
        return 0
    still = set(left)
    archived: list[int] = []
    for archive in index:
        at = bisect.bisect_left(left, archive.first_id)
        if at < len(left) and left[at] <= archive.last_id:  # some of its range is still in the table
            archived.extend(row["id"] for row in read_archive(directory, archive) if row["id"] in still)
    if not archived:
        return 0
    deleted = _delete(db, sorted(archived))
    logger.info("deleted %d access-log entries archived by an interrupted run", deleted)
    return deleted


@contextmanager
def _exclusive(directory: Path) -> Iterator[bool]:
    """Hold the archive lock for the block (True), or yield False at once if another run holds it."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def archive_access_log(
    db: Database,
    data_dir: Path,
    *,
    older_than_days: float,
    now: datetime | None = None,
    batch_rows: int = BATCH_ROWS,
    stop: threading.Event | None = None,
) -> ArchiveResult:
    """Archive, then delete, the access-log entries written more than ``older_than_days`` before ``now``.

    ``stop``: set, the run ends after the batch in progress (a service shutting down)."""
    if older_than_days < 0 or batch_rows < 1:
        raise ValueError("older_than_days must be >= 0 and batch_rows >= 1")
    before = (now or datetime.now(UTC)) - timedelta(days=older_than_days)
    directory = data_dir / ARCHIVE_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    result = ArchiveResult()
    with _exclusive(directory) as held:
        if not held:
            result.skipped = True
            return result
        _remove_incomplete(directory)
        result.deleted += _finish_interrupted(db, directory, archives(directory))
        while stop is None or not stop.is_set():
            with db.session(write=False) as session:
                rows = [_record(e) for e in repo.access_log_before(session, before, batch_rows)]
            if not rows:
                break
            archive = _write_archive(directory, rows, before)
            result.files.append(directory / archive.name)
            result.archived += len(rows)
            result.deleted += _delete(db, [row["id"] for row in rows])
            logger.info("archived %d access-log entries to %s, then deleted them", len(rows), archive.name)
            if len(rows) < batch_rows:
                break
    return result


def archive_with_settings(settings: Settings, older_than_days: float | None = None) -> ArchiveResult:
    """``pobo curator archive-access-log``: a run on the service's database and data dir (``settings``),
    with ``older_than_days`` or else the setting ``access_log_retention_days``."""
    days = older_than_days if older_than_days is not None else settings.access_log_retention_days
    if days is None:
        raise ArchiveError(
            "no retention: pass --older-than DAYS or set POBO_CURATOR_ACCESS_LOG_RETENTION_DAYS"
        )
    db = Database(settings.resolved_database_url())
    try:
        return archive_access_log(db, settings.data_dir, older_than_days=days)
    finally:
        db.dispose()


def _describe(exc: BaseException) -> str:
    """A failure for the log: our own message, or only the type of another (no SQL, no parameters)."""
    return str(exc) if isinstance(exc, ArchiveError) else type(exc).__name__


async def _every(interval: float, run: Callable[[], ArchiveResult]) -> None:
    while True:
        try:
            result = await anyio.to_thread.run_sync(run)
            if result.skipped:
                logger.debug("access-log archiving skipped: another process is running it")
        except Exception as exc:  # noqa: BLE001 - the service keeps serving; the entries stay in the table
            logger.error(
                "archiving the access log failed (%s); its entries stay, retried later", _describe(exc)
            )
        await anyio.sleep(interval)


@asynccontextmanager
async def periodic_archiving(
    db: Database, data_dir: Path, retention_days: float | None, *, interval: float = INTERVAL_SECONDS
) -> AsyncIterator[None]:
    """For a serving process's lifespan: with a retention set, a run now and then every ``interval``
    seconds in a background task; on exit, the run in progress stops after its batch."""
    if retention_days is None:
        yield
        return
    stop = threading.Event()
    run = partial(archive_access_log, db, data_dir, older_than_days=retention_days, stop=stop)
    task = asyncio.create_task(_every(interval, run), name="access-log archiving")
    try:
        yield
    finally:
        stop.set()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
