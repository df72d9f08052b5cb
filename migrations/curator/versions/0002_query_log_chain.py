"""query log hash chain: per-query chain links and a per-release head

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 05:10:00

Existing complete queries are chained in order of completion (then id), exactly as the service would
have chained them, so an upgraded database verifies.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from shared.servicekit.hashchain import GENESIS_HASH, link_hash

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("curator_queries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chain_seq", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("prev_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("hash", sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint(
            batch_op.f("uq_curator_queries_release_id_chain_seq"), ["release_id", "chain_seq"]
        )
    with op.batch_alter_table("curator_releases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chain_count", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(
            sa.Column("chain_head", sa.String(length=64), nullable=False, server_default=GENESIS_HASH)
        )

    # Backfill (a deployment upgraded with queries already on record).
    from curator_service.querylog import query_payload  # the one definition of what a link covers

    conn = op.get_bind()
    queries = sa.table(
        "curator_queries",
        sa.column("id", sa.Integer),
        sa.column("release_id", sa.Integer),
        sa.column("partner_id", sa.Integer),
        sa.column("row_index", sa.Integer),
        sa.column("status", sa.String),
        sa.column("y", sa.Double),
        sa.column("idempotency_key", sa.String),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("completed_at", sa.DateTime(timezone=True)),
        sa.column("chain_seq", sa.Integer),
        sa.column("prev_hash", sa.String),
        sa.column("hash", sa.String),
    )
    releases = sa.table(
        "curator_releases",
        sa.column("id", sa.Integer),
        sa.column("chain_count", sa.Integer),
        sa.column("chain_head", sa.String),
    )
    rows = conn.execute(
        sa.select(queries)
        .where(queries.c.status == "complete")
        .order_by(queries.c.release_id, queries.c.completed_at, queries.c.id)
    ).all()
    heads: dict[int, tuple[int, str]] = {}
    for row in rows:
        seq, prev = heads.get(row.release_id, (0, GENESIS_HASH))
        seq += 1
        digest = link_hash(prev, query_payload(row, seq))
        conn.execute(
            sa.update(queries)
            .where(queries.c.id == row.id)
            .values(chain_seq=seq, prev_hash=prev, hash=digest)
        )
        heads[row.release_id] = (seq, digest)
    for release_id, (count, head) in heads.items():
        conn.execute(
            sa.update(releases).where(releases.c.id == release_id).values(chain_count=count, chain_head=head)
        )


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35 has it): a batch "move and copy" of curator_releases would drop a
    # table that curator_queries references, which SQLite's enforced foreign keys refuse.
    op.drop_column("curator_releases", "chain_head")
    op.drop_column("curator_releases", "chain_count")
    with op.batch_alter_table("curator_queries", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_curator_queries_release_id_chain_seq"), type_="unique")
        batch_op.drop_column("hash")
        batch_op.drop_column("prev_hash")
        batch_op.drop_column("chain_seq")
