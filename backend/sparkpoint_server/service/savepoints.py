"""How the control plane completes a checkpoint or a savepoint, outside its lock.

The savepoint's copy itself (:func:`~sparkpoint.checkpointing.savepoints.write_savepoint`)
lives in the runtime library, which a standalone driver uses too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.savepoints import (
    METADATA_FILE,
    savepoint_dir_name,
    write_savepoint,
)
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.runtime.recovery import checkpoint_metadata

__all__ = ["METADATA_FILE", "completion_writer", "savepoint_dir_name", "write_savepoint"]


def completion_writer(
    job_id: str, cp: CompletedCheckpoint, storage: CheckpointStorage, savepoint_target: str
) -> Callable[[], tuple[str | None, dict[Any, p.SnapshotCompleted] | None]]:
    """The I/O that completes ``cp``, to run outside the coordination lock: a checkpoint's
    ``_metadata``, or a savepoint's copy. Built under the lock: it copies what it reads.

    The call returns the ``external_path`` and, for a savepoint, the relocated acks.
    """
    if cp.is_savepoint:
        acks = dict(cp.acks)
        return lambda: write_savepoint(job_id, cp, acks, storage, savepoint_target)
    metadata = checkpoint_metadata(job_id, cp)
    return lambda: (storage.write_metadata(job_id, cp.checkpoint_id, metadata), None)
