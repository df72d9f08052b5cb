"""partner tokens: a partner may hold several tokens at once (rotation with an overlap window)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28 10:00:00

* ``curator_partner_tokens``: one row per bearer token of a partner (its sha256, unique; created, revoked).
  Every partner's token moves here (its id is the partner's first token), and ``curator_partners.token_hash``
  is dropped: a token authenticates while neither it nor its partner is revoked.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "curator_partner_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("partner_id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["curator_partners.id"],
            name=op.f("fk_curator_partner_tokens_partner_id_curator_partners"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_curator_partner_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_curator_partner_tokens_token_hash")),
    )
    op.create_index(
        op.f("ix_curator_partner_tokens_partner_id"), "curator_partner_tokens", ["partner_id"], unique=False
    )
    op.execute(
        "INSERT INTO curator_partner_tokens (partner_id, token_hash, created_at) "
        "SELECT id, token_hash, created_at FROM curator_partners ORDER BY id"
    )
    with op.batch_alter_table("curator_partners", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("uq_curator_partners_token_hash"), type_="unique")
        batch_op.drop_column("token_hash")


def downgrade() -> None:
    with op.batch_alter_table("curator_partners", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_hash", sa.String(length=64), nullable=True))
    op.execute(
        "UPDATE curator_partners SET token_hash = (SELECT t.token_hash FROM curator_partner_tokens t "
        "WHERE t.partner_id = curator_partners.id ORDER BY t.id LIMIT 1)"
    )
    with op.batch_alter_table("curator_partners", schema=None) as batch_op:
        batch_op.alter_column("token_hash", existing_type=sa.String(length=64), nullable=False)
        batch_op.create_unique_constraint(op.f("uq_curator_partners_token_hash"), ["token_hash"])
    op.drop_index(op.f("ix_curator_partner_tokens_partner_id"), table_name="curator_partner_tokens")
    op.drop_table("curator_partner_tokens")
