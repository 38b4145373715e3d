"""unanswered splits and the epoch bound: why a job's lag is unknown, why its epochs are small

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 23:10:00

A source whose system does not answer (a Redis that is down) has no known lag: the driver's
heartbeat counts the lag of the other splits and names these. The latest heartbeat's list is
kept on the job, and each heartbeat's in the history, so that the API and the dashboard say
"unknown" instead of showing a lag of 0. The latest heartbeat's epoch bound (the planner held
its epoch within that many ms so that checkpoints complete within their timeout) is kept on the
job: it says why a job catches up no faster.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nullable: heartbeats of drivers that do not report them (and every earlier one)."""
    for table in ("jobs", "heartbeats"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("unanswered_splits", sa.JSON(), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("epoch_bound_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("epoch_bound_ms")
    for table in ("heartbeats", "jobs"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("unanswered_splits")
