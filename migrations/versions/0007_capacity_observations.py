"""Capacity observations: whether a spot market could launch an instance, by time and source.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 09:00:00

One row per (market, time, source), the idempotency key as for price points: ``available`` (one
more instance could be launched), and where known ``launched`` of ``requested`` instances. An
observation holds until the market's next one (any source). Written by
``spotopt import availability`` and by the daemon's launch attempts; read by
``spotopt.db.queries.capacity_history`` and the ``availability`` report.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "capacity_observations",
        sa.Column("market_id", sa.Integer(), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("available", sa.Boolean(), nullable=False),
        sa.Column("launched", sa.Integer(), nullable=True),
        sa.Column("requested", sa.Integer(), nullable=True),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["market_id"], ["markets.id"], name=op.f("fk_capacity_observations_market_id_markets")
        ),
        sa.PrimaryKeyConstraint("market_id", "observed_at", "source", name=op.f("pk_capacity_observations")),
    )
    with op.batch_alter_table("capacity_observations", schema=None) as batch_op:
        batch_op.create_index("ix_capacity_observations_observed_at", ["observed_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("capacity_observations", schema=None) as batch_op:
        batch_op.drop_index("ix_capacity_observations_observed_at")
    op.drop_table("capacity_observations")
