"""output privacy: a partner's CTL grant, privatised answers, the per-person output ledger

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 07:10:00

* ``curator_partners.output_privacy``: the partner's CTL(epsilon) parameters (NULL: outcomes answered raw).
* ``curator_queries``: ``output_key`` (the privatised answer a query is about), ``source_query_id`` (a
  cached repeat points at the query that drew the noise), ``charged_epsilon``, ``y_raw`` (kept only when the
  curator opted in).
* ``curator_output_charges``: one entry per answer about a person. Every query already on record was
  answered raw, so each gets an entry with epsilon NULL (unbounded): the privacy report then says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("curator_partners", schema=None) as batch_op:
        batch_op.add_column(sa.Column("output_privacy", sa.JSON(), nullable=True))
    with op.batch_alter_table("curator_queries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("output_key", sa.String(length=120), nullable=True))
        batch_op.add_column(sa.Column("source_query_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("charged_epsilon", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("y_raw", sa.Double(), nullable=True))
        batch_op.create_index(batch_op.f("ix_curator_queries_output_key"), ["output_key"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_curator_queries_source_query_id"), ["source_query_id"], unique=False
        )
    op.create_table(
        "curator_output_charges",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("population_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("row_index", sa.Integer(), nullable=False),
        sa.Column("query_id", sa.Integer(), nullable=False),
        sa.Column("partner_id", sa.Integer(), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["curator_datasets.id"],
            name=op.f("fk_curator_output_charges_dataset_id_curator_datasets"),
        ),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["curator_partners.id"],
            name=op.f("fk_curator_output_charges_partner_id_curator_partners"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_curator_output_charges")),
        sa.UniqueConstraint("query_id", name=op.f("uq_curator_output_charges_query_id")),
    )
    op.create_index(
        "ix_curator_output_charges_population_row",
        "curator_output_charges",
        ["population_id", "dataset_id", "row_index"],
        unique=False,
    )
    # Every outcome answered before this revision left as it was measured: unbounded output epsilon.
    op.execute(
        "INSERT INTO curator_output_charges "
        "(population_id, dataset_id, row_index, query_id, partner_id, epsilon, created_at) "
        "SELECT d.population_id, d.id, q.row_index, q.id, q.partner_id, NULL, q.created_at "
        "FROM curator_queries q JOIN curator_releases r ON r.id = q.release_id "
        "JOIN curator_datasets d ON d.id = r.dataset_id ORDER BY q.id"
    )


def downgrade() -> None:
    op.drop_index("ix_curator_output_charges_population_row", table_name="curator_output_charges")
    op.drop_table("curator_output_charges")
    with op.batch_alter_table("curator_queries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_curator_queries_source_query_id"))
        batch_op.drop_index(batch_op.f("ix_curator_queries_output_key"))
        batch_op.drop_column("y_raw")
        batch_op.drop_column("charged_epsilon")
        batch_op.drop_column("source_query_id")
        batch_op.drop_column("output_key")
    with op.batch_alter_table("curator_partners", schema=None) as batch_op:
        batch_op.drop_column("output_privacy")
