"""job guarantee: the end-to-end delivery guarantee a job's driver reports at registration

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 16:00:00

A driver derives its job's end-to-end guarantee from its sources and sinks
(``sparkpoint.guarantees``: exactly_once, at_least_once or at_most_once, and why when weaker)
and reports it in ``job_registered``; ``GET /jobs/{id}`` and the dashboard show it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nullable columns only: existing jobs' drivers did not report one (unknown: NULL)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("guarantee_level", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("guarantee_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("guarantee_reason")
        batch_op.drop_column("guarantee_level")
