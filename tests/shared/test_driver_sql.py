"""``shared.servicekit.driver_sql``: a Core statement run on the driver's cursor writes and reads exactly
what the same statement executed by SQLAlchemy does, and fails as SQLAlchemy would (SQLite always,
PostgreSQL when ``POBO_TEST_DATABASE_URL`` is set)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Double,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from shared.servicekit.db import Database
from shared.servicekit.driver_sql import DriverStatement
from shared.servicekit.models import UTCDateTime

PG_URL = os.environ.get("POBO_TEST_DATABASE_URL")

meta = MetaData()
things = Table(
    "driver_things",
    meta,
    Column("id", Integer, primary_key=True),
    Column("name", String(20), unique=True),
    Column("flag", Boolean),
    Column("score", Double),
    Column("at", UTCDateTime),
    Column("doc", JSON),  # None is stored as JSON 'null'
    Column("maybe", JSON(none_as_null=True)),  # None is stored as SQL NULL
)
COLUMNS = ("name", "flag", "score", "at", "doc", "maybe")
INSERT = insert(things).values({key: bindparam(key) for key in COLUMNS}).returning(*things.c)
RENAME = (
    update(things).where(things.c.name == bindparam("old"), things.c.flag.is_(True)).values(name="renamed")
)

ROWS: list[dict[str, Any]] = [
    {
        "name": "a",
        "flag": True,
        "score": 0.1 + 0.2,
        "at": datetime(2026, 11, 25, 3, 4, 5, 678901, tzinfo=UTC),
        "doc": {"round": 3, "requests": [{"index": 7, "details": {"beta": 1.5}}]},
        "maybe": [1.0, -2.5],
    },
    {
        "name": "b",
        "flag": False,
        "score": -1e300,
        "at": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=5))),  # stored as UTC
        "doc": None,
        "maybe": None,
    },
]


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'driver.db'}"
    else:
        if not PG_URL:
            pytest.skip("POBO_TEST_DATABASE_URL is not set")
        schema = f"driver_test_{uuid.uuid4().hex[:12]}"
        url = (
            make_url(PG_URL)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    database = Database(url)
    if request.param == "postgresql":
        with database.engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    meta.create_all(database.engine)
    yield database
    if request.param == "postgresql":
        with database.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    database.dispose()


def _stored(db: Database) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(things).order_by(things.c.id))]


def test_rows_written_on_the_cursor_equal_rows_written_by_core(db: Database) -> None:
    statement = DriverStatement(INSERT, db.engine)
    with db.driver_transaction() as cur:
        returned = [statement.one_or_none(cur, row) for row in ROWS]
    with db.engine.begin() as conn:  # the same rows again through SQLAlchemy, under other names
        core = [dict(conn.execute(INSERT, row | {"name": row["name"] + "2"}).one()._mapping) for row in ROWS]
    stored = _stored(db)
    own = [{k: v for k, v in r.items() if k not in ("id", "name")} for r in stored]
    assert own[:2] == own[2:]  # every column stored the same way (JSON 'null' vs NULL, UTC text, ...)
    for mine, theirs in zip(returned, core, strict=True):  # and handed back the same way
        assert mine is not None and {k: v for k, v in mine.items() if k not in ("id", "name")} == {
            k: v for k, v in theirs.items() if k not in ("id", "name")
        }
    assert stored[0]["at"] == ROWS[0]["at"] and stored[1]["at"] == ROWS[1]["at"].astimezone(UTC)
    assert stored[1]["doc"] is None and stored[1]["maybe"] is None and stored[0]["flag"] is True
    with db.engine.connect() as conn:  # JSON None: 'null' in one column, SQL NULL in the other
        nulls = conn.execute(
            select(things.c.doc.is_(None), things.c.maybe.is_(None)).where(things.c.name == "b")
        ).one()
    assert tuple(nulls) == (False, True)


def test_rowcount_literals_and_many(db: Database) -> None:
    insert_many = DriverStatement(insert(things).values({key: bindparam(key) for key in COLUMNS}), db.engine)
    rename = DriverStatement(RENAME, db.engine)
    assert rename.defaults["name"] == "renamed"  # the statement's own literal
    with db.driver_transaction() as cur:
        insert_many.run_many(cur, ROWS)
        assert rename.run(cur, {"old": "b"}).rowcount == 0  # flag is false
        assert rename.run(cur, {"old": "a"}).rowcount == 1
    assert [r["name"] for r in _stored(db)] == ["renamed", "b"]


def test_errors_are_sqlalchemys_and_roll_back(db: Database) -> None:
    statement = DriverStatement(INSERT, db.engine)
    with db.driver_transaction() as cur:
        statement.one_or_none(cur, ROWS[0])
    with pytest.raises(IntegrityError), db.driver_transaction() as cur:
        statement.one_or_none(cur, ROWS[1])
        statement.one_or_none(cur, ROWS[0])  # the unique name again: the whole transaction rolls back
    assert [r["name"] for r in _stored(db)] == ["a"]
    with db.driver_transaction() as cur:  # and the database takes writes again (the turn was released)
        statement.one_or_none(cur, ROWS[1])
    assert [r["name"] for r in _stored(db)] == ["a", "b"]


def test_in_lists_are_refused(db: Database) -> None:
    with pytest.raises(ValueError, match="IN lists"):
        DriverStatement(select(things).where(things.c.name.in_(["a", "b"])), db.engine)
