"""driver heartbeats: the interval a job's driver announced, and when its last one arrived

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 09:50:00

The control plane fails a job over when its driver stops sending ``driver_heartbeat`` events
(Flink's ``heartbeat.timeout``). It watches a driver that announced a heartbeat interval in
its registration (``heartbeat_interval``, NULL for a driver that sends none), and names the
last heartbeat (``last_driver_heartbeat``, the control plane's clock) in the failure's cause,
also after a restart of the control plane.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nullable columns only: the drivers of existing rows are not watched (unknown: NULL)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("heartbeat_interval", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("last_driver_heartbeat", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("last_driver_heartbeat")
        batch_op.drop_column("heartbeat_interval")
