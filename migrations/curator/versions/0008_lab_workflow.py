"""lab workflow: sample ids, delivery of answers, corrections and supersessions of measured outcomes

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 09:00:00

* ``curator_datasets``: ``id_column`` (the upload's id column, if one was named) and the stored ids
  (``ids_path``, ``ids_sha256``: a .npy in the data dir, as the features and outcomes are).
* ``curator_queries.delivered_at``: when a partner was first sent the query complete. Every query already
  complete may have been read by its partner: it is taken as delivered at its completion, so its value can
  only be superseded (kept in the log beside the new one), never silently replaced.
* ``curator_query_corrections``: a changed outcome of a completed query, a link of its release's chain.
* ``curator_output_charges.answer_no``: 0 for a query's answer, k for its k-th supersession (one more
  answer about the person); the unique key becomes (query_id, answer_no).

The downgrade refuses while a correction or a sample id is on record (dropping them would lose the logs'
second values, which the chain's links cover, or the lab's only map from samples to rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("curator_datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("id_column", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("ids_path", sa.String(length=500), nullable=True))
        batch_op.add_column(sa.Column("ids_sha256", sa.String(length=64), nullable=True))
    with op.batch_alter_table("curator_queries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE curator_queries SET delivered_at = completed_at WHERE status = 'complete'")
    with op.batch_alter_table("curator_output_charges", schema=None) as batch_op:
        batch_op.add_column(sa.Column("answer_no", sa.Integer(), server_default="0", nullable=False))
        batch_op.drop_constraint(op.f("uq_curator_output_charges_query_id"), type_="unique")
        batch_op.create_unique_constraint(
            op.f("uq_curator_output_charges_query_id_answer_no"), ["query_id", "answer_no"]
        )
    op.create_table(
        "curator_query_corrections",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("query_id", sa.Integer(), nullable=False),
        sa.Column("release_id", sa.Integer(), nullable=False),
        sa.Column("partner_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("previous_y", sa.Double(), nullable=False),
        sa.Column("y", sa.Double(), nullable=False),
        sa.Column("previous_y_raw", sa.Double(), nullable=True),
        sa.Column("y_raw", sa.Double(), nullable=True),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("charged_epsilon", sa.Double(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("chain_seq", sa.Integer(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["curator_partners.id"],
            name=op.f("fk_curator_query_corrections_partner_id_curator_partners"),
        ),
        sa.ForeignKeyConstraint(
            ["query_id"],
            ["curator_queries.id"],
            name=op.f("fk_curator_query_corrections_query_id_curator_queries"),
        ),
        sa.ForeignKeyConstraint(
            ["release_id"],
            ["curator_releases.id"],
            name=op.f("fk_curator_query_corrections_release_id_curator_releases"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_curator_query_corrections")),
        sa.UniqueConstraint(
            "release_id", "chain_seq", name=op.f("uq_curator_query_corrections_release_id_chain_seq")
        ),
    )
    op.create_index(
        op.f("ix_curator_query_corrections_query_id"), "curator_query_corrections", ["query_id"], unique=False
    )
    op.create_index(
        op.f("ix_curator_query_corrections_partner_id"),
        "curator_query_corrections",
        ["partner_id"],
        unique=False,
    )


def downgrade() -> None:
    conn = op.get_bind()
    corrections = conn.execute(sa.text("SELECT count(*) FROM curator_query_corrections")).scalar_one()
    with_ids = [
        int(row[0])
        for row in conn.execute(
            sa.text("SELECT id FROM curator_datasets WHERE id_column IS NOT NULL ORDER BY id")
        )
    ]
    if corrections or with_ids:
        held = []
        if corrections:
            held.append(f"{corrections} correction(s) of measured outcomes (links of the query logs)")
        if with_ids:
            held.append(f"the sample ids of dataset(s) {', '.join(map(str, with_ids))}")
        raise RuntimeError(
            "cannot downgrade the curator's database below revision 0008: it holds "
            + " and ".join(held)
            + ", which the older schema cannot keep. Restore a backup taken before the upgrade instead."
        )
    op.drop_index(op.f("ix_curator_query_corrections_partner_id"), table_name="curator_query_corrections")
    op.drop_index(op.f("ix_curator_query_corrections_query_id"), table_name="curator_query_corrections")
    op.drop_table("curator_query_corrections")
    # a query's second answer (a supersession) exists only with a correction row: none is left here
    with op.batch_alter_table("curator_output_charges", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("uq_curator_output_charges_query_id_answer_no"), type_="unique")
        batch_op.create_unique_constraint(op.f("uq_curator_output_charges_query_id"), ["query_id"])
        batch_op.drop_column("answer_no")
    with op.batch_alter_table("curator_queries", schema=None) as batch_op:
        batch_op.drop_column("delivered_at")
    with op.batch_alter_table("curator_datasets", schema=None) as batch_op:
        batch_op.drop_column("ids_sha256")
        batch_op.drop_column("ids_path")
        batch_op.drop_column("id_column")
