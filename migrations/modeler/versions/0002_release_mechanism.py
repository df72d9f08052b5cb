"""studies record their release's mechanism: gaussian (noise_std) or po-gp-ucb (lift, omega)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 17:00:00

Studies created before this revision ran on the paper's Algorithm 1 (``po-gp-ucb``), which carries no formal
guarantee; ``release_lift`` and ``release_omega`` become NULL-able because a Gaussian release has neither.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("release_mechanism", sa.String(length=16), nullable=False, server_default="po-gp-ucb")
        )
        batch_op.add_column(
            sa.Column("release_formal_guarantee", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("release_noise_std", sa.Double(), nullable=True))
        batch_op.alter_column("release_lift", existing_type=sa.String(length=16), nullable=True)
        batch_op.alter_column("release_omega", existing_type=sa.Double(), nullable=True)
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.alter_column("release_mechanism", existing_type=sa.String(length=16), server_default=None)
        batch_op.alter_column("release_formal_guarantee", existing_type=sa.Boolean(), server_default=None)


def downgrade() -> None:
    studies = sa.table(
        "modeler_studies", sa.column("release_lift", sa.String), sa.column("release_omega", sa.Double)
    )
    conn = op.get_bind()
    conn.execute(sa.update(studies).where(studies.c.release_lift.is_(None)).values(release_lift="auto"))
    conn.execute(sa.update(studies).where(studies.c.release_omega.is_(None)).values(release_omega=0.0))
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.alter_column("release_omega", existing_type=sa.Double(), nullable=False)
        batch_op.alter_column("release_lift", existing_type=sa.String(length=16), nullable=False)
        batch_op.drop_column("release_noise_std")
        batch_op.drop_column("release_formal_guarantee")
        batch_op.drop_column("release_mechanism")
