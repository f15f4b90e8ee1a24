"""A managed job's progress over time, for the dashboard's job page.

Revision ID: 0009_i24_job_progress
Revises: 0008_i24_whatif_runs
Create Date: 2026-11-25 08:00:00

``job_progress`` holds (job, time, epoch, steps) points the executor records from the agent's
heartbeats; the job row still holds only the newest.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_i24_job_progress"
down_revision = "0008_i24_whatif_runs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_progress",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["managed_jobs.id"], name=op.f("fk_job_progress_job_id_managed_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_progress")),
    )
    op.create_index("ix_job_progress_job_at", "job_progress", ["job_id", "at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_progress_job_at", table_name="job_progress")
    op.drop_table("job_progress")
