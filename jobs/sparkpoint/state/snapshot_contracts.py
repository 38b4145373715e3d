"""What a keyed state backend's snapshots and working-state versions go through: the target
the asynchronous part of a snapshot writes to, what the synchronous part captured, the store
of working-state versions between epochs, and what saving a version wrote
(:class:`~sparkpoint.state.backend.KeyedStateBackend` uses them; its module re-exports them).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sparkpoint.state.key_groups import KeyGroupRange

if TYPE_CHECKING:
    from sparkpoint.protocol import StateHandleModel

__all__ = ["SavedVersion", "SnapshotCapture", "SnapshotTarget", "VersionStore"]


class SnapshotTarget(Protocol):
    """Where the asynchronous part of one subtask's snapshot writes (bound to a job, a
    checkpoint, the subtask's state name and key group range)."""

    checkpoint_id: int
    key_group_range: KeyGroupRange
    incremental: bool  # the job asked for incremental checkpoints and this is not a savepoint

    def write(self, data: bytes, *, fmt: str) -> StateHandleModel:
        """One file of snapshot state in the checkpoint's directory (or inline)."""
        ...

    def write_native(
        self, private: dict[str, str], shared: dict[str, str], reused: list[Any], *, fmt: str
    ) -> StateHandleModel:
        """A native snapshot: ``private`` files (file name -> local path) go to the
        checkpoint's directory, ``shared`` ones to the job's ``shared/`` directory, ``reused``
        (shared-file references of an earlier snapshot) are referenced without an upload."""
        ...


class SnapshotCapture(abc.ABC):
    """What the synchronous part of a snapshot captured."""

    state_size: int = 0  # the full state's size in bytes, as the snapshot sees it

    @abc.abstractmethod
    def materialize(self, target: SnapshotTarget) -> list[StateHandleModel]:
        """The asynchronous part: serialize and write; the handles of what was written."""

    def release(self) -> None:  # noqa: B027 - a capture with nothing to free
        """Free what the capture holds (called after :meth:`materialize`, or instead)."""


class VersionStore(Protocol):
    """Where a subtask's working-state versions live between epochs.

    ``local_dir`` is this subtask's directory on the executor. On clusters the store also
    keeps durable copies that another executor can read (``write_durable`` returns None on a
    single machine); ``durable_url`` is where the durable copy of the version being opened
    starts (None: open it from ``local_dir`` only)."""

    local_dir: str
    durable: bool  # whether write_durable keeps copies (on a cluster)
    durable_url: str | None

    def write_durable(self, name: str, data: bytes) -> str | None:
        """Store ``data`` durably under ``name``; its URL (None: no durable copies)."""
        ...

    def read_durable(self, url: str) -> bytes | None:
        """The bytes of a durable copy, None when it is gone."""
        ...


@dataclass(frozen=True)
class SavedVersion:
    """What :meth:`KeyedStateBackend.save_version` wrote: its bytes, where the durable copy
    starts (None: no durable copy) and every durable file the version needs (the driver
    deletes those of the version it replaces that the new one no longer needs)."""

    bytes_written: int
    durable_url: str | None = None
    durable_files: tuple[str, ...] = ()
