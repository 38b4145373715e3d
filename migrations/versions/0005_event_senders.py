"""event senders: the last event applied from each sender of a job (replays are refused)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 10:55:00

Every event is signed and numbered per sender (``sparkpoint.signing``). The control plane keeps
the highest sequence number it applied from each (job, sender), with the stream entry that
carried it, in the transaction of the event's effect: a re-sent copy (a new entry, an old
sequence number) is dead-lettered as a replay, also after a restart; the same entry read again
after a crash is recognised as applied.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "event_senders",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("sender", sa.String(length=64), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_entry_id", sa.String(length=48), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "sender", name=op.f("pk_event_senders")),
    )


def downgrade() -> None:
    op.drop_table("event_senders")
