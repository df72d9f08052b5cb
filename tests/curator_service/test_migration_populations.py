"""Migration 0003 (populations, mechanisms, native ledger parameters) on a database with data in it, and
the models matching the migrated schema exactly (no drift between ``models.py`` and ``migrations/``)."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from curator_service.db import VERSION_TABLE, alembic_config, upgrade
from curator_service.models import Base
from shared.servicekit.migrations import run_migrations
from tests.curator_service.conftest import ADMIN, World

pytestmark = pytest.mark.anyio


def test_models_match_the_migrated_schema(app: Any) -> None:
    with app.state.components.db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    ours = [d for d in diff if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)]
    assert ours == []


async def test_upgrade_moves_budgets_to_one_population_per_dataset(world: World, app: Any) -> None:
    ds = world.dataset["id"]
    delta_budget = world.dataset["delta_budget"]  # the default: min(1e-3, 0.1 / n)
    assert delta_budget == min(1e-3, 0.1 / world.dataset["n"])
    alg1 = await world.client.post(
        f"/v1/datasets/{ds}/releases",
        headers=ADMIN,
        json={
            "epsilon": 1,
            "delta": 1e-5,
            "r": 3,
            "mechanism": "po-gp-ucb",
            "acknowledge_no_guarantee": True,
        },
    )
    assert alg1.status_code == 201
    db = app.state.components.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0002", downgrade=True)
    with db.engine.connect() as conn:
        budgets = conn.execute(text("SELECT id, epsilon_budget, delta_budget FROM curator_datasets")).all()
        lifts = conn.execute(text("SELECT lift, omega FROM curator_releases ORDER BY id")).all()
    assert [tuple(b) for b in budgets] == [(ds, 5.0, delta_budget)]  # the population's, back on the dataset
    assert [row[0] for row in lifts] == ["auto", "auto"]  # the Gaussian release got neutral values
    upgrade(db.engine)
    with db.engine.connect() as conn:
        pops = conn.execute(
            text("SELECT id, name, epsilon_budget, delta_budget FROM curator_populations")
        ).all()
        (pid,) = conn.execute(text("SELECT population_id FROM curator_datasets")).one()
        releases = conn.execute(text("SELECT mechanism, formal_guarantee FROM curator_releases")).all()
        ledger = conn.execute(text("SELECT population_id, mechanism FROM curator_ledger_entries")).all()
    assert [tuple(p) for p in pops] == [(pid, None, 5.0, delta_budget)]
    # releases made before 0003 were the paper's Algorithm 1: no formal guarantee
    assert [tuple(r) for r in releases] == [("po-gp-ucb", False), ("po-gp-ucb", False)]
    assert [tuple(e) for e in ledger] == [(pid, "po-gp-ucb"), (pid, "po-gp-ucb")]
    view = (await world.client.get(f"/v1/datasets/{ds}", headers=ADMIN)).json()
    assert view["population_id"] == pid and view["epsilon_spent"] == 2.0 and view["epsilon_budget"] == 5.0
