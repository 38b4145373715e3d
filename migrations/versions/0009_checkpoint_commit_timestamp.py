"""checkpoint commit timestamp: when the job's sinks committed a completed checkpoint

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28 22:40:00

A completed checkpoint's output becomes visible when the job's sinks commit its transactions
(after ``checkpoint_complete``); the history entry shows whether (``committed``) and when
(``commit_timestamp``), so that an operator sees a checkpoint that completed but whose output
is not committed yet, and how long commits take.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """A nullable column: checkpoints committed before this revision have no time."""
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("commit_timestamp", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("commit_timestamp")
