"""Initial modeler schema: studies and the hash-chained audit log (tables prefixed modeler_).

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "modeler_studies",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("curator_url", sa.String(length=2048), nullable=False),
        sa.Column("curator_token_enc", sa.Text(), nullable=False),
        sa.Column("release_id", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("r", sa.Integer(), nullable=False),
        sa.Column("release_epsilon", sa.Double(), nullable=False),
        sa.Column("release_delta", sa.Double(), nullable=False),
        sa.Column("release_lift", sa.String(length=16), nullable=False),
        sa.Column("release_omega", sa.Double(), nullable=False),
        sa.Column("z_file", sa.String(length=255), nullable=False),
        sa.Column("z_sha256", sa.String(length=64), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("iterations_total", sa.Integer(), nullable=False),
        sa.Column("delta_prime", sa.Double(), nullable=False),
        sa.Column("hyperparameters", sa.JSON(), nullable=False),
        sa.Column("exclude_queried", sa.Boolean(), nullable=False),
        sa.Column("initial_points", sa.Integer(), nullable=False),
        sa.Column("initial_indices", sa.JSON(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("run_target", sa.Integer(), nullable=True),
        sa.Column("iterations_done", sa.Integer(), nullable=False),
        sa.Column("audit_head", sa.String(length=64), nullable=False),
        sa.Column("best_index", sa.Integer(), nullable=True),
        sa.Column("best_y", sa.Double(), nullable=True),
        sa.Column("pending_iteration", sa.Integer(), nullable=True),
        sa.Column("pending_index", sa.Integer(), nullable=True),
        sa.Column("pending_suggestion", sa.JSON(), nullable=True),
        sa.Column("pending_query_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modeler_studies")),
    )
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_modeler_studies_status"), ["status"], unique=False)

    op.create_table(
        "modeler_audit_entries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("row_index", sa.Integer(), nullable=False),
        sa.Column("y", sa.Double(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("acquisition", sa.Double(), nullable=False),
        sa.Column("beta", sa.Double(), nullable=False),
        sa.Column("mean", sa.Double(), nullable=False),
        sa.Column("std", sa.Double(), nullable=False),
        sa.Column("hyperparameters", sa.Text(), nullable=False),
        sa.Column("curator_query_id", sa.Integer(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["modeler_studies.id"],
            name=op.f("fk_modeler_audit_entries_study_id_modeler_studies"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modeler_audit_entries")),
        sa.UniqueConstraint(
            "study_id", "iteration", name=op.f("uq_modeler_audit_entries_study_id_iteration")
        ),
        sa.UniqueConstraint("study_id", "seq", name=op.f("uq_modeler_audit_entries_study_id_seq")),
    )
    with op.batch_alter_table("modeler_audit_entries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_modeler_audit_entries_study_id"), ["study_id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("modeler_audit_entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_modeler_audit_entries_study_id"))

    op.drop_table("modeler_audit_entries")
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_modeler_studies_status"))

    op.drop_table("modeler_studies")
