"""first epoch heartbeat: periodic checkpoints of an attempt wait until its tasks run

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-08 04:00:00

A driver that runs each attempt's first epoch at once and ends it with a heartbeat says so in
its registration; the control plane then triggers no periodic checkpoint of an attempt before
that heartbeat, as Flink triggers none before all tasks run. The flag is kept on the job so
that a restarted control plane still waits for it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """False for every earlier job: its driver did not say (checkpoints from RUNNING on)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "first_epoch_heartbeat", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("first_epoch_heartbeat")
