"""Notifications (issue 40): the outbox of events, the sinks' state and each delivery.

Revision ID: 0010_i40_notifications
Revises: 0009_i24_job_progress
Create Date: 2026-11-28 19:00:00

``notifications`` is written in the transaction of the state change it reports; the daemon
delivers it to each sink at least once (``notify_deliveries``) and keeps each sink's run of
failures (``notify_sinks``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_i40_notifications"
down_revision = "0009_i24_job_progress"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("job_name", sa.String(length=128), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["managed_jobs.id"], name=op.f("fk_notifications_job_id_managed_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notifications")),
        sa.UniqueConstraint("key", name=op.f("uq_notifications_key")),
    )
    op.create_index("ix_notifications_job_id", "notifications", ["job_id", "id"], unique=False)
    op.create_table(
        "notify_sinks",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("since_id", sa.Integer(), nullable=False),
        sa.Column("failures_in_a_row", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_notify_sinks")),
    )
    op.create_table(
        "notify_deliveries",
        sa.Column("notification_id", sa.Integer(), nullable=False),
        sa.Column("sink", sa.String(length=32), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_try_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["notification_id"],
            ["notifications.id"],
            name=op.f("fk_notify_deliveries_notification_id_notifications"),
        ),
        sa.PrimaryKeyConstraint("notification_id", "sink", name=op.f("pk_notify_deliveries")),
    )
    op.create_index(
        "ix_notify_deliveries_sink_delivered", "notify_deliveries", ["sink", "delivered_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_notify_deliveries_sink_delivered", table_name="notify_deliveries")
    op.drop_table("notify_deliveries")
    op.drop_table("notify_sinks")
    op.drop_index("ix_notifications_job_id", table_name="notifications")
    op.drop_table("notifications")
