"""spark application of a job's driver, epoch of a checkpoint

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26 02:20:40.572658

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema: nullable columns only, so existing rows stay valid (unknown: NULL)."""
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("epoch", sa.Integer(), nullable=True))

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spark_application_id", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("spark_ui_url", sa.Text(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("spark_ui_url")
        batch_op.drop_column("spark_application_id")

    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("epoch")
