"""DELETE /v1/datasets/{id}: a 409 while a live grant holds the dataset, ``?force=true``, every file derived
from it gone from the data dir (a control dataset's kept), the ledger and the query chains unchanged and
verifiable, 410 Gone for its partners and for admin actions that need its data, tombstones, the lab's
lists, and the start-up sweep of files a crash left after the erasure's commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from curator_service import erasure_repository as erepo
from curator_service.config import Settings
from curator_service.main import start_up
from curator_service.models import utcnow
from tests.curator_service.conftest import ADMIN, World, make_csv, synthetic, upload
from tests.curator_service.test_gradient_oracles import (
    _dataset,
    _labelled,
    _oracle,
    _partner,
    _step,
    _step_body,
)
from tests.curator_service.test_lab import make_lab

pytestmark = pytest.mark.anyio


def files_on_disk(data_dir: Path) -> set[str]:
    """Every file under the data dir's arrays tree, relative to the data dir."""
    return {
        p.relative_to(data_dir.resolve()).as_posix()
        for p in (data_dir / "arrays").resolve().rglob("*")
        if p.is_file()
    }


def paths_of(app: Any, dataset_id: int) -> set[str]:
    with app.state.components.db.session(write=False) as session:
        return erepo.array_paths(session, [dataset_id])


async def _control(client: httpx.AsyncClient) -> dict[str, Any]:
    """Another population's dataset with a release: its files must survive the erasure."""
    X, y = synthetic(n=40, d=3, seed=99)
    r = await upload(client, make_csv(X, y), name="control", objective="outcome", population="others")
    assert r.status_code == 201, r.text
    dataset = r.json()
    r = await client.post(
        f"/v1/datasets/{dataset['id']}/releases", headers=ADMIN, json={"epsilon": 1.0, "delta": 1e-5}
    )
    assert r.status_code == 201, r.text
    return dataset


async def test_a_live_grant_holds_the_dataset(world: World, app: Any, data_dir: Path) -> None:
    ds, rid, pid = world.dataset["id"], world.release["id"], world.partner["id"]
    before = files_on_disk(data_dir)
    r = await world.client.delete(f"/v1/datasets/{ds}", headers=ADMIN)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"dataset {ds} is still granted to partners who have not been revoked: partner {pid} (modeler) on "
        f"release {rid}. Revoke them first, or erase with ?force=true (their grants then answer 410 Gone)"
    )
    assert files_on_disk(data_dir) == before and paths_of(app, ds) <= before
    shown = (await world.client.get(f"/v1/datasets/{ds}", headers=ADMIN)).json()
    assert shown["erased_at"] is None
    rows = await world.client.get(f"/v1/releases/{rid}/rows", headers=world.partner_headers)
    assert rows.status_code == 200  # nothing changed
    # a partner cannot erase
    assert (await world.client.delete(f"/v1/datasets/{ds}", headers=world.partner_headers)).status_code == 403


