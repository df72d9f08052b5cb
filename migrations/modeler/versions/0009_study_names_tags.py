"""studies gain a name and tags, and the list is filtered by them

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28 10:40:00

Issue 35:

* ``modeler_studies.name``: a name for people (null: none; every study before this revision).
* ``modeler_studies.tags``: the study's tags as written, a JSON list (``[]`` for every study before this
  revision).
* ``modeler_study_tags``: the same tags folded to lower case, one row per (study, tag), indexed by tag:
  ``GET /v1/studies?tag=`` filters on it in SQL, alike on SQLite and PostgreSQL.

The downgrade drops the names and tags (they are labels: nothing of a study's run, audit or privacy depends
on them).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("name", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("tags", sa.JSON(), server_default="[]", nullable=False))
    op.create_table(
        "modeler_study_tags",
        sa.Column("study_id", sa.String(length=32), nullable=False),
        sa.Column("tag", sa.String(length=50), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"], ["modeler_studies.id"], name=op.f("fk_modeler_study_tags_study_id_modeler_studies")
        ),
        sa.PrimaryKeyConstraint("study_id", "tag", name=op.f("pk_modeler_study_tags")),
    )
    with op.batch_alter_table("modeler_study_tags", schema=None) as batch_op:
        batch_op.create_index("ix_modeler_study_tags_tag", ["tag"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("modeler_study_tags", schema=None) as batch_op:
        batch_op.drop_index("ix_modeler_study_tags_tag")
    op.drop_table("modeler_study_tags")
    with op.batch_alter_table("modeler_studies", schema=None) as batch_op:
        batch_op.drop_column("tags")
        batch_op.drop_column("name")
