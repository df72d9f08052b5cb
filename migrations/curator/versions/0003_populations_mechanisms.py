"""populations own the privacy budget; releases name their mechanism; ledger charges keep native parameters

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 16:10:00

* ``curator_populations``: the people behind one or more datasets, with the (epsilon, delta) budget that
  used to sit on each dataset. Every existing dataset gets a population of its own with its old budget.
* ``curator_datasets``: ``population_id``, ``population_reason``, the content fingerprints ``rows_hash`` and
  ``column_hashes`` (NULL for older uploads); the budget columns move to the population.
* ``curator_releases``: ``mechanism`` (existing releases were Algorithm 1: ``po-gp-ucb``), ``noise_std``,
  ``allow_large_delta``, ``acknowledged_no_guarantee``; ``lift``, ``lifted``, ``omega`` and ``sigma_min``
  become NULL-able (the Gaussian release has none of them). ``formal_guarantee`` turns false on every
  existing release: Algorithm 1 is not differentially private when n > d + 1.
* ``curator_ledger_entries``: ``population_id``, ``mechanism`` and ``native`` (the mechanism's own
  parameters, for tighter accountants).

SQLite rebuilds tables for some of these steps; ``curator_service.db.upgrade`` runs migrations with its
foreign-key enforcement off and checks ``PRAGMA foreign_key_check`` before committing.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_populations = sa.table(
    "curator_populations",
    sa.column("id", sa.Integer),
    sa.column("name", sa.String),
    sa.column("epsilon_budget", sa.Double),
    sa.column("delta_budget", sa.Double),
    sa.column("created_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    op.create_table(
        "curator_populations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("epsilon_budget", sa.Double(), nullable=False),
        sa.Column("delta_budget", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_curator_populations")),
        sa.UniqueConstraint("name", name=op.f("uq_curator_populations_name")),
    )
    with op.batch_alter_table("curator_datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("population_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("population_reason", sa.String(length=300), nullable=True))
        batch_op.add_column(sa.Column("rows_hash", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("column_hashes", sa.JSON(), nullable=True))

    conn = op.get_bind()
    datasets = sa.table(
        "curator_datasets",
        sa.column("id", sa.Integer),
        sa.column("epsilon_budget", sa.Double),
        sa.column("delta_budget", sa.Double),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("population_id", sa.Integer),
        sa.column("population_reason", sa.String),
    )
    for ds in conn.execute(sa.select(datasets).order_by(datasets.c.id)).all():
        pid = conn.execute(
            sa.insert(_populations)
            .values(epsilon_budget=ds.epsilon_budget, delta_budget=ds.delta_budget, created_at=ds.created_at)
            .returning(_populations.c.id)
        ).scalar_one()
        conn.execute(
            sa.update(datasets)
            .where(datasets.c.id == ds.id)
            .values(population_id=pid, population_reason="its own population (uploaded before populations)")
        )

    with op.batch_alter_table("curator_datasets", schema=None) as batch_op:
        batch_op.alter_column("population_id", existing_type=sa.Integer(), nullable=False)
        batch_op.create_index(
            batch_op.f("ix_curator_datasets_population_id"), ["population_id"], unique=False
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_curator_datasets_population_id_curator_populations"),
            "curator_populations",
            ["population_id"],
            ["id"],
        )
        batch_op.drop_column("epsilon_budget")
        batch_op.drop_column("delta_budget")

    with op.batch_alter_table("curator_releases", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("mechanism", sa.String(length=16), nullable=False, server_default="po-gp-ucb")
        )
        batch_op.add_column(sa.Column("noise_std", sa.Double(), nullable=True))
        batch_op.add_column(
            sa.Column("allow_large_delta", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(
            sa.Column("acknowledged_no_guarantee", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.alter_column("lift", existing_type=sa.String(length=16), nullable=True)
        batch_op.alter_column("lifted", existing_type=sa.Boolean(), nullable=True)
        batch_op.alter_column("omega", existing_type=sa.Double(), nullable=True)
        batch_op.alter_column("sigma_min", existing_type=sa.Double(), nullable=True)
    with op.batch_alter_table("curator_releases", schema=None) as batch_op:
        batch_op.alter_column("mechanism", existing_type=sa.String(length=16), server_default=None)
    releases = sa.table("curator_releases", sa.column("formal_guarantee", sa.Boolean))
    conn.execute(sa.update(releases).values(formal_guarantee=False))

    with op.batch_alter_table("curator_ledger_entries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("population_id", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("mechanism", sa.String(length=16), nullable=False, server_default="po-gp-ucb")
        )
        batch_op.add_column(sa.Column("native", sa.JSON(), nullable=True))
    ledger = sa.table(
        "curator_ledger_entries",
        sa.column("dataset_id", sa.Integer),
        sa.column("population_id", sa.Integer),
    )
    ds2 = sa.table("curator_datasets", sa.column("id", sa.Integer), sa.column("population_id", sa.Integer))
    conn.execute(
        sa.update(ledger).values(
            population_id=sa.select(ds2.c.population_id)
            .where(ds2.c.id == ledger.c.dataset_id)
            .scalar_subquery()
        )
    )
    with op.batch_alter_table("curator_ledger_entries", schema=None) as batch_op:
        batch_op.alter_column("population_id", existing_type=sa.Integer(), nullable=False)
        batch_op.alter_column("mechanism", existing_type=sa.String(length=16), server_default=None)
        batch_op.create_index(
            batch_op.f("ix_curator_ledger_entries_population_id"), ["population_id"], unique=False
        )
        batch_op.create_foreign_key(
            batch_op.f("fk_curator_ledger_entries_population_id_curator_populations"),
            "curator_populations",
            ["population_id"],
            ["id"],
        )


def downgrade() -> None:
    # Budgets go back onto the datasets (each dataset takes its population's); Gaussian releases keep their
    # rows but get Algorithm 1's columns filled with neutral values (lift "auto", not lifted, 0).
    conn = op.get_bind()
    with op.batch_alter_table("curator_ledger_entries", schema=None) as batch_op:
        batch_op.drop_constraint(
            batch_op.f("fk_curator_ledger_entries_population_id_curator_populations"), type_="foreignkey"
        )
        batch_op.drop_index(batch_op.f("ix_curator_ledger_entries_population_id"))
        batch_op.drop_column("native")
        batch_op.drop_column("mechanism")
        batch_op.drop_column("population_id")

    releases = sa.table(
        "curator_releases",
        sa.column("lift", sa.String),
        sa.column("lifted", sa.Boolean),
        sa.column("omega", sa.Double),
        sa.column("sigma_min", sa.Double),
    )
    conn.execute(sa.update(releases).where(releases.c.lift.is_(None)).values(lift="auto"))
    conn.execute(sa.update(releases).where(releases.c.lifted.is_(None)).values(lifted=False))
    conn.execute(sa.update(releases).where(releases.c.omega.is_(None)).values(omega=0.0))
    conn.execute(sa.update(releases).where(releases.c.sigma_min.is_(None)).values(sigma_min=0.0))
    with op.batch_alter_table("curator_releases", schema=None) as batch_op:
        batch_op.alter_column("sigma_min", existing_type=sa.Double(), nullable=False)
        batch_op.alter_column("omega", existing_type=sa.Double(), nullable=False)
        batch_op.alter_column("lifted", existing_type=sa.Boolean(), nullable=False)
        batch_op.alter_column("lift", existing_type=sa.String(length=16), nullable=False)
        batch_op.drop_column("acknowledged_no_guarantee")
        batch_op.drop_column("allow_large_delta")
        batch_op.drop_column("noise_std")
        batch_op.drop_column("mechanism")

    with op.batch_alter_table("curator_datasets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("epsilon_budget", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("delta_budget", sa.Double(), nullable=True))
    datasets = sa.table(
        "curator_datasets",
        sa.column("population_id", sa.Integer),
        sa.column("epsilon_budget", sa.Double),
        sa.column("delta_budget", sa.Double),
    )
    for budget in ("epsilon_budget", "delta_budget"):
        conn.execute(
            sa.update(datasets).values(
                {
                    budget: sa.select(_populations.c[budget])
                    .where(_populations.c.id == datasets.c.population_id)
                    .scalar_subquery()
                }
            )
        )
    with op.batch_alter_table("curator_datasets", schema=None) as batch_op:
        batch_op.alter_column("epsilon_budget", existing_type=sa.Double(), nullable=False)
        batch_op.alter_column("delta_budget", existing_type=sa.Double(), nullable=False)
        batch_op.drop_constraint(
            batch_op.f("fk_curator_datasets_population_id_curator_populations"), type_="foreignkey"
        )
        batch_op.drop_index(batch_op.f("ix_curator_datasets_population_id"))
        batch_op.drop_column("column_hashes")
        batch_op.drop_column("rows_hash")
        batch_op.drop_column("population_reason")
        batch_op.drop_column("population_id")
    op.drop_table("curator_populations")
