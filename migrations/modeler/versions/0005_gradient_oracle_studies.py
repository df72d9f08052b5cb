"""studies over a curator gradient oracle (DP-GIBO): release columns nullable, the oracle and theta

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 09:30:00

A study of a ``gradient-oracle`` strategy (``dp-gibo``) runs on a curator's private gradient oracle instead
of a release: it has no release (``release_id``, ``release_*``, ``z_file``, ``z_sha256`` become nullable),
it names its oracle (``gradient_oracle_id``) and keeps the oracle's public parameters (``gradient_oracle``,
JSON) and the strategy's current point (``theta``, JSON). SQLite needs batch mode to drop NOT NULL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Columns only a release study has (NOT NULL before this revision), with their types.
_RELEASE_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("release_id", sa.Integer()),
    ("release_epsilon", sa.Double()),
    ("release_delta", sa.Double()),
    ("release_mechanism", sa.String(length=16)),
    ("release_formal_guarantee", sa.Boolean()),
    ("z_file", sa.String(length=255)),
    ("z_sha256", sa.String(length=64)),
)


def upgrade() -> None:
    with op.batch_alter_table("modeler_studies", schema=None) as batch:
        for column, type_ in _RELEASE_COLUMNS:
            batch.alter_column(column, existing_type=type_, nullable=True)
        batch.add_column(sa.Column("gradient_oracle_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("gradient_oracle", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("theta", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Only possible while every study runs on a release (the older layout has no gradient studies)."""
    conn = op.get_bind()
    gradient = conn.execute(
        sa.text("SELECT COUNT(*) FROM modeler_studies WHERE gradient_oracle_id IS NOT NULL")
    ).scalar()
    if gradient:
        raise RuntimeError(
            f"cannot downgrade below 0005: the database holds {gradient} studies over a gradient oracle, "
            "which the older layout cannot represent"
        )
    with op.batch_alter_table("modeler_studies", schema=None) as batch:
        batch.drop_column("theta")
        batch.drop_column("gradient_oracle")
        batch.drop_column("gradient_oracle_id")
        for column, type_ in _RELEASE_COLUMNS:
            batch.alter_column(column, existing_type=type_, nullable=False)
