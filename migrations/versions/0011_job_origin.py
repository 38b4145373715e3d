"""origin: where a job's current line of checkpoints starts

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 05:20:00

A failover restores the newest checkpoint completed since the job's ``--from-checkpoint`` or
its latest restore request, else the checkpoint they named: not one that the restore went back
past, and not the beginning of a job that started from a checkpoint. A control plane that
restarted needs to know that line's start.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nullable: jobs that started from the beginning and were never restored (and every job
    registered before this revision, as before it)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("origin_checkpoint_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("origin_path", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("origin_next_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("origin_next_id")
        batch_op.drop_column("origin_path")
        batch_op.drop_column("origin_checkpoint_id")
