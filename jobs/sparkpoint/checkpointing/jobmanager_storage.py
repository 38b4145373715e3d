"""Jobmanager checkpoint storage: state inline (base64) in its handle, up to a size limit.

Flink's ``JobManagerCheckpointStorage``. The state travels in the completed checkpoint's
metadata; that metadata is kept in memory, or written to a directory with the layout of
:class:`~sparkpoint.checkpointing.filesystem_storage.FileSystemCheckpointStorage`.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

from sparkpoint.checkpointing.filesystem_storage import FileSystemCheckpointStorage
from sparkpoint.checkpointing.storage_base import (
    CheckpointStorage,
    StateTooLargeError,
    check_checkpoint_id,
    check_segment,
    decode_metadata,
    encode_metadata,
    format_size,
    state_handle,
)
from sparkpoint.errors import CheckpointNotFoundError, ConfigurationError
from sparkpoint.protocol import StateHandleModel
from sparkpoint.state.key_groups import KeyGroupRange


class JobManagerCheckpointStorage(CheckpointStorage):
    """State inline in its handle (base64), up to ``max_state_size`` bytes per handle.

    Args:
        max_state_size: the largest state one handle may carry inline, in bytes.
        metadata_url: where to write ``_metadata`` (same layout as
            :class:`FileSystemCheckpointStorage`); None keeps the metadata in this object.
    """

    def __init__(self, max_state_size: int = 1 << 20, metadata_url: str | None = None) -> None:
        if isinstance(max_state_size, bool) or not isinstance(max_state_size, int):
            raise ConfigurationError(
                f"max_state_size of jobmanager checkpoint storage must be an int, "
                f"got {max_state_size!r}"
            )
        if max_state_size < 0:
            raise ConfigurationError(
                f"max_state_size of jobmanager checkpoint storage must be >= 0, "
                f"got {max_state_size}"
            )
        self.max_state_size = max_state_size
        self.metadata_url = metadata_url
        self._files = FileSystemCheckpointStorage(metadata_url) if metadata_url else None
        self._metadata: dict[tuple[str, int], str] = {}  # (job id, checkpoint id) -> JSON

    def __repr__(self) -> str:
        return (
            f"JobManagerCheckpointStorage(max_state_size={self.max_state_size}, "
            f"metadata_url={self.metadata_url!r})"
        )

    def write_state(
        self,
        job_id: str,
        checkpoint_id: int,
        name: str,
        data: bytes,
        *,
        key_group_range: KeyGroupRange | None = None,
    ) -> StateHandleModel:
        check_segment(job_id, "job id", forbid_glob=True)
        check_segment(name, "state name", reserved_prefix="_")
        checkpoint_id = check_checkpoint_id(checkpoint_id)
        data = bytes(data)
        if len(data) > self.max_state_size:
            raise StateTooLargeError(
                f"state of {name} for checkpoint {checkpoint_id} is {format_size(len(data))}, "
                f"above the {format_size(self.max_state_size)} limit of jobmanager checkpoint "
                "storage; use --checkpoint-storage filesystem"
            )
        inline = base64.b64encode(data).decode("ascii")
        return state_handle(data, key_group_range, inline=inline)

    def _read_file(self, handle: StateHandleModel) -> bytes:
        if self._files is None:
            return super()._read_file(handle)
        return self._files.read_state(handle)

    def write_metadata(
        self, job_id: str, checkpoint_id: int, metadata: Mapping[str, Any]
    ) -> str | None:
        if self._files is not None:
            return self._files.write_metadata(job_id, checkpoint_id, metadata)
        check_segment(job_id, "job id", forbid_glob=True)
        checkpoint_id = check_checkpoint_id(checkpoint_id)
        raw = encode_metadata(metadata, job_id, checkpoint_id)
        self._metadata[(job_id, checkpoint_id)] = raw.decode("utf-8")
        return None

    def read_metadata(self, path: str) -> dict[str, Any]:
        if self._files is not None:
            return self._files.read_metadata(path)
        raise CheckpointNotFoundError(
            f"no checkpoint at {path}: jobmanager checkpoint storage without a metadata URL "
            "keeps metadata in memory only"
        )

    def read_checkpoint_metadata(self, job_id: str, checkpoint_id: int) -> dict[str, Any]:
        if self._files is not None:
            return self._files.read_checkpoint_metadata(job_id, checkpoint_id)
        raw = self._metadata.get((job_id, checkpoint_id))
        if raw is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of job {job_id} has no metadata in jobmanager "
                "checkpoint storage"
            )
        return decode_metadata(raw.encode("utf-8"), f"checkpoint {checkpoint_id} metadata")

    def _check_job_directory(self, job_id: str) -> None:
        if self._files is not None:  # _metadata goes to --checkpoint-dir
            self._files._check_job_directory(job_id)

    def discard(self, job_id: str, checkpoint_id: int) -> None:
        if self._files is not None:
            self._files.discard(job_id, checkpoint_id)
        self._metadata.pop((job_id, checkpoint_id), None)

    def cleanup_incomplete(self, job_id: str, *, keep: Iterable[int] = ()) -> list[int]:
        if self._files is not None:
            return self._files.cleanup_incomplete(job_id, keep=keep)
        return []  # state is inline: an incomplete checkpoint leaves nothing behind

    def completed_checkpoint_ids(self, job_id: str) -> list[int]:
        if self._files is not None:
            return self._files.completed_checkpoint_ids(job_id)
        return sorted(cid for job, cid in self._metadata if job == job_id)

    def checkpoint_path(self, job_id: str, checkpoint_id: int) -> str | None:
        if self._files is not None:
            return self._files.checkpoint_path(job_id, checkpoint_id)
        return None
