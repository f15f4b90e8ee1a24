"""The mover's ledger bills data egress: each move records what entering its placement transferred.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 22:00:00

When a job enters a placement in another cloud or region than its checkpoint (or than its
dataset's home), the clouds bill the transfer. The executor prices it with the one egress rule
(``spotopt.decide.egress.entry_usd``) when the move grants the lease to the new epoch and writes
it on the move: ``egress_usd`` and ``egress_gb`` (0 for a move within a region, and for every
row written before this revision), ``egress_from`` (``cloud/region`` of the checkpoint it
restores, NULL: none) and ``egress_to`` (``cloud/region`` entered; NULL until recorded, which is
what makes recording it once, however often a crashed move resumes). The ledger adds a move's
egress to the placement it launched (``to_placement_id``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_moves") as batch:
        batch.add_column(sa.Column("egress_usd", sa.Float(), server_default="0", nullable=False))
        batch.add_column(sa.Column("egress_gb", sa.Float(), server_default="0", nullable=False))
        batch.add_column(sa.Column("egress_from", sa.Text(), nullable=True))
        batch.add_column(sa.Column("egress_to", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_moves") as batch:
        batch.drop_column("egress_to")
        batch.drop_column("egress_from")
        batch.drop_column("egress_gb")
        batch.drop_column("egress_usd")
