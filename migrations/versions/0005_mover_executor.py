"""The mover's executor: placements, moves, the journal of side effects, daemon ticks.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 19:30:00

``placements`` holds one row per instance launched for a managed job (its market, price, epoch,
idempotency key and life), ``job_moves`` one row per run of the move state machine,
``journal`` one row per side effect (intent before the call, result after it) and
``daemon_ticks`` one row per daemon round. ``managed_jobs`` gains what the executor knows of
each job (epoch, current placement, newest heartbeat and checkpoint).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "daemon_ticks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_daemon_ticks")),
    )
    with op.batch_alter_table("daemon_ticks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_daemon_ticks_started_at"), ["started_at"], unique=False)

    op.create_table(
        "placements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("market_id", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("instances", sa.Float(), nullable=False),
        sa.Column("usd_per_hour", sa.Float(), nullable=False),
        sa.Column("instance_id", sa.String(length=128), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=32), nullable=True),
        sa.CheckConstraint(
            "state IN ('launching', 'running', 'ended', 'failed')", name=op.f("ck_placements_state")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["managed_jobs.id"], name=op.f("fk_placements_job_id_managed_jobs")
        ),
        sa.ForeignKeyConstraint(["market_id"], ["markets.id"], name=op.f("fk_placements_market_id_markets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_placements")),
        sa.UniqueConstraint("key", name=op.f("uq_placements_key")),
    )
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_placements_job_id"), ["job_id"], unique=False)

    op.create_table(
        "job_moves",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("from_placement_id", sa.Integer(), nullable=True),
        sa.Column("to_placement_id", sa.Integer(), nullable=True),
        sa.Column("market_id", sa.Integer(), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=True),
        sa.Column("instances", sa.Float(), nullable=True),
        sa.Column("usd_per_hour", sa.Float(), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("then_state", sa.String(length=16), nullable=True),
        sa.Column("saving_usd", sa.Float(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("checkpoint_name", sa.Text(), nullable=True),
        sa.Column("checkpoint_step", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["from_placement_id"], ["placements.id"], name=op.f("fk_job_moves_from_placement_id_placements")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["managed_jobs.id"], name=op.f("fk_job_moves_job_id_managed_jobs")
        ),
        sa.ForeignKeyConstraint(["market_id"], ["markets.id"], name=op.f("fk_job_moves_market_id_markets")),
        sa.ForeignKeyConstraint(
            ["to_placement_id"], ["placements.id"], name=op.f("fk_job_moves_to_placement_id_placements")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_moves")),
    )
    with op.batch_alter_table("job_moves", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_moves_job_id"), ["job_id"], unique=False)
        batch_op.create_index("ix_job_moves_open", ["outcome", "job_id"], unique=False)

    op.create_table(
        "journal",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("move_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=160), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["managed_jobs.id"], name=op.f("fk_journal_job_id_managed_jobs")),
        sa.ForeignKeyConstraint(["move_id"], ["job_moves.id"], name=op.f("fk_journal_move_id_job_moves")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_journal")),
        sa.UniqueConstraint("key", name=op.f("uq_journal_key")),
    )
    with op.batch_alter_table("journal", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_journal_job_id"), ["job_id"], unique=False)
        batch_op.create_index("ix_journal_status", ["status"], unique=False)

    with op.batch_alter_table("managed_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("epoch", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("placement_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("steps", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("steps_per_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("checkpoint_name", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("checkpoint_step", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("managed_jobs", schema=None) as batch_op:
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("checkpoint_step")
        batch_op.drop_column("checkpoint_name")
        batch_op.drop_column("steps_per_s")
        batch_op.drop_column("steps")
        batch_op.drop_column("placement_id")
        batch_op.drop_column("epoch")

    with op.batch_alter_table("journal", schema=None) as batch_op:
        batch_op.drop_index("ix_journal_status")
        batch_op.drop_index(batch_op.f("ix_journal_job_id"))

    op.drop_table("journal")
    with op.batch_alter_table("job_moves", schema=None) as batch_op:
        batch_op.drop_index("ix_job_moves_open")
        batch_op.drop_index(batch_op.f("ix_job_moves_job_id"))

    op.drop_table("job_moves")
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_placements_job_id"))

    op.drop_table("placements")
    with op.batch_alter_table("daemon_ticks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_daemon_ticks_started_at"))

    op.drop_table("daemon_ticks")
