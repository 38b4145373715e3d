"""Checkpoint storage: where snapshot state and checkpoint metadata are written and read back.

Flink's ``CheckpointStorage``, with its two kinds:

- :class:`FileSystemCheckpointStorage`: state files and ``_metadata`` under any fsspec URL
  (``file://``, plain local paths, ``s3://``, ``hdfs://``, ``memory://`` in tests), laid out as
  ``<base>/<job-id>/chk-<n>/<name>`` and ``<base>/<job-id>/chk-<n>/_metadata``;
  ``<base>/<job-id>/shared/`` is reserved for incremental state.
- :class:`JobManagerCheckpointStorage`: state inline (base64) in its handle, so in the
  completed checkpoint's metadata, up to a size limit.

Every handle carries the state's size and SHA-256 checksum, and :meth:`CheckpointStorage.
read_state` verifies both. Storage objects are shipped to Spark executors: they hold plain
strings and ints and create their fsspec filesystem lazily.

This module is the public entry point: the interface and shared helpers live in
:mod:`~sparkpoint.checkpointing.storage_base`, the two kinds in
:mod:`~sparkpoint.checkpointing.filesystem_storage` and
:mod:`~sparkpoint.checkpointing.jobmanager_storage`; :func:`checkpoint_storage_from_options`
picks one.
"""

from __future__ import annotations

from sparkpoint.checkpointing.filesystem_storage import (
    METADATA_FILE,
    SHARED_DIR,
    FileSystemCheckpointStorage,
)
from sparkpoint.checkpointing.jobmanager_storage import JobManagerCheckpointStorage
from sparkpoint.checkpointing.storage_base import CheckpointStorage, StateTooLargeError
from sparkpoint.errors import ConfigurationError

__all__ = [
    "METADATA_FILE",
    "SHARED_DIR",
    "CheckpointStorage",
    "FileSystemCheckpointStorage",
    "JobManagerCheckpointStorage",
    "StateTooLargeError",
    "checkpoint_storage_from_options",
]


def checkpoint_storage_from_options(
    kind: str, url: str | None, max_inline_bytes: int
) -> CheckpointStorage:
    """The checkpoint storage that the job options name.

    Args:
        kind: ``"filesystem"`` or ``"jobmanager"``.
        url: the checkpoint directory (required for ``filesystem``; for ``jobmanager`` where
            ``_metadata`` is written, None to keep it in memory).
        max_inline_bytes: the inline state limit of ``jobmanager`` storage.

    Raises:
        ConfigurationError: an unknown kind, or ``filesystem`` without a URL.
    """
    if kind == "filesystem":
        if not url:
            raise ConfigurationError(
                "checkpoint storage 'filesystem' needs a checkpoint directory (--checkpoint-dir)"
            )
        return FileSystemCheckpointStorage(url)
    if kind == "jobmanager":
        return JobManagerCheckpointStorage(max_state_size=max_inline_bytes, metadata_url=url)
    raise ConfigurationError(
        f"unknown checkpoint storage {kind!r}: expected 'filesystem' or 'jobmanager'"
    )
