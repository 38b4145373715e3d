"""Savepoints: a completed savepoint's state copied into its own, self-contained directory.

A savepoint is written by the subtasks like a checkpoint (into checkpoint storage), in the
canonical keyed-state format that every state backend restores (never as files shared with
checkpoints), then its authority (the control plane, or a standalone driver with
``--savepoint-on-finish``) copies every state file into ``<target>/savepoint-<job>-<id>/`` and
writes a ``_metadata`` there whose handles point at the copies. Nothing deletes a savepoint
automatically: it belongs to the user (``sparkpoint savepoint dispose PATH``). A restore reads
it from its path alone.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any

from fsspec.core import url_to_fs

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CompletedCheckpoint, checkpoint_metadata
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.checkpointing.storage_base import is_object_store
from sparkpoint.errors import CheckpointError

METADATA_FILE = "_metadata"


def savepoint_dir_name(job_id: str, checkpoint_id: int) -> str:
    return f"savepoint-{job_id[:8]}-{checkpoint_id}"


def write_savepoint(
    job_id: str,
    cp: CompletedCheckpoint,
    acks: dict[Any, p.SnapshotCompleted],
    storage: CheckpointStorage,
    target: str,
) -> tuple[str, dict[Any, p.SnapshotCompleted]]:
    """Copy the savepoint's state under ``target`` and write its ``_metadata``.

    Steps: (1) copy each state file (checked against its size and checksum on the way),
    (2) rewrite the handles to the copies (inline state stays inline), (3) write
    ``_metadata`` atomically (temporary file, then rename; on an object store one put).

    Runs outside the coordination lock: it reads ``acks`` (a copy of the checkpoint's) and
    leaves ``cp`` as it is.

    Returns:
        The savepoint's directory (its ``external_path``) and the acknowledgements whose
        handles point at the copies.

    Raises:
        CorruptSnapshotError: a state file does not match its handle.
        OSError: the target directory cannot be written.
    """
    fs, root = url_to_fs(target)
    directory = posixpath.join(root.rstrip("/"), savepoint_dir_name(job_id, cp.checkpoint_id))
    fs.makedirs(directory, exist_ok=True)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    prefix = f"{protocol}://"  # handles and external paths are URLs, as checkpoints' are
    relocated_acks: dict[Any, p.SnapshotCompleted] = {}
    for key, ack in acks.items():
        handles = []
        for handle in ack.handles:
            if handle.is_native:
                raise CheckpointError(
                    f"savepoint {cp.checkpoint_id} of job {job_id}: {ack.operator_id}"
                    f"[{ack.subtask}] sent a native RocksDB snapshot; savepoints are canonical"
                )
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
        relocated_acks[key] = ack.model_copy(update={"handles": handles})
    relocated = CompletedCheckpoint(
        checkpoint_id=cp.checkpoint_id,
        kind=cp.kind,
        attempt=cp.attempt,
        trigger_timestamp=cp.trigger_timestamp,
        completion_timestamp=cp.completion_timestamp,
        end_to_end_duration_ms=cp.end_to_end_duration_ms,
        is_final=cp.is_final,
        acks=relocated_acks,
    )
    # Step 3
    metadata = checkpoint_metadata(job_id, relocated)
    if is_object_store([protocol]):  # no rename there; one put is atomic
        fs.pipe_file(posixpath.join(directory, METADATA_FILE), json.dumps(metadata).encode())
        return prefix + directory, relocated_acks
    tmp = posixpath.join(directory, f".{METADATA_FILE}.{uuid.uuid4().hex}")
    with fs.open(tmp, "w") as fh:
        json.dump(metadata, fh)
    fs.mv(tmp, posixpath.join(directory, METADATA_FILE))
    return prefix + directory, relocated_acks
