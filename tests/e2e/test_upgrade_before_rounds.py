"""A curator and a modeler data dir written before strategies and rounds existed are upgraded in place.

``tests/data/legacy-before-rounds.tar.gz`` was written by real services with the code before migration
modeler 0004 (SQLite, the embedded default; the commit is in its manifest): a finished GP-UCB study, a
half-finished one, and one whose first query on a ``manual`` dataset was pending when the services stopped.
The new services migrate at start-up; the old chains must still verify, reconcile with the curator's log,
and both unfinished studies must finish, the pending one completing its first query under the very
Idempotency-Key it was sent with (the curator charges nothing twice).
"""

from __future__ import annotations

import json
import sqlite3
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.processes import ServiceProcess, curator_env, free_port, modeler_env
from shared.protocol.client import CuratorClient
from shared.tools.reconcile import reconcile

pytestmark = pytest.mark.slow

ARCHIVE = Path(__file__).parent.parent / "data" / "legacy-before-rounds.tar.gz"


@pytest.fixture
def legacy(tmp_path: Path) -> Iterator[tuple[dict[str, Any], ServiceProcess, ServiceProcess]]:
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(tmp_path, filter="data")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    port = free_port()
    # the curator runs on another port than when the data was written: point the old studies at it
    with sqlite3.connect(tmp_path / "modeler" / "modeler.db") as db:
        db.execute("UPDATE modeler_studies SET curator_url = ?", (f"http://127.0.0.1:{port}",))
    curator = ServiceProcess(
        "curator",
        port=port,
        env=curator_env(tmp_path / "curator", manifest["admin_token"]),
        log_path=tmp_path / "curator.log",
    )
    modeler = ServiceProcess(
        "modeler",
        port=free_port(),
        env=modeler_env(tmp_path / "modeler", manifest["modeler_token"]),
        log_path=tmp_path / "modeler.log",
    )
    with curator, modeler:
        curator.wait_healthy()
        modeler.wait_healthy()
        yield manifest, curator, modeler


def _wait(
    http: httpx.Client, study_id: str, statuses: set[str], operator: CuratorClient | None = None
) -> Any:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        study = http.get(f"/v1/studies/{study_id}").json()
        if study["status"] in statuses:
            return study
        if operator is not None:  # the lab measures whatever is pending
            for q in operator.list_queries(study["release_id"]).queries:
                if q.status == "pending":
                    operator.post_result(q.id, 0.5 + 0.01 * q.index)
        time.sleep(0.05)
    raise AssertionError(f"study {study_id} did not reach {statuses}: {study}")


def test_studies_written_before_rounds_verify_reconcile_and_finish(legacy: Any) -> None:
    manifest, curator, modeler = legacy
    admin = CuratorClient(curator.url, manifest["admin_token"])
    headers = {"Authorization": f"Bearer {manifest['modeler_token']}"}

    def reconciled(study_id: str) -> bool:
        report = reconcile(
            curator_url=curator.url,
            curator_token=manifest["admin_token"],
            modeler_url=modeler.url,
            modeler_token=manifest["modeler_token"],
            study_id=study_id,
        )
        return report.ok and report.modeler_entries == report.curator_entries

    with httpx.Client(base_url=modeler.url, headers=headers, timeout=60) as http, admin:
        studies = {s["id"]: s for s in http.get("/v1/studies").json()["data"]}
        finished, half, manual = (
            studies[manifest["finished"]],
            studies[manifest["half"]],
            studies[manifest["manual"]],
        )
        assert (finished["status"], finished["iterations_done"], finished["rounds_done"]) == ("done", 6, 6)
        assert finished["strategy"] == "gp-ucb" and finished["strategy_params"]["initial_points"] == 2
        assert (half["status"], half["iterations_done"]) == ("ready", 4)
        assert half["strategy_params"]["hyperparameters"]["noise_variance"] == 1e-3
        # a killed runner's study is resumable, its first query still in flight under its old key
        assert manual["status"] == "ready" and manual["pending"]["iteration"] == 1
        assert manual["pending"]["curator_query_id"] == manifest["manual_query_id"]
        assert manual["pending_round"]["queries"][0]["index"] == manifest["manual_index"]

        # the old chains verify, and the old entries read as rounds with their numbers in details
        entries = http.get(f"/v1/studies/{finished['id']}/audit").json()["entries"]
        before = manifest["audit_finished"]
        assert [e["hash"] for e in entries] == [e["hash"] for e in before]
        for new, old in zip(entries, before, strict=True):
            assert (new["round"], new["request"], new["kind"], new["hash_version"]) == (
                old["iteration"],
                0,
                "row",
                1,
            )
            assert (new["index"], new["y"], new["acquisition"], new["std"]) == (
                old["index"],
                old["y"],
                old["acquisition"],
                old["std"],
            )
            assert new["details"]["source"] == old["source"]
            assert new["details"]["hyperparameters"] == old["hyperparameters"]
        for study_id in manifest["finished"], manifest["half"]:
            assert http.get(f"/v1/studies/{study_id}/audit/verify").json()["ok"]
            assert reconciled(study_id)

        # the half-finished study finishes; its chain mixes both layouts and still verifies
        assert http.post(f"/v1/studies/{half['id']}/run").status_code == 202
        done = _wait(http, half["id"], {"done", "failed"})
        assert (done["status"], done["iterations_done"], done["rounds_done"]) == ("done", 10, 10), done
        versions = [e["hash_version"] for e in http.get(f"/v1/studies/{half['id']}/audit").json()["entries"]]
        assert versions == [1] * 4 + [2] * 6
        assert http.get(f"/v1/studies/{half['id']}/audit/verify").json() == {
            "ok": True,
            "entries": 10,
            "first_bad_seq": None,
            "supersessions": 0,
            "first_bad_supersession_seq": None,
        }
        assert reconciled(half["id"])

        # the manual study completes its pending query (same key, same query) and the rest of its budget
        assert http.post(f"/v1/studies/{manual['id']}/run").status_code == 202
        done = _wait(http, manual["id"], {"done", "failed"}, operator=admin)
        assert done["status"] == "done" and done["iterations_done"] == 3, done
        audit = http.get(f"/v1/studies/{manual['id']}/audit").json()["entries"]
        assert audit[0]["curator_query_id"] == manifest["manual_query_id"]
        queries = admin.list_queries(manifest["manual_release_id"]).queries
        assert len(queries) == 3 and sorted(q.id for q in queries) == sorted(
            e["curator_query_id"] for e in audit
        )
        assert queries[0].idempotency_key == f"{manual['id']}:1"
        assert reconciled(manual["id"])
