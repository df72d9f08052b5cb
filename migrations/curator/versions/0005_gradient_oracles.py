"""gradient oracles (DP-GIBO): oracles, their answered steps, partner grants, ledger link

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 09:10:00

* ``curator_gradient_oracles``: one private gradient oracle on a dataset (loss, public bounds, clip, mu,
  steps, the epsilon/delta charged at creation, and the atomic step counter ``steps_used``).
* ``curator_gradient_steps``: every answered step (its data-independent inputs and the released gradient),
  unique per (oracle, step) and per (oracle, partner, Idempotency-Key).
* ``curator_oracle_grants``: which partner may step which oracle.
* ``curator_ledger_entries.gradient_oracle_id``: the oracle a ledger entry pays for.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "curator_gradient_oracles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("loss", sa.String(length=64), nullable=False),
        sa.Column("loss_params", sa.JSON(), nullable=False),
        sa.Column("dimension", sa.Integer(), nullable=False),
        sa.Column("bounds", sa.JSON(), nullable=False),
        sa.Column("clip", sa.Double(), nullable=False),
        sa.Column("mu", sa.Double(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("steps_used", sa.Integer(), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["curator_datasets.id"],
            name=op.f("fk_curator_gradient_oracles_dataset_id_curator_datasets"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_curator_gradient_oracles")),
    )
    op.create_index(
        op.f("ix_curator_gradient_oracles_dataset_id"), "curator_gradient_oracles", ["dataset_id"]
    )
    op.create_table(
        "curator_gradient_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("oracle_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("partner_id", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.Column("theta", sa.JSON(), nullable=False),
        sa.Column("points", sa.JSON(), nullable=False),
        sa.Column("kernel", sa.JSON(), nullable=False),
        sa.Column("noise_var", sa.Double(), nullable=False),
        sa.Column("jitter", sa.Double(), nullable=False),
        sa.Column("gradient", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["oracle_id"],
            ["curator_gradient_oracles.id"],
            name=op.f("fk_curator_gradient_steps_oracle_id_curator_gradient_oracles"),
        ),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["curator_partners.id"],
            name=op.f("fk_curator_gradient_steps_partner_id_curator_partners"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_curator_gradient_steps")),
        sa.UniqueConstraint("oracle_id", "step", name=op.f("uq_curator_gradient_steps_oracle_id_step")),
        sa.UniqueConstraint(
            "oracle_id",
            "partner_id",
            "idempotency_key",
            name=op.f("uq_curator_gradient_steps_oracle_id_partner_id_idempotency_key"),
        ),
    )
    op.create_index(op.f("ix_curator_gradient_steps_partner_id"), "curator_gradient_steps", ["partner_id"])
    op.create_table(
        "curator_oracle_grants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("partner_id", sa.Integer(), nullable=False),
        sa.Column("oracle_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["oracle_id"],
            ["curator_gradient_oracles.id"],
            name=op.f("fk_curator_oracle_grants_oracle_id_curator_gradient_oracles"),
        ),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["curator_partners.id"],
            name=op.f("fk_curator_oracle_grants_partner_id_curator_partners"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_curator_oracle_grants")),
        sa.UniqueConstraint(
            "partner_id", "oracle_id", name=op.f("uq_curator_oracle_grants_partner_id_oracle_id")
        ),
    )
    op.create_index(op.f("ix_curator_oracle_grants_oracle_id"), "curator_oracle_grants", ["oracle_id"])
    with op.batch_alter_table("curator_ledger_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gradient_oracle_id", sa.Integer(), nullable=True))
        batch_op.create_unique_constraint(
            batch_op.f("uq_curator_ledger_entries_gradient_oracle_id"), ["gradient_oracle_id"]
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_curator_ledger_entries_gradient_oracle_id_curator_gradient_oracles"),
            "curator_gradient_oracles",
            ["gradient_oracle_id"],
            ["id"],
        )


def downgrade() -> None:
    with op.batch_alter_table("curator_ledger_entries", schema=None) as batch_op:
        batch_op.drop_constraint(
            batch_op.f("fk_curator_ledger_entries_gradient_oracle_id_curator_gradient_oracles"),
            type_="foreignkey",
        )
        batch_op.drop_constraint(batch_op.f("uq_curator_ledger_entries_gradient_oracle_id"), type_="unique")
        batch_op.drop_column("gradient_oracle_id")
    op.drop_index(op.f("ix_curator_oracle_grants_oracle_id"), table_name="curator_oracle_grants")
    op.drop_table("curator_oracle_grants")
    op.drop_index(op.f("ix_curator_gradient_steps_partner_id"), table_name="curator_gradient_steps")
    op.drop_table("curator_gradient_steps")
    op.drop_index(op.f("ix_curator_gradient_oracles_dataset_id"), table_name="curator_gradient_oracles")
    op.drop_table("curator_gradient_oracles")
