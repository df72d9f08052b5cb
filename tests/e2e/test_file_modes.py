"""Issue 12, item 6, on real service processes: everything both services write to their data dirs is private
(directories 0700, files 0600: arrays, SQLite databases with their WAL and SHM files, tokens, keys, the
throttle's and the writer turns' files), and an existing data dir open to others is reported at start-up."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from shared.processes import ServiceProcess, curator_env, free_port
from tests.e2e.conftest import SQLITE_ONLY, Services
from tests.e2e.test_two_party import FIXED_HP, setup_release, study_body

pytestmark = pytest.mark.slow


def _open_to_others(root: Path) -> list[str]:
    loose = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            loose.append(f"{path.relative_to(root.parent)} {mode:o}")
    return loose


@SQLITE_ONLY  # the files of a SQLite database are the ones to check
def test_every_file_the_services_write_is_private(services: Services) -> None:
    _, release, partner = setup_release(services, max_queries=10)
    with services.modeler_http() as http:
        study = http.post("/v1/studies", json=study_body(services, release, partner, 3, FIXED_HP))
        assert study.status_code == 201, study.text
        for _ in range(3):
            assert http.post(f"/v1/studies/{study.json()['id']}/step").status_code == 200
    written = list((services.tmp / "curator").rglob("*.npy")) + list(
        (services.tmp / "modeler").rglob("*.npy")
    )
    assert len(written) >= 4  # features, outcomes, the release, the modeler's copy of it
    if services.curator_db is None:
        assert list((services.tmp / "curator").glob("*.db-wal"))  # SQLite's write-ahead log is there too
    for data_dir in (services.tmp / "curator", services.tmp / "modeler"):
        assert _open_to_others(data_dir) == []


def test_a_data_dir_open_to_others_is_reported(tmp_path: Path) -> None:
    data_dir = tmp_path / "curator"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)
    log = tmp_path / "curator.log"
    env = curator_env(data_dir, "admin-token-0123456789abcdef0123456789")
    with ServiceProcess("curator", port=free_port(), env=env, log_path=log) as curator:
        curator.wait_healthy()
    text = log.read_text(errors="replace")
    assert "has mode 755: other users of this machine may read what it holds" in text
    assert f"chmod 700 {data_dir}" in text
    assert [p for p in _open_to_others(data_dir) if not p.startswith("curator ")] == []  # files: still 0600


def test_a_service_whose_port_another_service_holds_is_not_healthy(tmp_path: Path) -> None:
    """The test harness's own guard: ``free_port`` cannot reserve a port, so two services started at once
    can pick the same one. The one that fails to bind must not be reported healthy because the other's
    ``/healthz`` answers on that port (a test would then talk to the wrong service)."""
    token = "admin-token-0123456789abcdef0123456789"
    port = free_port()
    env = curator_env(tmp_path / "first", token)
    with ServiceProcess("curator", port=port, env=env, log_path=tmp_path / "first.log") as first:
        first.wait_healthy()
        env = curator_env(tmp_path / "second", token)
        with ServiceProcess("curator", port=port, env=env, log_path=tmp_path / "second.log") as second:
            with pytest.raises(RuntimeError, match="the curator exited with code"):
                second.wait_healthy()
