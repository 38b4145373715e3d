"""Savepoints: a completed savepoint's state copied into its own, self-contained directory.

A savepoint is written by the subtasks like a checkpoint (into checkpoint storage), then the
control plane copies every state file into ``<target>/savepoint-<job>-<id>/`` and writes a
``_metadata`` there whose handles point at the copies. The format is the key-group snapshot
format that every Sparkpoint state backend reads (backend-independent), and nothing deletes a
savepoint automatically: it belongs to the user. A restore reads it from its path alone.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any

from fsspec.core import url_to_fs

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.runtime.recovery import checkpoint_metadata

METADATA_FILE = "_metadata"


def savepoint_dir_name(job_id: str, checkpoint_id: int) -> str:
    return f"savepoint-{job_id[:8]}-{checkpoint_id}"


def write_savepoint(
    job_id: str, cp: CompletedCheckpoint, storage: CheckpointStorage, target: str
) -> str:
    """Copy the savepoint's state under ``target`` and write its ``_metadata``.

    Steps: (1) copy each state file (checked against its size and checksum on the way),
    (2) rewrite the handles to the copies (inline state stays inline), (3) write
    ``_metadata`` atomically (temporary file, then rename).

    Returns:
        The savepoint's directory (its ``external_path``).

    Raises:
        CorruptSnapshotError: a state file does not match its handle.
        OSError: the target directory cannot be written.
    """
    fs, root = url_to_fs(target)
    directory = posixpath.join(root.rstrip("/"), savepoint_dir_name(job_id, cp.checkpoint_id))
    fs.makedirs(directory, exist_ok=True)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    prefix = f"{protocol}://"  # handles and external paths are URLs, as checkpoints' are
    acks: dict[Any, p.SnapshotCompleted] = {}
    for key, ack in cp.acks.items():
        handles = []
        for handle in ack.handles:
            if handle.path is None:
                handles.append(handle)
                continue
            # Step 1
            data = storage.read_state(handle)
            copy = posixpath.join(directory, posixpath.basename(handle.path))
            with fs.open(copy, "wb") as fh:
                fh.write(data)
            # Step 2
            handles.append(handle.model_copy(update={"path": prefix + copy}))
        acks[key] = ack.model_copy(update={"handles": handles})
    relocated = CompletedCheckpoint(
        checkpoint_id=cp.checkpoint_id,
        kind=cp.kind,
        attempt=cp.attempt,
        trigger_timestamp=cp.trigger_timestamp,
        completion_timestamp=cp.completion_timestamp,
        end_to_end_duration_ms=cp.end_to_end_duration_ms,
        is_final=cp.is_final,
        acks=acks,
    )
    # Step 3
    tmp = posixpath.join(directory, f".{METADATA_FILE}.{uuid.uuid4().hex}")
    with fs.open(tmp, "w") as fh:
        json.dump(checkpoint_metadata(job_id, relocated), fh)
    fs.mv(tmp, posixpath.join(directory, METADATA_FILE))
    cp.acks.clear()
    cp.acks.update(acks)
    return prefix + directory
