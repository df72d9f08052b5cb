"""Core statements run on the database driver's own cursor: the hot paths' statements without
SQLAlchemy's per-execution work (issue 18).

SQLAlchemy's ``Connection.execute`` of a cached Core statement costs some 50 us of Python around a
driver call of 5-10 us (an execution context, parameter processing, events, a result object). The
curator's answered query runs seven statements and the modeler's round three per iteration, so that work
was most of their time in the database. A :class:`DriverStatement` is a Core statement compiled once for
the engine's dialect (named parameters: ``:name`` for sqlite3, ``%(name)s`` for psycopg), run with
:meth:`DriverStatement.run` on a DB-API cursor of a transaction that SQLAlchemy still begins and ends
(``Database.driver_transaction``: on SQLite ``BEGIN IMMEDIATE`` and the writer's turn, the commit's fsync,
the rollback on error, as for every other write). What the statement is stays written in Core, next to the
models it names; what it costs is the driver's.

Parameters go through their types' bind processors and returned values through the result processors, as
a Core execution would pass them (``UTCDateTime``: naive UTC text on SQLite; JSON: serialised text).
A driver error is raised as SQLAlchemy's wrapper of it (``DBAPIError.instance``), so that the services'
handlers (503 for an ``OperationalError``) and callers (``IntegrityError`` for a unique key) see what a
Core execution would raise.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from sqlalchemy import Engine
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["DriverStatement", "PerEngine"]

T = TypeVar("T")


class DriverStatement:
    """``statement`` compiled for ``engine``'s dialect, run on a driver cursor with the column types' own
    bind and result processors (the ones a Core execution applies)."""

    def __init__(self, statement: ClauseElement, engine: Engine) -> None:
        dialect = engine.dialect
        compile_for = sqlite.dialect(paramstyle="named") if dialect.name == "sqlite" else dialect
        compiled = cast(SQLCompiler, statement.compile(dialect=compile_for))
        if compiled.post_compile_params:
            names = sorted(bind.key for bind in compiled.post_compile_params)
            raise ValueError(
                "a driver statement binds each value on its own: IN lists (expanding parameters) are "
                f"rendered per execution by SQLAlchemy only ({names})"
            )
        self.sql = str(compiled)
        #: The statement's own bound values (literals in the Core statement), overridden by ``run``'s.
        self.defaults: dict[str, Any] = dict(compiled.params)
        self._binds: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                self._binds[name] = process
        self.defaults = {name: self._value(name, value) for name, value in self.defaults.items()}
        returned = list(getattr(statement, "exported_columns", ()))
        #: The names of the columns it returns (a SELECT, or RETURNING), in order.
        self.columns: tuple[str, ...] = tuple(column.key for column in returned)
        self._returned = returned
        self._dialect = dialect
        #: Result processors, made at the first fetch from the driver's column type codes (which some
        #: processors depend on: a PostgreSQL float column's, e.g.).
        self._results: list[Callable[[Any], Any] | None] | None = None
        self._dbapi_error: type[Exception] = dialect.loaded_dbapi.Error

    def _value(self, name: str, value: Any) -> Any:
        process = self._binds.get(name)
        return value if process is None else process(value)  # (a processor maps None itself: JSON 'null')

    def run(self, cursor: Any, params: Mapping[str, Any]) -> Any:
        """Execute with ``params`` (over the statement's own values); returns the cursor (``rowcount``)."""
        values = {**self.defaults, **{key: self._value(key, value) for key, value in params.items()}}
        try:
            cursor.execute(self.sql, values)
        except self._dbapi_error as exc:
            raise DBAPIError.instance(self.sql, values, exc, self._dbapi_error) from exc
        return cursor

    def run_many(self, cursor: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per row of parameters (``executemany``)."""
        values = [{**self.defaults, **{key: self._value(key, v) for key, v in row.items()}} for row in rows]
        try:
            cursor.executemany(self.sql, values)
        except self._dbapi_error as exc:
            raise DBAPIError.instance(self.sql, values, exc, self._dbapi_error) from exc

    def one_or_none(self, cursor: Any, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The one row the statement returns, as ``{column: value}`` (values as a Core result gives
        them), or None."""
        row = self.run(cursor, params).fetchone()
        if row is None:
            return None
        if self._results is None:
            dialect = self._dialect
            self._results = [
                column.type.dialect_impl(dialect).result_processor(dialect, description[1])
                for column, description in zip(self._returned, cursor.description, strict=True)
            ]
        return {
            name: value if process is None else process(value)
            for name, value, process in zip(self.columns, row, self._results, strict=True)
        }


class PerEngine(Generic[T]):
    """``build(engine)`` made once per engine and kept while the engine lives (a module's compiled
    statements: ``statements = PerEngine(AnswerStatements)``, then ``statements(db.engine)``)."""

    def __init__(self, build: Callable[[Engine], T]) -> None:
        self._build = build
        self._made: weakref.WeakKeyDictionary[Engine, T] = weakref.WeakKeyDictionary()

    def __call__(self, engine: Engine) -> T:
        made = self._made.get(engine)
        if made is None:
            made = self._made[engine] = self._build(engine)
        return made
