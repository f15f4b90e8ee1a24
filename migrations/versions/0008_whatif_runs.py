"""Stored what-if replays: ``spotopt whatif --save NAME`` for the dashboard's what-if page.

Revision ID: 0008_i24_whatif_runs
Revises: 0007
Create Date: 2026-11-25 05:00:00

``whatif_runs`` holds a replay's parameters under a unique name, ``whatif_results`` its job x
strategy rows and ``whatif_placements`` where each job ran (one-start replays); deleting a run
deletes its rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_i24_whatif_runs"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "whatif_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("synthetic", sa.Boolean(), nullable=False),
        sa.Column("first_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("starts", sa.Integer(), nullable=False),
        sa.Column("every_hours", sa.Float(), nullable=False),
        sa.Column("window_hours", sa.Float(), nullable=False),
        sa.Column("preemptions", sa.String(length=16), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("billing", sa.String(length=16), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_whatif_runs")),
        sa.UniqueConstraint("name", name=op.f("uq_whatif_runs_name")),
    )
    op.create_table(
        "whatif_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("strategy", sa.String(length=64), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("bound_usd", sa.Float(), nullable=True),
        sa.Column("ratio_vs_spot", sa.Float(), nullable=True),
        sa.Column("finish_hours", sa.Float(), nullable=True),
        sa.Column("deadline_met", sa.Float(), nullable=True),
        sa.Column("moves", sa.Float(), nullable=False),
        sa.Column("preemptions", sa.Float(), nullable=False),
        sa.Column("unfinished_starts", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["whatif_runs.id"],
            name=op.f("fk_whatif_results_run_id_whatif_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_whatif_results")),
        sa.UniqueConstraint("run_id", "job", "strategy", name=op.f("uq_whatif_results_run_id")),
    )
    op.create_index("ix_whatif_results_run_id", "whatif_results", ["run_id"], unique=False)
    op.create_table(
        "whatif_placements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("strategy", sa.String(length=64), nullable=False),
        sa.Column("from_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("to_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cloud", sa.String(length=16), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("zone", sa.String(length=64), nullable=True),
        sa.Column("instance_type", sa.String(length=128), nullable=False),
        sa.Column("market", sa.String(length=16), nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["whatif_runs.id"],
            name=op.f("fk_whatif_placements_run_id_whatif_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_whatif_placements")),
    )
    op.create_index("ix_whatif_placements_run_id", "whatif_placements", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_whatif_placements_run_id", table_name="whatif_placements")
    op.drop_table("whatif_placements")
    op.drop_index("ix_whatif_results_run_id", table_name="whatif_results")
    op.drop_table("whatif_results")
    op.drop_table("whatif_runs")
