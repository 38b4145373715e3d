"""start point: the checkpoint a job's --from-checkpoint named

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 05:20:00

A job started from another job's checkpoint or a savepoint restores that checkpoint again when
it fails before its first checkpoint of its own completes; a control plane that restarted
needs its id to say so (its path is the registration's ``from_checkpoint``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nullable: jobs registered before this revision, and jobs started from the beginning."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("start_checkpoint_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("start_checkpoint_id")
