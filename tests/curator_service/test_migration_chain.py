"""Migration 0002 chains the queries an older database already holds, so an upgraded log verifies:
queries asked at head → downgrade to 0001 (chain columns gone) → upgrade (backfill) → same chain. 0007
moves partner tokens to their own table and back; 0008 (lab workflow) takes answered queries as delivered
and refuses a downgrade that would drop sample ids or corrections; 0009 (erasure) refuses one that would
take an erased dataset for a live one."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import inspect

from curator_service.db import alembic_config, upgrade
from curator_service.querylog import verify_release_chain
from shared.servicekit.migrations import run_migrations
from tests.curator_service.conftest import ADMIN, World
from tests.curator_service.test_lab import make_lab

pytestmark = pytest.mark.anyio


async def test_upgrade_backfills_the_same_verifiable_chain(world: World, app: Any) -> None:
    rid = world.release["id"]
    for i in range(4):
        r = await world.client.post(
            f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": i}
        )
        assert r.status_code == 201
    before = (await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=ADMIN)).json()
    assert before["ok"] and before["entries"] == 4

    db = app.state.components.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0001", downgrade=True)
    upgrade(db.engine)
    with db.session(write=False) as session:
        result, head = verify_release_chain(session, rid)
    assert result.ok and result.entries == 4
    assert head == before["head"]  # the backfill rebuilt exactly the chain the service had built


async def test_migration_0007_moves_every_partner_token_and_back(world: World, app: Any) -> None:
    """The partner's token keeps working across 0007 (tokens move to their own table) and its downgrade."""
    db = app.state.components.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0006", downgrade=True)
    upgrade(db.engine)
    me = await world.client.get("/v1/partners/me", headers=world.partner_headers)
    assert me.status_code == 200 and me.json()["id"] == world.partner["id"]
    tokens = (await world.client.get(f"/v1/partners/{world.partner['id']}/tokens", headers=ADMIN)).json()
    assert tokens["count"] == 1 and tokens["data"][0]["revoked"] is False


async def test_migration_0008_takes_answered_queries_as_delivered(world: World, app: Any) -> None:
    """A query answered before 0008 may have been read by its partner: after the upgrade it counts as
    delivered at its completion, so its value can only be superseded; the chain still verifies."""
    rid = world.release["id"]
    for i in range(3):
        r = await world.client.post(
            f"/v1/releases/{rid}/queries", headers=world.partner_headers, json={"index": i}
        )
        assert r.status_code == 201
    db = app.state.components.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0007", downgrade=True)
    with db.engine.connect() as conn:
        assert "delivered_at" not in {c["name"] for c in inspect(conn).get_columns("curator_queries")}
    upgrade(db.engine)
    listed = (await world.client.get(f"/v1/releases/{rid}/queries", headers=ADMIN)).json()["queries"]
    assert len(listed) == 3
    assert all(q["delivered_at"] == q["completed_at"] is not None for q in listed)
    verified = (await world.client.get(f"/v1/releases/{rid}/queries/verify", headers=ADMIN)).json()
    assert verified["ok"] and verified["entries"] == 3


async def test_migration_0008_downgrade_refuses_to_drop_sample_ids_or_corrections(
    client: httpx.AsyncClient, app: Any
) -> None:
    lab = await make_lab(client, partners=1)
    q = await lab.ask(0, 2)
    await client.post(f"/v1/queries/{q['id']}/result", headers=ADMIN, json={"y": 1.0})
    await client.post(f"/v1/queries/{q['id']}/corrections", headers=ADMIN, json={"y": 2.0, "reason": "typo"})
    db = app.state.components.db
    db.engine.dispose()
    with pytest.raises(RuntimeError) as err:
        run_migrations(db.engine, alembic_config(), revision="0007", downgrade=True)
    assert str(err.value) == (
        "cannot downgrade the curator's database below revision 0008: it holds 1 correction(s) of measured "
        f"outcomes (links of the query logs) and the sample ids of dataset(s) {lab.dataset['id']}, which "
        "the older schema cannot keep. Restore a backup taken before the upgrade instead."
    )
    pending = (await client.get("/v1/queries", headers=ADMIN, params={"status": "complete"})).json()
    assert [(x["id"], x["sample_id"], x["corrections"]) for x in pending["data"]] == [(q["id"], "S-002", 1)]


async def test_migration_0009_downgrade_refuses_to_revive_an_erased_dataset(world: World, app: Any) -> None:
    """0009 adds the tombstones and drops them again while nothing is erased; once a dataset is erased, the
    downgrade refuses (the older schema would take it for a live dataset whose files are missing)."""
    db = app.state.components.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0008", downgrade=True)
    with db.engine.connect() as conn:
        for table in ("curator_datasets", "curator_releases", "curator_gradient_oracles"):
            assert "erased_at" not in {c["name"] for c in inspect(conn).get_columns(table)}
    upgrade(db.engine)
    r = await world.client.delete(
        f"/v1/datasets/{world.dataset['id']}", headers=ADMIN, params={"force": "true"}
    )
    assert r.status_code == 200 and r.json()["erased_at"] is not None
    db.engine.dispose()
    with pytest.raises(RuntimeError) as err:
        run_migrations(db.engine, alembic_config(), revision="0008", downgrade=True)
    assert str(err.value) == (
        f"cannot downgrade the curator's database below revision 0009: dataset(s) {world.dataset['id']} were "
        "erased, and the older schema would take them for live datasets whose files are missing. Restore a "
        "backup taken before the upgrade instead."
    )
    shown = (await world.client.get(f"/v1/datasets/{world.dataset['id']}", headers=ADMIN)).json()
    assert shown["erased_at"] is not None  # the refused downgrade changed nothing
