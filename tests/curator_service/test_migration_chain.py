"""Migration 0002 chains the queries an older database already holds, so an upgraded log verifies:
queries asked at head → downgrade to 0001 (chain columns gone) → upgrade (backfill) → same chain."""

from __future__ import annotations

from typing import Any

import pytest

from curator_service.db import alembic_config, upgrade
from curator_service.querylog import verify_release_chain
from shared.servicekit.migrations import run_migrations
from tests.curator_service.conftest import ADMIN, World

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
