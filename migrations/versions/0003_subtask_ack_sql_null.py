"""an acknowledgement not yet received is SQL NULL, not JSON null

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26 03:30:00

Subtask rows written by a barrier event before their acknowledgement held JSON ``null`` in
``ack``; the ingest's upsert keeps the first non-NULL value, so the acknowledgement that came
later was never stored, and a restarted control plane could not rebuild the checkpoint. The
model now writes SQL NULL; this turns the rows already written into SQL NULL, so that the
acknowledgements of checkpoints still in progress are stored when they come.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Data only: JSON ``null`` acknowledgements become SQL NULL."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("UPDATE checkpoint_subtasks SET ack = NULL WHERE ack::text = 'null'")
    else:
        op.execute("UPDATE checkpoint_subtasks SET ack = NULL WHERE ack = 'null'")


def downgrade() -> None:
    """Nothing to undo: SQL NULL reads as "no acknowledgement" in every version."""
