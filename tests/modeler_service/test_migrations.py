"""The modeler's models match its migrated schema, migrations 0002, 0008 and 0009 upgrade studies made
before them, 0005 / 0008 refuse to downgrade a database holding gradient-oracle studies / supersessions, and
0009 downgrades (dropping the studies' names and tags)."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from modeler_service.db import VERSION_TABLE, alembic_config, upgrade
from modeler_service.models import Base
from shared.servicekit.migrations import run_migrations


def test_models_match_the_migrated_schema(app: Any) -> None:
    with app.state.components.ctx.db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert [d for d in diff if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)] == []


def test_studies_before_0002_ran_on_algorithm_1(client: Any, app: Any) -> None:
    from tests.modeler_service.conftest import study_body

    created = client.post("/v1/studies", json=study_body())
    assert created.status_code == 201, created.text
    assert created.json()["release"]["mechanism"] == "gaussian"
    db = app.state.components.ctx.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0001", downgrade=True)
    upgrade(db.engine)
    with db.engine.connect() as conn:
        row = conn.execute(
            text("SELECT release_mechanism, release_formal_guarantee, release_lift FROM modeler_studies")
        ).one()
    assert tuple(row) == ("po-gp-ucb", False, "auto")


def test_a_gradient_oracle_study_blocks_a_downgrade_below_0005(client: Any, app: Any) -> None:
    import pytest

    from tests.modeler_service.test_dp_gibo_study import gibo_body

    created = client.post("/v1/studies", json=gibo_body())
    assert created.status_code == 201, created.text
    db = app.state.components.ctx.db
    db.engine.dispose()
    with pytest.raises(RuntimeError, match="gradient oracle"):
        run_migrations(db.engine, alembic_config(), revision="0004", downgrade=True)
    upgrade(db.engine)  # still at head
    with db.engine.connect() as conn:
        row = conn.execute(text("SELECT release_id, gradient_oracle_id, theta FROM modeler_studies")).one()
    assert row[0] is None and row[1] == 1


def test_studies_before_0008_upgrade_without_supersessions(client: Any, app: Any) -> None:
    from tests.modeler_service.conftest import study_body
    from tests.modeler_service.test_studies import wait_for

    study = client.post("/v1/studies", json=study_body(iterations=2)).json()
    assert client.post(f"/v1/studies/{study['id']}/run").status_code == 202
    assert wait_for(client, study["id"], {"done", "failed"})["status"] == "done"
    db = app.state.components.ctx.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0007", downgrade=True)
    upgrade(db.engine)
    with db.engine.connect() as conn:
        row = conn.execute(
            text("SELECT awaits_measurements, supersessions_done, supersessions_head FROM modeler_studies")
        ).one()
    assert (bool(row[0]), row[1], row[2]) == (False, 0, "0" * 64)
    verified = client.get(f"/v1/studies/{study['id']}/audit/verify").json()
    assert (verified["ok"], verified["entries"], verified["supersessions"]) == (True, 2, 0)


def test_a_recorded_supersession_blocks_a_downgrade_below_0008(client: Any, app: Any, curator: Any) -> None:
    import pytest

    from tests.modeler_service.test_supersessions import audit, measured_study, sync

    sid = measured_study(client, curator, iterations=2)
    curator.supersede(audit(client, sid)["entries"][0]["curator_query_id"], 0.5)
    assert sync(client, sid)["recorded"] == 1
    db = app.state.components.ctx.db
    db.engine.dispose()
    with pytest.raises(RuntimeError, match="1 supersessions"):
        run_migrations(db.engine, alembic_config(), revision="0007", downgrade=True)
    upgrade(db.engine)  # still at head
    assert client.get(f"/v1/studies/{sid}/audit/verify").json()["ok"]


def test_studies_before_0009_have_no_name_nor_tags_and_0009_downgrades(client: Any, app: Any) -> None:
    from tests.modeler_service.conftest import study_body

    tagged = client.post("/v1/studies", json=study_body(name="Named", tags=["a", "B"])).json()
    db = app.state.components.ctx.db
    db.engine.dispose()
    run_migrations(db.engine, alembic_config(), revision="0008", downgrade=True)  # drops names and tags
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT id FROM modeler_studies")).scalars().all() == [tagged["id"]]
    upgrade(db.engine)
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM modeler_study_tags")).scalar() == 0
    shown = client.get(f"/v1/studies/{tagged['id']}").json()
    assert (shown["name"], shown["tags"]) == (None, [])
    assert [s["id"] for s in client.get("/v1/studies").json()["data"]] == [tagged["id"]]
    assert client.get("/v1/studies?tag=a").json()["count"] == 0
    retagged = client.patch(f"/v1/studies/{tagged['id']}", json={"tags": ["a"]}).json()
    assert retagged["tags"] == ["a"] and client.get("/v1/studies?tag=A").json()["count"] == 1
