"""Access-log retention (issue 35): old entries archived (gzip JSON lines, sha256 sidecar), then deleted;
never dropped unarchived, never archived twice. On SQLite, and on PostgreSQL with POBO_TEST_DATABASE_URL."""

from __future__ import annotations

import asyncio
import fcntl
import gzip
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from curator_service import repository as repo
from curator_service.config import Settings
from curator_service.db import Database
from curator_service.main import create_app
from curator_service.models import AccessLog
from curator_service.services import retention
from curator_service.services.retention import ArchiveError, archive_access_log, archives
from tests.curator_service.conftest import ADMIN, ADMIN_TOKEN

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings.resolved_database_url())
    database.migrate()
    yield database
    database.dispose()


def add_entries(
    db: Database, ages_days: list[float], *, ids: list[int] | None = None, now: datetime = NOW
) -> None:
    with db.session(write=True) as session:
        for i, age in enumerate(ages_days):
            entry = AccessLog(
                at=now - timedelta(days=age),
                actor="admin" if i % 2 else f"partner:{i}",
                partner_id=None if i % 2 else i,
                method="GET",
                path=f"/v1/releases/{i}",
                status_code=200 + i,
                duration_ms=1.0 / 3 + i,
            )
            if ids is not None:
                entry.id = ids[i]
            session.add(entry)
        session.commit()


def table(db: Database) -> list[dict[str, Any]]:
    """The table's entries as the archive writes them (``at`` in ISO 8601, UTC)."""
    with db.session(write=False) as session:
        entries = session.scalars(select(AccessLog).order_by(AccessLog.id)).all()
        return [
            {
                "id": e.id,
                "at": e.at.astimezone(UTC).isoformat(),
                "actor": e.actor,
                "partner_id": e.partner_id,
                "method": e.method,
                "path": e.path,
                "status_code": e.status_code,
                "duration_ms": e.duration_ms,
            }
            for e in entries
        ]


