"""federations (DP-FTS-DE coordinator): federations, agents, rounds, submissions

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 10:00:00

Four new tables (issue 16): ``modeler_federations`` (public parameters, published features, status, epsilon
so far), ``modeler_federation_agents`` (hashed tokens; position and region fixed at start),
``modeler_federation_rounds`` (deadline, Poisson sample, aggregates, epsilon after the round) and
``modeler_federation_submissions`` (raw omegas, deleted when their round closes).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "modeler_federations",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("rff", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("stop_reason", sa.String(length=16), nullable=True),
        sa.Column("participants", sa.Integer(), nullable=True),
        sa.Column("current_round", sa.Integer(), nullable=False),
        sa.Column("rounds_closed", sa.Integer(), nullable=False),
        sa.Column("epsilon_pld", sa.Double(), nullable=False),
        sa.Column("epsilon_rdp", sa.Double(), nullable=False),
        sa.Column("epsilon_replace_one_pld", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modeler_federations")),
    )
    with op.batch_alter_table("modeler_federations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_modeler_federations_status"), ["status"], unique=False)

    op.create_table(
        "modeler_federation_agents",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("federation_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("region", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["modeler_federations.id"],
            name=op.f("fk_modeler_federation_agents_federation_id_modeler_federations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modeler_federation_agents")),
        sa.UniqueConstraint(
            "federation_id", "name", name=op.f("uq_modeler_federation_agents_federation_id_name")
        ),
        sa.UniqueConstraint(
            "federation_id", "seq", name=op.f("uq_modeler_federation_agents_federation_id_seq")
        ),
        sa.UniqueConstraint("token_hash", name=op.f("uq_modeler_federation_agents_token_hash")),
    )
    with op.batch_alter_table("modeler_federation_agents", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_modeler_federation_agents_federation_id"), ["federation_id"], unique=False
        )

    op.create_table(
        "modeler_federation_rounds",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("federation_id", sa.String(length=32), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sampled", sa.JSON(), nullable=True),
        sa.Column("aggregates", sa.JSON(), nullable=True),
        sa.Column("epsilon_pld", sa.Double(), nullable=True),
        sa.Column("epsilon_rdp", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["federation_id"],
            ["modeler_federations.id"],
            name=op.f("fk_modeler_federation_rounds_federation_id_modeler_federations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modeler_federation_rounds")),
        sa.UniqueConstraint(
            "federation_id", "number", name=op.f("uq_modeler_federation_rounds_federation_id_number")
        ),
    )
    with op.batch_alter_table("modeler_federation_rounds", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_modeler_federation_rounds_federation_id"), ["federation_id"], unique=False
        )

    op.create_table(
        "modeler_federation_submissions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.String(length=32), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("omega", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["modeler_federation_agents.id"],
            name=op.f("fk_modeler_federation_submissions_agent_id_modeler_federation_agents"),
        ),
        sa.ForeignKeyConstraint(
            ["round_id"],
            ["modeler_federation_rounds.id"],
            name=op.f("fk_modeler_federation_submissions_round_id_modeler_federation_rounds"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modeler_federation_submissions")),
        sa.UniqueConstraint(
            "round_id", "agent_id", name=op.f("uq_modeler_federation_submissions_round_id_agent_id")
        ),
    )
    with op.batch_alter_table("modeler_federation_submissions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_modeler_federation_submissions_round_id"), ["round_id"], unique=False
        )


def downgrade() -> None:
    op.drop_table("modeler_federation_submissions")
    op.drop_table("modeler_federation_rounds")
    op.drop_table("modeler_federation_agents")
    op.drop_table("modeler_federations")
