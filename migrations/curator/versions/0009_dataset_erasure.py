"""dataset erasure: tombstones of erased datasets, their releases and gradient oracles

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10 09:00:00

``erased_at`` on ``curator_datasets``, ``curator_releases`` and ``curator_gradient_oracles``: set by
``DELETE /v1/datasets/{id}`` (``services.erasure``). The rows stay as tombstones, so the ledger, the query
logs and their hash chains keep every reference; the array files are gone.

The downgrade refuses while an erased dataset is on record: the older schema would take the tombstone for
a live dataset whose files are missing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("curator_datasets", "curator_releases", "curator_gradient_oracles")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    conn = op.get_bind()
    erased = [
        int(row[0])
        for row in conn.execute(sa.text("SELECT id FROM curator_datasets WHERE erased_at IS NOT NULL ORDER BY id"))
    ]
    if erased:
        raise RuntimeError(
            "cannot downgrade the curator's database below revision 0009: dataset(s) "
            + ", ".join(map(str, erased))
            + " were erased, and the older schema would take them for live datasets whose files are missing. "
            "Restore a backup taken before the upgrade instead."
        )
    for table in reversed(_TABLES):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("erased_at")
