"""restore timings: how long the latest restore's state took, and when records flowed again

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 01:50:00

The first epoch after a restore reports the slowest keyed subtask's state restore and when the
job processed its first record; ``latest.restored`` shows both, so that an operator sees how
long the job was down after a failure, not only that it restored.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nullable columns: restores before this revision have no timings."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("restored_state_ms", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("restored_first_record", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("restored_first_record")
        batch_op.drop_column("restored_state_ms")
