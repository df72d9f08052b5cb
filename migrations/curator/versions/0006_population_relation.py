"""one relation per population: column signatures, reference scales, group size, guarantees on the ledger

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28 09:00:00

* ``curator_datasets``: ``column_signatures`` (per column, features and outcome: a bottom-k sketch of the
  standardised values and the raw standard deviation; NULL for older uploads, which keep matching by their
  exact hashes), ``reference_factors`` (per feature: how many of the population's reference units one of
  this dataset's scaled units is) and ``reference_factor`` (their largest, 1 for older uploads),
  ``rows_per_person`` (1) and ``acknowledged_distinct_people`` (false).
* ``curator_populations.reference``: the population's neighbouring relation, the declared scale of every
  feature at its first upload (NULL for older populations: built from their datasets when one is next
  joined).
* ``curator_ledger_entries``: ``formal_guarantee`` (false for Algorithm 1, ``allow_large_delta`` releases and
  releases of ``max_norm`` datasets, as recorded on the release) and ``nominal_epsilon`` (the epsilon asked
  for; ``epsilon`` is what the population was charged).
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
    with op.batch_alter_table("curator_datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("column_signatures", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("reference_factors", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("reference_factor", sa.Double(), nullable=False, server_default=sa.text("1.0"))
        )
        batch_op.add_column(sa.Column("rows_per_person", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(
            sa.Column(
                "acknowledged_distinct_people", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )
    with op.batch_alter_table("curator_populations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reference", sa.JSON(), nullable=True))
    with op.batch_alter_table("curator_ledger_entries", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("formal_guarantee", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch_op.add_column(sa.Column("nominal_epsilon", sa.Double(), nullable=True))

    conn = op.get_bind()
    ledger = sa.table(
        "curator_ledger_entries",
        sa.column("release_id", sa.Integer),
        sa.column("formal_guarantee", sa.Boolean),
        sa.column("epsilon", sa.Double),
        sa.column("nominal_epsilon", sa.Double),
    )
    releases = sa.table(
        "curator_releases", sa.column("id", sa.Integer), sa.column("formal_guarantee", sa.Boolean)
    )
    conn.execute(sa.update(ledger).values(nominal_epsilon=ledger.c.epsilon))
    no_guarantee = sa.select(releases.c.id).where(releases.c.formal_guarantee == sa.false())
    conn.execute(
        sa.update(ledger).where(ledger.c.release_id.in_(no_guarantee)).values(formal_guarantee=False)
    )


def downgrade() -> None:
    with op.batch_alter_table("curator_ledger_entries", schema=None) as batch_op:
        batch_op.drop_column("nominal_epsilon")
        batch_op.drop_column("formal_guarantee")
    with op.batch_alter_table("curator_populations", schema=None) as batch_op:
        batch_op.drop_column("reference")
    with op.batch_alter_table("curator_datasets", schema=None) as batch_op:
        batch_op.drop_column("acknowledged_distinct_people")
        batch_op.drop_column("rows_per_person")
        batch_op.drop_column("reference_factor")
        batch_op.drop_column("reference_factors")
        batch_op.drop_column("column_signatures")
