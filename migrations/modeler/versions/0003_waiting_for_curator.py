"""studies wait for an unreachable curator: when the runner tries again, and how many attempts failed

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 18:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("retry_attempts", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    studies = sa.table("modeler_studies", sa.column("status", sa.String))
    op.get_bind().execute(
        sa.update(studies).where(studies.c.status == "waiting_for_curator").values(status="ready")
    )
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.drop_column("retry_attempts")
        batch_op.drop_column("retry_at")
