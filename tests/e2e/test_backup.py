"""Issue 35: ``pobo curator|modeler backup DIR`` while a study runs, ``restore DIR`` into fresh data dirs (and
an empty database), then both hash chains verify, the study resumes and ``pobo reconcile`` is OK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from shared.processes import ServiceProcess, curator_env, modeler_env
from shared.tools.backup import backup, load_settings
from shared.tools.reconcile import reconcile
from tests.e2e.conftest import Services, write_csv
from tests.e2e.test_restart import wait_iterations
from tests.e2e.test_two_party import setup_release, study_body, wait_status

pytestmark = pytest.mark.slow

#: MLE hyper-parameters (refits each round): a run long enough to outlast both backups.
ITERATIONS = 80


def pobo(service: ServiceProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``pobo <kind> <args>`` with the service's settings in the environment (as ``serve`` has them)."""
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "shared.tools.cli", service.kind, *args],
        env={**os.environ, **service.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _recreate_schema(url: str) -> None:
    """Drop the test's schema (both services' tables) and create it again, empty: the empty database."""
    engine = create_engine(url)
    with engine.begin() as conn:
        schema = conn.execute(text("SELECT current_schema()")).scalar_one()
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()


def write_csv_file(services: Services) -> Path:
    path = services.tmp / "data.csv"
    write_csv(path)
    return path


def in_process_backup(monkeypatch: pytest.MonkeyPatch, service: ServiceProcess, target: Path) -> None:
    """``pobo <kind> backup target`` in this process (the command's start-up would outlast a short run; the
    command line itself is tested below): the service's settings from the environment, as ``serve``."""
    with monkeypatch.context() as env:
        for name, value in service.env.items():
            env.setenv(name, value)
        backup(service.kind, load_settings(service.kind), target)


def test_backup_while_running_restore_resume_reconcile(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, release, partner = setup_release(services, max_queries=ITERATIONS)  # a quota with no slack
    with services.modeler_http() as http:
        body = study_body(services, release, partner, ITERATIONS)
        study_id = http.post("/v1/studies", json=body).json()["id"]
        assert http.post(f"/v1/studies/{study_id}/run").status_code == 202
        wait_iterations(http, [study_id], 5)

        # The modeler first, then the curator: the curator's snapshot holds every query the modeler's does.
        backups = services.tmp / "backups"
        for service in (services.modeler, services.curator):
            in_process_backup(monkeypatch, service, backups / service.kind)
        running = http.get(f"/v1/studies/{study_id}").json()
    assert running["status"] == "running" and running["iterations_done"] < ITERATIONS  # taken online

    curator_manifest = json.loads((backups / "curator" / "manifest.json").read_text())
    modeler_manifest = json.loads((backups / "modeler" / "manifest.json").read_text())
    assert curator_manifest["service"] == "curator" and curator_manifest["alembic_revision"]
    assert any(f.startswith("data/arrays/releases/") for f in curator_manifest["files"])
    assert any(f.startswith("data/arrays/datasets/") for f in curator_manifest["files"])
    assert f"data/releases/study-{study_id}.npy" in modeler_manifest["files"]
    assert "data/secret.key" in modeler_manifest["files"]
    assert not list(services.tmp.joinpath("backups").glob(".*tmp*"))  # no staging directory left

    services.modeler.stop()
    services.curator.stop()

    # Restore into fresh data dirs (and, on PostgreSQL, the emptied schema), on the same ports.
    restored = services.tmp / "restored"
    database_url = services.curator_db
    if database_url is not None:
        _recreate_schema(database_url)
    curator = ServiceProcess(
        "curator",
        port=services.curator.port,
        env=curator_env(restored / "curator", services.admin_token, database_url),
        log_path=services.tmp / "curator-restored.log",
    )
    modeler = ServiceProcess(
        "modeler",
        port=services.modeler.port,
        env=modeler_env(restored / "modeler", services.modeler_token, database_url),
        log_path=services.tmp / "modeler-restored.log",
    )
    for service in (curator, modeler):
        done = pobo(service, "restore", str(backups / service.kind))
        assert done.returncode == 0, done.stderr
        # ... and only once: the data dir is no longer empty
        again = pobo(service, "restore", str(backups / service.kind))
        assert again.returncode == 1 and "is not empty" in again.stderr
    assert oct((restored / "modeler" / "secret.key").stat().st_mode & 0o777) == "0o600"
    services.curator, services.modeler = curator, modeler  # the fixture stops these
    curator.start()
    modeler.start()
    curator.wait_healthy()
    modeler.wait_healthy()

    with services.admin() as admin:
        assert admin.verify_queries(release.id).ok
        charged = len(admin.list_queries(release.id).queries)
    with services.modeler_http() as http:
        # Before the study resumes, the curator may hold the in-flight round's answers: reconcile lists
        # them as only in its log, and nothing else.
        early: Any = reconcile(
            curator_url=curator.url,
            curator_token=services.admin_token,
            modeler_url=modeler.url,
            modeler_token=services.modeler_token,
            study_id=study_id,
        )
        assert early.modeler_chain_ok and early.curator_chain_ok
        assert {m.kind for m in early.mismatches} <= {"only in the curator's log"}, early.mismatches
        before = http.get(f"/v1/studies/{study_id}").json()
        assert before["status"] == "ready"  # a study left running is resumable
        assert http.get(f"/v1/studies/{study_id}/audit/verify").json()["ok"]
        # The curator may hold answers the modeler has not recorded (the round in flight at its backup);
        # resuming re-sends them with the same Idempotency-Key and gets the same queries back.
        assert before["iterations_done"] <= charged
        assert http.post(f"/v1/studies/{study_id}/run").status_code == 202
        finished = wait_status(http, study_id, {"done", "failed"})
        assert finished["status"] == "done", finished["error"]
        assert finished["iterations_done"] == ITERATIONS
        assert http.get(f"/v1/studies/{study_id}/audit/verify").json()["ok"]
    with services.admin() as admin:
        assert admin.verify_queries(release.id).ok
        assert len(admin.list_queries(release.id).queries) == ITERATIONS  # nothing charged twice

    report: Any = reconcile(
        curator_url=curator.url,
        curator_token=services.admin_token,
        modeler_url=modeler.url,
        modeler_token=services.modeler_token,
        study_id=study_id,
    )
    assert report.ok, report


@pytest.mark.parametrize("services", ["sqlite"], indirect=True)
def test_restore_refuses_a_damaged_backup_and_a_used_data_dir(services: Services) -> None:
    with services.admin() as admin:
        dataset = admin.upload_dataset(write_csv_file(services), name="b", objective="objective")
    backup = services.tmp / "curator-backup"
    done = pobo(services.curator, "backup", str(backup))
    assert done.returncode == 0, done.stderr
    again = pobo(services.curator, "backup", str(backup))  # never over an existing snapshot
    assert again.returncode == 1 and "not empty" in again.stderr

    # into the running curator's own (non-empty) data dir: refused, nothing touched
    refused = pobo(services.curator, "restore", str(backup))
    assert refused.returncode == 1 and "is not empty" in refused.stderr
    # the other service's snapshot: refused
    target = services.tmp / "fresh"
    wrong = pobo(
        ServiceProcess("modeler", port=0, env=modeler_env(target, "x" * 32), log_path=target),
        "restore",
        str(backup),
    )
    assert wrong.returncode == 1 and "pobo curator restore" in wrong.stderr
    # a damaged array file: refused before anything is written
    manifest = json.loads((backup / "manifest.json").read_text())
    array = next(f for f in manifest["files"] if f.startswith("data/arrays/"))
    path = backup / array
    original = path.read_bytes()
    path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    fresh = ServiceProcess(
        "curator", port=0, env=curator_env(target, services.admin_token), log_path=services.tmp / "x.log"
    )
    damaged = pobo(fresh, "restore", str(backup))
    assert damaged.returncode == 1 and "damaged" in damaged.stderr and array in damaged.stderr
    assert not target.exists()
    # repaired, into an existing empty directory (a mount point cannot be replaced: filled in place)
    path.write_bytes(original)
    target.mkdir(mode=0o700)
    restored = pobo(fresh, "restore", str(backup))
    assert restored.returncode == 0, restored.stderr
    expected = {f.removeprefix("data/") for f in manifest["files"] if f.startswith("data/")}
    assert {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()} == {
        *expected,
        "curator.db",
    }

    # An erased dataset keeps its paths (a tombstone) but its files are gone: the backup leaves them out.
    with httpx.Client(
        base_url=services.curator.url, headers={"Authorization": f"Bearer {services.admin_token}"}
    ) as http:
        assert http.delete(f"/v1/datasets/{dataset.id}", params={"force": "true"}).status_code < 300
    after = pobo(services.curator, "backup", str(services.tmp / "after-erasure"))
    assert after.returncode == 0, after.stderr
    kept = json.loads((services.tmp / "after-erasure" / "manifest.json").read_text())["files"]
    assert not [f for f in kept if f.startswith("data/arrays/")]
