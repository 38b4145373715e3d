"""spark executors: the executors and hosts of a job's Spark application

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 16:20:00

A driver lists its Spark application's executors (id, host, cores, active, and Spark's reason
for a removed one) in each per-epoch ``heartbeat``; ``GET /jobs/{id}`` shows the latest list
under ``spark.executors`` and the dashboard's job page a table of them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """A nullable column: drivers that do not list their executors leave it NULL."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spark_executors", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("spark_executors")
