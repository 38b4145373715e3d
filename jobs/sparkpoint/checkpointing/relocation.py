"""A checkpoint or savepoint read from another directory than the one it was written to.

Flink's savepoints are relocatable: a savepoint directory moved or copied elsewhere (a backup,
another cluster's storage) restores from where it is now. A Sparkpoint ``_metadata`` names
its state files by URL, so the reader moves them: the directory it was written to is found
from the first state file that the metadata names outside the directory it is read from but
that this directory holds under the same name, and every state file URL under that directory
is read under this one instead.

That covers savepoints (canonical snapshots, one file per subtask in the directory) and
checkpoints of full snapshots. A native RocksDB snapshot's manifest names its files by URL
too, and an incremental checkpoint's shared files lie in its job's ``shared/``: those keep
their URLs, so such a checkpoint restores from a copy only while the files it names stay where
they were (Flink's incremental checkpoints are not relocatable either).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence

from sparkpoint.checkpointing.filesystem_storage import METADATA_FILE, FileSystemCheckpointStorage
from sparkpoint.checkpointing.shared_state import is_manifest
from sparkpoint.protocol import SnapshotCompleted, StateHandleModel

__all__ = ["relocated", "relocated_to"]


def relocated_to(
    storage: FileSystemCheckpointStorage, path: str, acks: Sequence[SnapshotCompleted]
) -> list[SnapshotCompleted]:
    """``acks`` of the checkpoint at ``path`` (its directory or its ``_metadata``) on
    ``storage``'s filesystem, with their files moved there (:func:`relocated`)."""
    fs = storage.fs
    directory = fs._strip_protocol(path).rstrip("/")
    if posixpath.basename(directory) == METADATA_FILE:
        directory = posixpath.dirname(directory)
    return relocated(acks, fs.unstrip_protocol(directory), fs.isfile)


def relocated(
    acks: Sequence[SnapshotCompleted], directory: str, exists: Callable[[str], bool]
) -> list[SnapshotCompleted]:
    """``acks`` with the state files of the directory they were written to moved to
    ``directory`` (the URL ``_metadata`` was read from, without ``/_metadata``), when they
    were written elsewhere and ``directory`` holds them; otherwise ``acks`` as they are.

    Args:
        acks: the acknowledgements the metadata holds.
        directory: the checkpoint's directory as read, in the URL form of the handles
            (``file:///...``, ``s3://...``).
        exists: whether a URL names an existing file.
    """
    directory = directory.rstrip("/")
    origin = _written_to(acks, directory, exists)
    if origin is None:
        return list(acks)

    def moved(url: str) -> str:
        return directory + url[len(origin) :] if url.startswith(origin + "/") else url

    def handle(h: StateHandleModel) -> StateHandleModel:
        return h.model_copy(
            update={
                "path": moved(h.path) if h.path is not None else None,
                "shared": [s.model_copy(update={"path": moved(s.path)}) for s in h.shared],
            }
        )

    return [a.model_copy(update={"handles": [handle(h) for h in a.handles]}) for a in acks]


def _written_to(
    acks: Sequence[SnapshotCompleted], directory: str, exists: Callable[[str], bool]
) -> str | None:
    """The directory the metadata's state files were written to, when it is not
    ``directory`` and ``directory`` holds them; else None."""
    for ack in acks:
        for h in ack.handles:
            if h.path is None:  # inline state
                continue
            if h.path.startswith(directory + "/"):
                return None  # read where it was written
            if is_manifest(h.path):
                return None  # a native snapshot: its manifest names its files by URL
            origin, _, name = h.path.rpartition("/")
            return origin if origin and exists(f"{directory}/{name}") else None
    return None
