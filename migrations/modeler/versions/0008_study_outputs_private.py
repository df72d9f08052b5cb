"""studies remember whether their grant privatises outcomes; the audit records the curator's supersessions

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28 10:00:00

Issue 34:

* ``modeler_studies.outputs_private``: true when the partner token's grant answered with output privacy
  (CTL) when the study was created, false when it answered raw; null for a study created before this
  revision (unknown) and for gradient-oracle studies. The best answer is then labelled noisy.
* ``modeler_audit_supersessions``: a value the curator superseded after the study had been sent it (the
  lab re-measured a sample), with both values; append-only and hash-chained per study, apart from the audit
  entries (whose ``seq`` is the query number). ``modeler_studies.supersessions_done`` and
  ``supersessions_head`` are that chain's length and head (0 and the genesis hash for every study before
  this revision: none had any), ``awaits_measurements`` whether a round of the study waited for a
  measurement (false before this revision: such a study is picked up at its next waiting round, or by
  ``POST /v1/studies/{id}/audit/sync``).

The downgrade refuses while any supersession is recorded (the older layout cannot hold them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The hash before the first link of a chain (``shared.servicekit.hashchain.GENESIS_HASH``; kept here: a
#: migration does not import the code it predates).
GENESIS_HASH = "0" * 64


def upgrade() -> None:
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("outputs_private", sa.Boolean(), nullable=True))
        batch_op.add_column(
            sa.Column("awaits_measurements", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch_op.add_column(sa.Column("supersessions_done", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(
            sa.Column("supersessions_head", sa.String(length=64), server_default=GENESIS_HASH, nullable=False)
        )
    op.create_table(
        "modeler_audit_supersessions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("correction_id", sa.Integer(), nullable=False),
        sa.Column("curator_query_id", sa.Integer(), nullable=False),
        sa.Column("audit_seq", sa.Integer(), nullable=False),
        sa.Column("previous_y", sa.Double(), nullable=False),
        sa.Column("y", sa.Double(), nullable=False),
        sa.Column("curator_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["modeler_studies.id"],
            name=op.f("fk_modeler_audit_supersessions_study_id_modeler_studies"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modeler_audit_supersessions")),
        sa.UniqueConstraint(
            "study_id", "correction_id", name=op.f("uq_modeler_audit_supersessions_study_id_correction_id")
        ),
        sa.UniqueConstraint("study_id", "seq", name=op.f("uq_modeler_audit_supersessions_study_id_seq")),
    )
    with op.batch_alter_table("modeler_audit_supersessions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_modeler_audit_supersessions_study_id"), ["study_id"], unique=False
        )


def downgrade() -> None:
    """Only possible while no supersession is recorded (the older layout has nowhere to keep them)."""
    conn = op.get_bind()
    recorded = conn.execute(sa.text("SELECT COUNT(*) FROM modeler_audit_supersessions")).scalar()
    if recorded:
        raise RuntimeError(
            f"cannot downgrade below 0008: the database holds {recorded} supersessions recorded in studies' "
            "audit logs, which the older layout cannot represent"
        )
    with op.batch_alter_table("modeler_audit_supersessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_modeler_audit_supersessions_study_id"))
    op.drop_table("modeler_audit_supersessions")
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.drop_column("supersessions_head")
        batch_op.drop_column("supersessions_done")
        batch_op.drop_column("awaits_measurements")
        batch_op.drop_column("outputs_private")
