"""Runs record the process that owns them (pid and host), so a killed run can be told from a live one.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 17:00:00

A run left ``running`` by a process that was killed (``kill -9``, a power cut) is marked failed
on the next start on the same host once its pid is gone. Rows written before this revision have
no owner and are left as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("host", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("host")
        batch.drop_column("pid")
