"""Restoring keyed state from snapshots, for every backend: the checks and the merge.

A restore hands a new backend (for its key group range) the snapshots of every subtask of the
operator's checkpoint, at any old parallelism (rescaling). Each snapshot must have been taken
with the same max parallelism (else every key would change key group); its states are
registered with their kinds and serializers; only the key groups of the new range are kept,
and a key group may come from one snapshot only; the channel watermarks are merged (per
channel the minimum).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state.backend import KeyedStateBackend, StateInfo
from sparkpoint.watermarks import merge_channel_watermarks

if TYPE_CHECKING:
    from sparkpoint.state.canonical import CanonicalSnapshot
    from sparkpoint.state.changelog_delta import Delta


def check_max_parallelism(found: int, expected: int, index: int | str) -> None:
    """Refuse a snapshot taken with another max parallelism.

    Raises:
        ConfigurationError: naming both.
    """
    if found != expected:
        raise ConfigurationError(
            f"snapshot {index} was taken with max_parallelism {found}; it cannot be restored "
            f"with max_parallelism {expected} (every key would change key group)"
        )


def register(backend: KeyedStateBackend, info: StateInfo, index: int | str) -> None:
    """Register a restored state; a conflicting kind or serializer is a corrupt snapshot."""
    try:
        backend.register(info)
    except ConfigurationError as err:
        raise CorruptSnapshotError(f"snapshot {index}: {err}") from err


def full_check(full: bool, index: int | str) -> None:
    """Refuse to restore an epoch's changes as if they were a snapshot of the state."""
    if not full:
        raise CorruptSnapshotError(
            f"snapshot {index} is an epoch's changelog (changes only), not a snapshot of "
            "the state; it cannot be restored on its own"
        )


class SnapshotMerge:
    """Merges the snapshots of one restore into ``backend`` (see the module docstring);
    :meth:`finish` sets the merged channel watermarks."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend
        self._owner: dict[int, int | str] = {}  # key group -> the snapshot it came from
        self._marks: list[dict[int, int]] = []

    def claim(self, key_group: int, index: int | str) -> None:
        """Record that ``key_group`` comes from snapshot ``index``; a second one is refused."""
        if key_group in self._owner:
            raise CorruptSnapshotError(
                f"key group {key_group} is in snapshots {self._owner[key_group]} and {index}; "
                "the snapshots of one checkpoint have disjoint key group ranges"
            )
        self._owner[key_group] = index

    def add_watermarks(self, watermarks: Mapping[int, int]) -> None:
        self._marks.append(dict(watermarks))

    def add(self, snap: CanonicalSnapshot, index: int | str) -> None:
        """Merge a canonical snapshot's key groups of the backend's range.

        Raises:
            ConfigurationError: another max parallelism.
            CorruptSnapshotError: a conflicting state, or a key group already restored.
        """
        backend = self.backend
        full_check(not snap.changelog, index)
        check_max_parallelism(snap.max_parallelism, backend.max_parallelism, index)
        for info in snap.states.values():
            register(backend, info, index)
        kg_range = backend.key_group_range
        for key_group in snap.key_groups():
            if kg_range.start <= key_group <= kg_range.end:
                self.claim(key_group, index)
        backend.load(snap.entries(kg_range))
        self.add_watermarks(snap.watermarks)

    def add_columns(self, snap: Delta, index: int | str) -> None:
        """Merge a checkpoint in the columns format (every entry of its writer's key-group
        range): the key groups of that range in the backend's are claimed, its keys there
        loaded.

        Raises:
            ConfigurationError: another max parallelism.
            CorruptSnapshotError: an epoch's changes rather than a full table, a conflicting
                state, a key group already restored, or entries that do not decode.
        """
        full_check(snap.full, index)
        backend = self.backend
        check_max_parallelism(snap.max_parallelism, backend.max_parallelism, index)
        for info in snap.states.values():
            register(backend, info, index)
        start = max(snap.key_group_range.start, backend.key_group_range.start)
        end = min(snap.key_group_range.end, backend.key_group_range.end)
        for key_group in range(start, end + 1):
            self.claim(key_group, index)
        if start <= end:
            snap.load_into(backend)
        self.add_watermarks(snap.watermarks)

    def finish(self) -> KeyedStateBackend:
        self.backend.channel_watermarks = merge_channel_watermarks(self._marks)
        return self.backend
