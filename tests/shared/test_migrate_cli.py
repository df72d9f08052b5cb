"""``pobo curator|modeler migrate [--to REVISION]``: the rollback procedure of docs/deployment.md, on a copy.

A service's database is created at head (SQLite, settings from the environment as ``serve`` reads them),
copied with SQLite's backup API, and the *copy* is downgraded to an earlier revision and upgraded back with
the command; the original is untouched throughout. A downgrade a migration refuses is reported with the
migration's message and changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shared.tools.cli import app

SERVICES = [("curator", "0009", "0005"), ("modeler", "0009", "0003")]


def _clear_pobo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("POBO_"):
            monkeypatch.delenv(key)


def _migrate(service: str, data_dir: Path, *args: str) -> tuple[int, str]:
    env = {f"POBO_{service.upper()}_DATA_DIR": str(data_dir), "COLUMNS": "200"}
    result = CliRunner(env=env).invoke(app, [service, "migrate", *args])
    return result.exit_code, result.output


def _revision(db: Path, service: str) -> str | None:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(f"SELECT version_num FROM alembic_version_{service}").fetchall()
    conn.close()
    return rows[0][0] if rows else None


def _columns(db: Path, table: str) -> set[str]:
    with sqlite3.connect(db) as conn:
        names = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    conn.close()
    return names


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True)
    with sqlite3.connect(src) as source, sqlite3.connect(dst) as target:
        source.backup(target)
    source.close()
    target.close()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(("service", "head", "earlier"), SERVICES)
def test_downgrade_and_upgrade_a_copy_leave_the_original_untouched(
    service: str, head: str, earlier: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_pobo_env(monkeypatch)
    original_dir, copy_dir = tmp_path / "original", tmp_path / "copy"
    original_dir.mkdir()
    original = original_dir / f"{service}.db"

    code, out = _migrate(service, original_dir, "--to", "head")
    assert code == 0, out
    assert f"upgraded: the {service} database is now at {head} (head)" in out
    assert _revision(original, service) == head
    before = _sha256(original)

    copy = copy_dir / f"{service}.db"
    _copy(original, copy)
    assert _revision(copy, service) == head

    # Without --to: where the database stands, nothing changed.
    code, out = _migrate(service, copy_dir)
    assert code == 0, out
    assert f"current revision: {head} (head)" in out and f"head of this pobo: {head}" in out

    code, out = _migrate(service, copy_dir, "--to", earlier)
    assert code == 0, out
    assert f"current revision: {head} (head)" in out and f"target revision:  {earlier}" in out
    assert f"downgraded: the {service} database is now at {earlier}" in out
    assert f"pobo {service} serve` upgrades it to {head} again" in out
    assert _revision(copy, service) == earlier
    if service == "curator":  # 0009 added erased_at; 0006 and later are gone too
        assert "erased_at" not in _columns(copy, "curator_datasets")

    code, out = _migrate(service, copy_dir, "--to", earlier)
    assert code == 0 and "nothing to do" in out, out

    code, out = _migrate(service, copy_dir, "--to", "head")
    assert code == 0, out
    assert f"upgraded: the {service} database is now at {head} (head)" in out
    assert _revision(copy, service) == head
    if service == "curator":
        assert "erased_at" in _columns(copy, "curator_datasets")

    # The original was never opened for writing.
    assert _sha256(original) == before and _revision(original, service) == head


def test_unknown_revision_is_refused_with_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _clear_pobo_env(monkeypatch)
    code, out = _migrate("curator", tmp_path, "--to", "head")
    assert code == 0, out
    code, out = _migrate("curator", tmp_path, "--to", "0042")
    assert code == 1
    assert "--to '0042' is not one revision of the curator's migrations; use one of 0001, 0002" in out
    assert _revision(tmp_path / "curator.db", "curator") == "0009"


def test_a_downgrade_the_migration_refuses_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Curator migration 0009 refuses to go below itself once a dataset is erased (the older schema would
    take it for a live one): the command says so, exits 1, and the database stays at head."""
    _clear_pobo_env(monkeypatch)
    code, out = _migrate("curator", tmp_path, "--to", "head")
    assert code == 0, out
    db = tmp_path / "curator.db"
    with sqlite3.connect(db) as conn:
        # A dataset row with neutral values of each column's type, erased.
        values: dict[str, object] = {}
        for _, name, kind, notnull, default, _ in conn.execute("PRAGMA table_info(curator_datasets)"):
            if notnull and default is None:
                upper = str(kind).upper()
                numeric = any(t in upper for t in ("INT", "BOOL", "DOUBLE", "FLOAT", "REAL", "NUMERIC"))
                values[name] = 0 if numeric else ("2026-01-01 00:00:00" if "DATE" in upper else "x")
        values.update(id=7, erased_at="2026-02-01 00:00:00")
        conn.execute(
            f"INSERT INTO curator_datasets ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
            list(values.values()),
        )
    conn.close()
    before = _sha256(db)

    code, out = _migrate("curator", tmp_path, "--to", "0008")
    assert code == 1
    assert "the downgrade to 0008 failed and was rolled back (the database is still at 0009 (head))" in out
    assert "dataset(s) 7 were erased" in out and "Restore a backup taken before the upgrade instead." in out
    assert _revision(db, "curator") == "0009" and "erased_at" in _columns(db, "curator_datasets")
    assert _sha256(db) == before
