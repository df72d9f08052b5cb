"""strategies by name with their parameters, and rounds of several requests in the intent and the audit log

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 19:30:00

Studies: the GP-UCB columns (delta_prime, hyperparameters, initial_points, exclude_queried) become the
study's ``strategy_params``; its random first rows become ``strategy_state``; the one-row intent
(``pending_*``) becomes ``pending_round`` (one request, with the Idempotency-Key it was sent with:
``"<study>:<iteration>"``); ``rounds_done`` starts at ``iterations_done`` (every old iteration was a round).

Audit entries: keyed by (round, request) with ``kind`` and a ``details`` object; the GP-UCB numbers
(source, acquisition, beta, mean, std, hyper-parameters) move into ``details``. ``hash_version`` 1 marks the
entries written before: their hashes cover the old layout and ``modeler_service.audit`` rebuilds it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STRATEGY_COLUMNS = ("delta_prime", "hyperparameters", "initial_points", "exclude_queried")

#: Both layouts' columns, for the data moves (each statement names only the columns that exist then).
studies = sa.table(
    "modeler_studies",
    sa.column("id", sa.String),
    sa.column("delta_prime", sa.Double),
    sa.column("hyperparameters", sa.JSON),
    sa.column("initial_points", sa.Integer),
    sa.column("exclude_queried", sa.Boolean),
    sa.column("initial_indices", sa.JSON),
    sa.column("iterations_done", sa.Integer),
    sa.column("pending_iteration", sa.Integer),
    sa.column("pending_index", sa.Integer),
    sa.column("pending_suggestion", sa.JSON(none_as_null=True)),
    sa.column("pending_query_id", sa.Integer),
    sa.column("strategy_params", sa.JSON),
    sa.column("strategy_state", sa.JSON),
    sa.column("rounds_done", sa.Integer),
    sa.column("pending_round", sa.JSON(none_as_null=True)),
)
entries = sa.table(
    "modeler_audit_entries",
    sa.column("id", sa.Integer),
    sa.column("seq", sa.Integer),
    sa.column("iteration", sa.Integer),
    sa.column("source", sa.String),
    *(sa.column(c, sa.Double) for c in ("acquisition", "beta", "mean", "std")),
    sa.column("hyperparameters", sa.Text),
    sa.column("round", sa.Integer),
    sa.column("details", sa.JSON),
    sa.column("hash_version", sa.Integer),
)


def _float_back(value: Any) -> Any:
    """The stored hyper-parameters are canonical JSON with floats as repr strings: back to floats."""
    if isinstance(value, dict):
        return {k: _float_back(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_float_back(v) for v in value]
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def upgrade() -> None:
    conn = op.get_bind()
    with op.batch_alter_table("modeler_studies", schema=None) as batch:
        batch.add_column(sa.Column("strategy_params", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("strategy_state", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("rounds_done", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("pending_round", sa.JSON(), nullable=True))
    with op.batch_alter_table("modeler_audit_entries", schema=None) as batch:
        batch.add_column(sa.Column("round", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("request", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("kind", sa.String(length=16), nullable=False, server_default="row"))
        batch.add_column(sa.Column("details", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("hash_version", sa.Integer(), nullable=False, server_default="2"))

    old_columns = ("id", *_STRATEGY_COLUMNS, "initial_indices", "iterations_done", "pending_iteration")
    old_columns += ("pending_index", "pending_suggestion", "pending_query_id")
    for row in conn.execute(sa.select(*(studies.c[c] for c in old_columns))).mappings().all():
        pending = None
        if row["pending_iteration"] is not None and row["pending_index"] is not None:
            k = int(row["pending_iteration"])
            pending = {
                "round": k,
                "requests": [
                    {
                        "request": 0,
                        "kind": "row",
                        "index": int(row["pending_index"]),
                        "details": row["pending_suggestion"] or {},
                        "key": f"{row['id']}:{k}",
                        "query_id": row["pending_query_id"],
                    }
                ],
            }
        conn.execute(
            sa.update(studies)
            .where(studies.c.id == row["id"])
            .values(
                strategy_params={
                    "delta_prime": float(row["delta_prime"]),
                    "hyperparameters": row["hyperparameters"],
                    "initial_points": int(row["initial_points"]),
                    "exclude_queried": bool(row["exclude_queried"]),
                },
                strategy_state={"initial_indices": [int(i) for i in row["initial_indices"] or []]},
                rounds_done=int(row["iterations_done"]),
                pending_round=pending,
            )
        )

    old_entry = ("id", "iteration", "source", "acquisition", "beta", "mean", "std", "hyperparameters")
    for row in conn.execute(sa.select(*(entries.c[c] for c in old_entry))).mappings().all():
        details = {
            "source": row["source"],
            "acquisition": float(row["acquisition"]),
            "beta": float(row["beta"]),
            "mean": float(row["mean"]),
            "std": float(row["std"]),
            "hyperparameters": _float_back(json.loads(row["hyperparameters"])),
        }
        conn.execute(
            sa.update(entries)
            .where(entries.c.id == row["id"])
            .values(round=int(row["iteration"]), details=details, hash_version=1)
        )

    with op.batch_alter_table("modeler_studies", schema=None) as batch:
        batch.alter_column("strategy_params", existing_type=sa.JSON(), nullable=False)
        batch.alter_column("strategy_state", existing_type=sa.JSON(), nullable=False)
        for column in (*_STRATEGY_COLUMNS, "initial_indices"):
            batch.drop_column(column)
        for column in ("pending_iteration", "pending_index", "pending_suggestion", "pending_query_id"):
            batch.drop_column(column)
    with op.batch_alter_table("modeler_audit_entries", schema=None) as batch:
        batch.drop_constraint("uq_modeler_audit_entries_study_id_iteration", type_="unique")
        batch.alter_column("round", existing_type=sa.Integer(), nullable=False)
        batch.alter_column("details", existing_type=sa.JSON(), nullable=False)
        batch.alter_column("row_index", existing_type=sa.Integer(), nullable=True)
        batch.alter_column("y", existing_type=sa.Double(), nullable=True)
        batch.alter_column("request", existing_type=sa.Integer(), server_default=None)
        batch.alter_column("kind", existing_type=sa.String(length=16), server_default=None)
        for column in ("iteration", "source", "acquisition", "beta", "mean", "std", "hyperparameters"):
            batch.drop_column(column)
        batch.create_unique_constraint(
            "uq_modeler_audit_entries_study_id_round_request", ["study_id", "round", "request"]
        )


def downgrade() -> None:
    """Back to one row per iteration: only possible while every round has one request of GP-UCB."""
    conn = op.get_bind()
    multi = conn.execute(
        sa.text("SELECT COUNT(*) FROM modeler_audit_entries WHERE request > 0 OR hash_version <> 1")
    ).scalar()
    others = conn.execute(sa.text("SELECT COUNT(*) FROM modeler_studies WHERE strategy <> 'gp-ucb'")).scalar()
    if multi or others:
        raise RuntimeError(
            "cannot downgrade below 0004: the database holds rounds of several requests, entries written by "
            "0004 or later, or strategies other than gp-ucb, which the older layout cannot represent"
        )
    with op.batch_alter_table("modeler_studies", schema=None) as batch:
        batch.add_column(sa.Column("delta_prime", sa.Double(), nullable=True))
        batch.add_column(sa.Column("hyperparameters", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("exclude_queried", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("initial_points", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("initial_indices", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("pending_iteration", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pending_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pending_suggestion", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("pending_query_id", sa.Integer(), nullable=True))
    new_columns = ("id", "strategy_params", "strategy_state", "pending_round")
    for row in conn.execute(sa.select(*(studies.c[c] for c in new_columns))).mappings().all():
        params, state, pending = (row[c] for c in ("strategy_params", "strategy_state", "pending_round"))
        request = pending["requests"][0] if pending else None
        conn.execute(
            sa.update(studies)
            .where(studies.c.id == row["id"])
            .values(
                **{c: params[c] for c in _STRATEGY_COLUMNS},
                initial_indices=state.get("initial_indices", []),
                pending_iteration=pending["round"] if pending else None,
                pending_index=request["index"] if request else None,
                pending_suggestion=request["details"] if request else None,
                pending_query_id=request["query_id"] if request else None,
            )
        )
    with op.batch_alter_table("modeler_studies", schema=None) as batch:
        for column in _STRATEGY_COLUMNS:
            batch.alter_column(column, nullable=False)
        batch.alter_column("initial_indices", existing_type=sa.JSON(), nullable=False)
        for column in ("strategy_params", "strategy_state", "rounds_done", "pending_round"):
            batch.drop_column(column)

    with op.batch_alter_table("modeler_audit_entries", schema=None) as batch:
        batch.add_column(sa.Column("iteration", sa.Integer(), nullable=True))
        for column in ("acquisition", "beta", "mean", "std"):
            batch.add_column(sa.Column(column, sa.Double(), nullable=True))
        batch.add_column(sa.Column("source", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("hyperparameters", sa.Text(), nullable=True))
    for row in conn.execute(sa.select(entries.c.id, entries.c.seq, entries.c.details)).mappings().all():
        d = row["details"]
        hp = json.dumps(_canonical(d["hyperparameters"]), sort_keys=True, separators=(",", ":"))
        conn.execute(
            sa.update(entries)
            .where(entries.c.id == row["id"])
            .values(
                iteration=row["seq"],
                **{c: d[c] for c in ("source", "acquisition", "beta", "mean", "std")},
                hyperparameters=hp,
            )
        )
    with op.batch_alter_table("modeler_audit_entries", schema=None) as batch:
        batch.drop_constraint("uq_modeler_audit_entries_study_id_round_request", type_="unique")
        for column in ("round", "request", "kind", "details", "hash_version"):
            batch.drop_column(column)
        for column in ("iteration", "source", "acquisition", "beta", "mean", "std", "hyperparameters"):
            batch.alter_column(column, nullable=False)
        batch.alter_column("row_index", existing_type=sa.Integer(), nullable=False)
        batch.alter_column("y", existing_type=sa.Double(), nullable=False)
        batch.create_unique_constraint("uq_modeler_audit_entries_study_id_iteration", ["study_id", "iteration"])


def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value
