"""federation receipts: an accepted submission leaves a record that outlives its round's purge

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 10:00:00

``modeler_federation_receipts`` (issue 32): one row per accepted submission (round, agent, Idempotency-Key,
accepted time, and a salted HMAC of the request body to tell a retry from another submission; never the
omega), kept when the round closes and its submissions are deleted. ``modeler_federation_rounds.receipts``
says whether a round keeps them: the open rounds at this upgrade get receipts for the submissions they
hold (so they are complete), while a round closed before it has none (its submissions were purged: an
agent's standing in it is unknown, and ``GET .../rounds/{t}`` answers ``you: null`` there).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

rounds = sa.table(
    "modeler_federation_rounds",
    sa.column("id", sa.Integer),
    sa.column("status", sa.String),
    sa.column("receipts", sa.Boolean),
)
submissions = sa.table(
    "modeler_federation_submissions",
    sa.column("round_id", sa.Integer),
    sa.column("agent_id", sa.String),
    sa.column("idempotency_key", sa.String),
    sa.column("omega", sa.JSON),
    sa.column("created_at", sa.DateTime(timezone=True)),
)
receipts = sa.table(
    "modeler_federation_receipts",
    sa.column("round_id", sa.Integer),
    sa.column("agent_id", sa.String),
    sa.column("idempotency_key", sa.String),
    sa.column("request_salt", sa.String),
    sa.column("request_digest", sa.String),
    sa.column("accepted_at", sa.DateTime(timezone=True)),
)


def _digest(salt: str, omega: list[float]) -> str:
    """The same digest as ``modeler_service.federations.request_digest`` (kept here: a migration does not
    import the code it predates)."""
    canonical = json.dumps([float(v) for v in omega], separators=(",", ":"))
    return hmac.new(bytes.fromhex(salt), canonical.encode("utf-8"), hashlib.sha256).hexdigest()


def upgrade() -> None:
    with op.batch_alter_table("modeler_federation_rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("receipts", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_table(
        "modeler_federation_receipts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.String(length=32), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_salt", sa.String(length=32), nullable=False),
        sa.Column("request_digest", sa.String(length=64), nullable=False),
        sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["modeler_federation_agents.id"],
            name=op.f("fk_modeler_federation_receipts_agent_id_modeler_federation_agents"),
        ),
        sa.ForeignKeyConstraint(
            ["round_id"],
            ["modeler_federation_rounds.id"],
            name=op.f("fk_modeler_federation_receipts_round_id_modeler_federation_rounds"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modeler_federation_receipts")),
        sa.UniqueConstraint(
            "agent_id",
            "idempotency_key",
            name=op.f("uq_modeler_federation_receipts_agent_id_idempotency_key"),
        ),
        sa.UniqueConstraint(
            "round_id", "agent_id", name=op.f("uq_modeler_federation_receipts_round_id_agent_id")
        ),
    )
    with op.batch_alter_table("modeler_federation_receipts", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_modeler_federation_receipts_round_id"), ["round_id"], unique=False
        )

    # the submissions stored now are all in open rounds (a close deletes its round's): receipts for them
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(
            submissions.c.round_id,
            submissions.c.agent_id,
            submissions.c.idempotency_key,
            submissions.c.omega,
            submissions.c.created_at,
        )
        .select_from(submissions.join(rounds, rounds.c.id == submissions.c.round_id))
        .where(rounds.c.status == "open")
    ).all()
    backfill = []
    for round_id, agent_id, key, omega, created_at in rows:
        salt = secrets.token_hex(16)
        backfill.append(
            {
                "round_id": round_id,
                "agent_id": agent_id,
                "idempotency_key": key,
                "request_salt": salt,
                "request_digest": _digest(salt, omega),
                "accepted_at": created_at,
            }
        )
    if backfill:
        conn.execute(receipts.insert(), backfill)
    conn.execute(rounds.update().where(rounds.c.status == "open").values(receipts=True))


def downgrade() -> None:
    op.drop_table("modeler_federation_receipts")
    with op.batch_alter_table("modeler_federation_rounds", schema=None) as batch_op:
        batch_op.drop_column("receipts")