async def test_force_erases_every_derived_file_and_keeps_the_logs(
    world: World, app: Any, data_dir: Path
) -> None:
    client, ds, rid = world.client, world.dataset["id"], world.release["id"]
    control = await _control(client)
    kept = paths_of(app, control["id"])
    for i in range(3):
        r = await client.post(f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": i})
        assert r.status_code == 201, r.text
    first = r.json()
    verified = (await client.get(f"/v1/releases/{rid}/queries/verify", headers=ADMIN)).json()
    assert verified["ok"] and verified["entries"] == 3
    ledger = (await client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json()
    erased_files = paths_of(app, ds)
    assert len(erased_files) == 3 and erased_files <= files_on_disk(data_dir)  # features, outcomes, Z

    r = await client.delete(f"/v1/datasets/{ds}", headers=ADMIN, params={"force": "true"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == ds and r.json()["erased_at"] is not None

    # the data dir holds the control's files and nothing else
    assert files_on_disk(data_dir) == kept
    # the ledger and the chain are as they were, and the chain verifies
    assert (await client.get(f"/v1/datasets/{ds}/ledger", headers=ADMIN)).json() == ledger
    again = (await client.get(f"/v1/releases/{rid}/queries/verify", headers=ADMIN)).json()
    assert again == verified
    listed = (await client.get(f"/v1/releases/{rid}/queries", headers=ADMIN)).json()["queries"]
    assert [q["y"] for q in listed] == pytest.approx(list(world.y[:3]))  # answers as sent stay (documented)

    # its partner is told the release was erased
    gone = f"release {rid} was erased: its dataset was erased by the curator"
    h = world.partner_headers
    for response in (
        await client.post(f"/v1/releases/{rid}/queries", headers=h, json={"index": 5}),
        await client.post(f"/v1/releases/{rid}/queries", headers=h, json={"index": 0}),
        await client.get(f"/v1/releases/{rid}/rows", headers=h),
        await client.get(f"/v1/releases/{rid}", headers=h),
        await client.get(f"/v1/queries/{first['id']}", headers=h),
    ):
        assert response.status_code == 410 and response.json() == {"detail": gone}
    # admin actions that need the data are refused, metadata stays readable
    refused = await client.post(
        f"/v1/datasets/{ds}/releases", headers=ADMIN, json={"epsilon": 0.1, "delta": 1e-6}
    )
    assert refused.status_code == 410 and refused.json() == {"detail": f"dataset {ds} was erased"}
    privacy = await client.get(
        f"/v1/datasets/{ds}/privacy", headers=ADMIN, params={"epsilon": 1, "delta": 1e-5}
    )
    assert privacy.status_code == 410
    rows = await client.get(f"/v1/releases/{rid}/rows", headers=ADMIN)
    assert rows.status_code == 410 and rows.json() == {"detail": gone}
    assert (await client.get(f"/v1/releases/{rid}", headers=ADMIN)).status_code == 200
    listed_ds = (await client.get("/v1/datasets", headers=ADMIN)).json()["data"]
    assert [(d["id"], d["erased_at"] is not None) for d in listed_ds] == [(ds, True), (control["id"], False)]
    # erasing again is harmless; the control still answers
    assert (await client.delete(f"/v1/datasets/{ds}", headers=ADMIN)).status_code == 200
    assert files_on_disk(data_dir) == kept


async def test_a_revoked_partner_does_not_hold_the_dataset(world: World, data_dir: Path) -> None:
    ds = world.dataset["id"]
    assert (
        await world.client.delete(f"/v1/partners/{world.partner['id']}", headers=ADMIN)
    ).status_code == 200
    r = await world.client.delete(f"/v1/datasets/{ds}", headers=ADMIN)
    assert r.status_code == 200 and r.json()["erased_at"] is not None
    assert files_on_disk(data_dir) == set()


async def test_a_gradient_oracle_grant_holds_the_dataset(client: httpx.AsyncClient, data_dir: Path) -> None:
    X, y = _labelled()
    dataset = await _dataset(client, X, y)
    oracle = (await _oracle(client, dataset["id"])).json()
    partner = await _partner(client, [oracle["id"]])
    assert (await _step(client, oracle["id"], partner, _step_body(), "k1")).status_code == 201
    r = await client.delete(f"/v1/datasets/{dataset['id']}", headers=ADMIN)
    assert r.status_code == 409 and f"on gradient oracle {oracle['id']}" in r.json()["detail"]
    r = await client.delete(f"/v1/datasets/{dataset['id']}", headers=ADMIN, params={"force": "true"})
    assert r.status_code == 200
    assert files_on_disk(data_dir) == set()
    step = await _step(client, oracle["id"], partner, _step_body(), "k2")
    assert step.status_code == 410
    assert step.json() == {
        "detail": f"gradient oracle {oracle['id']} was erased: its dataset was erased by the curator"
    }
    assert (await client.get(f"/v1/gradient-oracles/{oracle['id']}", headers=ADMIN)).status_code == 200


async def test_the_lab_forgets_an_erased_datasets_samples(client: httpx.AsyncClient, data_dir: Path) -> None:
    lab = await make_lab(client, partners=1)
    done = await lab.ask(0, 1)
    pending = await lab.ask(0, 2)
    assert (
        await client.post(f"/v1/queries/{done['id']}/result", headers=ADMIN, json={"y": 1.5})
    ).status_code == 200
    assert {q["sample_id"] for q in await lab.pending()} == {"S-002"}
    r = await client.delete(f"/v1/datasets/{lab.dataset['id']}", headers=ADMIN, params={"force": "true"})
    assert r.status_code == 200
    assert files_on_disk(data_dir) == set()  # features, sample ids and Z
    assert await lab.pending() == [] and await lab.pending(status="complete") == []
    posted = await client.post(f"/v1/queries/{pending['id']}/result", headers=ADMIN, json={"y": 2.0})
    rid = lab.release["id"]
    assert posted.status_code == 410 and posted.json() == {
        "detail": f"query {pending['id']} is on release {rid}, which was erased with its dataset"
    }
    verified = (await client.get(f"/v1/releases/{lab.release['id']}/queries/verify", headers=ADMIN)).json()
    assert verified["ok"] and verified["entries"] == 1


async def test_start_up_removes_files_a_crash_left_after_the_commit(
    world: World, app: Any, settings: Settings, data_dir: Path
) -> None:
    """The erasure commits first and unlinks after: a crash in between leaves files no live row refers to,
    which the next start removes whatever their age (the orphan sweep waits an hour)."""
    ds = world.dataset["id"]
    control = await _control(world.client)
    kept = paths_of(app, control["id"])
    db = app.state.components.db
    with db.session(write=True) as session:
        erepo.mark_erased(session, ds, utcnow())
        session.commit()
    assert paths_of(app, ds) <= files_on_disk(data_dir)  # "crashed" before the unlink
    db.engine.dispose()
    start_up(settings)
    assert files_on_disk(data_dir) == kept
