"""Managed jobs: the mover's jobs (validated spec, budget, state) and every state transition.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 18:00:00

``managed_jobs`` holds one row per submitted job, ``job_events`` one row per state transition
(time, from, to, reason). The allowed states are checked by the database as well as by
``spotopt.mover.jobs.check_transition``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Frozen here (not imported from the models): a migration must not change when the code does.
STATES = (
    "pending",
    "launching",
    "running",
    "moving",
    "recovering",
    "done",
    "failed",
    "cancelled",
    "over-budget",
)


def _in(column: str) -> str:
    return "{} IN ({})".format(column, ", ".join(f"'{s}'" for s in STATES))


def upgrade() -> None:
    op.create_table(
        "managed_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("spec_sha256", sa.String(length=64), nullable=False),
        sa.Column("run_command", sa.Text(), nullable=False),
        sa.Column("workdir", sa.Text(), nullable=True),
        sa.Column("checkpoint_uri", sa.Text(), nullable=False),
        sa.Column("budget_usd", sa.Float(), nullable=False),
        sa.Column("max_usd_per_hour", sa.Float(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(_in("state"), name=op.f("ck_managed_jobs_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_managed_jobs")),
        sa.UniqueConstraint("name", name=op.f("uq_managed_jobs_name")),
    )
    with op.batch_alter_table("managed_jobs", schema=None) as batch_op:
        batch_op.create_index("ix_managed_jobs_state", ["state"], unique=False)

    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.CheckConstraint(_in("to_state"), name=op.f("ck_job_events_to_state")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["managed_jobs.id"], name=op.f("fk_job_events_job_id_managed_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index("ix_job_events_job_at", ["job_id", "at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_index("ix_job_events_job_at")
    op.drop_table("job_events")
    with op.batch_alter_table("managed_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_managed_jobs_state")
    op.drop_table("managed_jobs")