def archive_files(data_dir: Path) -> list[str]:
    directory = data_dir / "archive"
    return (
        sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
        if directory.exists()
        else []
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def run(db: Database, data_dir: Path, days: float = 30) -> retention.ArchiveResult:
    return archive_access_log(db, data_dir, older_than_days=days, now=NOW)


def test_old_entries_are_archived_exactly_then_deleted_and_a_second_run_is_a_no_op(
    db: Database, data_dir: Path
) -> None:
    add_entries(db, [40, 35, 31, 2, 30.5, 1])  # the fifth is old too, though written after a new one
    before = table(db)
    old = [e for i, e in enumerate(before) if i in (0, 1, 2, 4)]
    new = [e for i, e in enumerate(before) if i in (3, 5)]

    result = run(db, data_dir)
    first, last = old[0]["id"], old[-1]["id"]
    name = f"access-log-{first}-{last}.jsonl.gz"
    assert (result.archived, result.deleted, result.skipped) == (4, 4, False)
    assert [p.name for p in result.files] == [name]
    assert archive_files(data_dir) == [f"access-log-{first}-{last}.json", name]
    path = data_dir / "archive" / name
    assert read_rows(path) == old  # every column, exactly
    sidecar = json.loads((data_dir / "archive" / f"access-log-{first}-{last}.json").read_text())
    assert sidecar["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (sidecar["rows"], sidecar["first_id"], sidecar["last_id"], sidecar["file"]) == (
        4,
        first,
        last,
        name,
    )
    assert sidecar["before"] == (NOW - timedelta(days=30)).isoformat()
    for p in (data_dir / "archive").iterdir():
        if p.is_file():
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert table(db) == new

    again = run(db, data_dir)
    assert (again.archived, again.deleted, again.files) == (0, 0, [])
    assert archive_files(data_dir) == [f"access-log-{first}-{last}.json", name]
    assert table(db) == new


def test_a_crash_between_the_archive_and_the_delete_keeps_the_rows_and_archives_them_once(
    db: Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_entries(db, [40, 39, 38, 1])
    before = table(db)

    def crash(_session: Any, _ids: Any) -> int:
        raise RuntimeError("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(repo, "delete_access_log", crash)
        with pytest.raises(RuntimeError, match="power cut"):
            run(db, data_dir)
    assert table(db) == before  # nothing lost: the delete never happened
    first_files = archive_files(data_dir)
    assert len(first_files) == 2
    add_entries(db, [37])  # an entry that became old meanwhile
    late = table(db)[-1]

    result = run(db, data_dir)
    assert (result.archived, result.deleted) == (1, 4)  # the 3 archived ones deleted, the late one archived
    assert table(db) == [before[3]]
    names = archive_files(data_dir)
    assert len(names) == 4
    all_archived = [row for n in names if n.endswith(".gz") for row in read_rows(data_dir / "archive" / n)]
    assert sorted(all_archived, key=lambda r: r["id"]) == before[:3] + [late]  # each entry exactly once
    again = run(db, data_dir)
    assert (again.archived, again.deleted) == (0, 0)


def test_a_crash_before_the_sidecar_leaves_nothing_behind(db: Database, data_dir: Path) -> None:
    add_entries(db, [40, 39])
    ids = [e["id"] for e in table(db)]
    directory = data_dir / "archive"
    directory.mkdir(parents=True)
    # an archive renamed into place without its sidecar, and a temporary file: a run that stopped early
    (directory / f"access-log-{ids[0]}-{ids[1]}.jsonl.gz").write_bytes(b"half")
    (directory / f".access-log-{ids[0]}-{ids[1]}.json.0123456789ab.tmp").write_bytes(b"{")
    before = table(db)
    result = run(db, data_dir)
    assert (result.archived, result.deleted) == (2, 2)
    assert read_rows(directory / f"access-log-{ids[0]}-{ids[1]}.jsonl.gz") == before
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_a_damaged_archive_stops_the_run_and_deletes_nothing(
    db: Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_entries(db, [40, 39])
    with monkeypatch.context() as patch:
        patch.setattr(repo, "delete_access_log", lambda *_: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            run(db, data_dir)
    (gz,) = [p for p in (data_dir / "archive").iterdir() if p.name.endswith(".gz")]
    gz.write_bytes(gzip.compress(b'{"id": 1}\n'))
    before = table(db)
    with pytest.raises(ArchiveError, match="sha256 differs"):
        run(db, data_dir)
    assert table(db) == before


def test_an_entry_committed_late_with_a_smaller_id_is_archived_not_dropped(
    db: Database, data_dir: Path
) -> None:
    add_entries(db, [40, 39, 38, 37], ids=[1, 2, 4, 5])  # id 3: a transaction still open
    assert run(db, data_dir).archived == 4
    add_entries(db, [38.5], ids=[3])  # ... that commits now
    result = run(db, data_dir)
    assert (result.archived, result.deleted) == (1, 1)
    assert read_rows(data_dir / "archive" / "access-log-3-3.jsonl.gz")[0]["id"] == 3
    assert [a.name for a in archives(data_dir / "archive")] == [
        "access-log-1-5.jsonl.gz",
        "access-log-3-3.jsonl.gz",
    ]
    assert table(db) == []


def test_batches_make_several_archives(db: Database, data_dir: Path) -> None:
    add_entries(db, [40] * 5)
    ids = [e["id"] for e in table(db)]
    result = archive_access_log(db, data_dir, older_than_days=30, now=NOW, batch_rows=2)
    assert (result.archived, result.deleted) == (5, 5)
    assert [p.name for p in result.files] == [
        f"access-log-{ids[0]}-{ids[1]}.jsonl.gz",
        f"access-log-{ids[2]}-{ids[3]}.jsonl.gz",
        f"access-log-{ids[4]}-{ids[4]}.jsonl.gz",
    ]


def test_a_run_skips_while_another_holds_the_lock(db: Database, data_dir: Path) -> None:
    add_entries(db, [40])
    (data_dir / "archive").mkdir(parents=True)
    fd = os.open(data_dir / "archive" / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert run(db, data_dir).skipped
        assert len(table(db)) == 1
    finally:
        os.close(fd)
    assert run(db, data_dir).archived == 1


def test_the_command_reads_the_settings_from_the_environment(
    db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shared.tools.cli import app

    add_entries(db, [40, 1])  # relative to NOW, in the past: both older than a day
    monkeypatch.setenv("POBO_CURATOR_DATABASE_URL", settings.resolved_database_url())
    monkeypatch.setenv("POBO_CURATOR_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("POBO_CURATOR_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.delenv("POBO_CURATOR_ACCESS_LOG_RETENTION_DAYS", raising=False)
    runner = CliRunner()
    refused = runner.invoke(app, ["curator", "archive-access-log"])
    assert refused.exit_code == 1 and "--older-than" in refused.output
    monkeypatch.setenv("POBO_CURATOR_ACCESS_LOG_RETENTION_DAYS", "100000")
    done = runner.invoke(app, ["curator", "archive-access-log"])
    assert done.exit_code == 0, done.output
    assert "archived 0 access-log entries (no new archive); deleted 0" in done.output
    done = runner.invoke(app, ["curator", "archive-access-log", "--older-than", "0"])
    assert done.exit_code == 0, done.output
    assert "archived 2 access-log entries (access-log-" in done.output and "deleted 2" in done.output
    assert table(db) == []


@pytest.mark.anyio
async def test_the_api_lists_what_remains(client: httpx.AsyncClient, app: Any, data_dir: Path) -> None:
    for _ in range(3):
        await client.get("/v1/datasets", headers=ADMIN)
    db = app.state.components.db
    result = archive_access_log(db, data_dir, older_than_days=0)
    assert result.archived == 3
    assert (await client.get("/v1/access-log", headers=ADMIN)).json()["count"] == 0
    log = (await client.get("/v1/access-log", headers=ADMIN)).json()  # the previous read, logged after it
    assert [e["path"] for e in log["entries"]] == ["/v1/access-log"]


@pytest.mark.anyio
async def test_the_serving_process_archives_at_start_up(settings: Settings, data_dir: Path) -> None:
    app = create_app(settings.model_copy(update={"access_log_retention_days": 30}))
    db = app.state.components.db
    add_entries(db, [400, 1], ids=[1, 2], now=datetime.now(UTC))
    try:
        async with app.router.lifespan_context(app):
            for _ in range(200):
                if len(table(db)) == 1:
                    break
                await asyncio.sleep(0.05)
            assert [e["id"] for e in table(db)] == [2]
        assert archive_files(data_dir) == ["access-log-1-1.json", "access-log-1-1.jsonl.gz"]
    finally:
        db.dispose()


# the archives are copied the same way whatever the database: tested on SQLite only
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_backup_holds_the_archives(
    db: Database, settings: Settings, data_dir: Path, tmp_path: Path
) -> None:
    from shared.tools.backup import backup
    from shared.tools.restore import restore

    add_entries(db, [40, 1])
    run(db, data_dir)
    names = archive_files(data_dir)
    manifest = backup("curator", settings, tmp_path / "snapshot")
    assert {f"data/archive/{n}" for n in names} <= set(manifest["files"])
    assert not [f for f in manifest["files"] if "/." in f]  # neither the lock nor a temporary file
    fresh = settings.model_copy(
        update={"data_dir": tmp_path / "restored", "database_url": f"sqlite:///{tmp_path / 'restored.db'}"}
    )
    restore("curator", fresh, tmp_path / "snapshot")
    assert archive_files(tmp_path / "restored") == names
