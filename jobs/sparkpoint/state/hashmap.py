"""The ``hashmap`` keyed state backend: working state in Python dicts, snapshots are full copies.

Flink's ``HashMapStateBackend``. Per state name the backend keeps one dict, key -> value (for a
list state the value is a list, for a map state a dict), holding every key of the backend's key
group range. :meth:`HashMapKeyedStateBackend.table` gives built-in operators raw access to that
dict, so a count operator can update a whole batch at once instead of record by record.

A snapshot groups the state by key group so that :meth:`HashMapKeyedStateBackend.restore` can
merge the snapshots of every old subtask and keep the key groups of a new one: that is how a
checkpoint is restored with a different parallelism. Snapshots are unpickled on restore: read
them only from checkpoint storage you trust (its handles carry a checksum that is verified
before the bytes get here).

The snapshot format lives in :mod:`sparkpoint.state.snapshot_format` and the state objects
that :meth:`HashMapKeyedStateBackend.get_state` returns in :mod:`sparkpoint.state.hashmap_states`.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable
from typing import Any, overload

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state.descriptors import (
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    NoCurrentKeyError,
    StateDescriptor,
    StateKind,
    ValueState,
    ValueStateDescriptor,
)
from sparkpoint.state.hashmap_states import NO_KEY, bind_state
from sparkpoint.state.key_groups import (
    KeyGroupOutOfRangeError,
    KeyGroupRange,
    check_max_parallelism,
    stable_hash,
)
from sparkpoint.state.snapshot_format import (
    SNAPSHOT_MAGIC,
    SNAPSHOT_VERSION,
    decode_snapshot,
    encode_snapshot,
)
from sparkpoint.watermarks import MIN_WATERMARK, merge_channel_watermarks

__all__ = ["SNAPSHOT_MAGIC", "SNAPSHOT_VERSION", "HashMapKeyedStateBackend"]

_SIZE_SAMPLE = 256  # entries per state that state_size() measures


class HashMapKeyedStateBackend:
    """Keyed state of one subtask, for the key groups in ``key_group_range``.

    Args:
        max_parallelism: the operator's max parallelism (number of key groups).
        key_group_range: the key groups this subtask owns.

    Raises:
        ConfigurationError: when the range does not fit in ``[0, max_parallelism)``.
    """

    def __init__(self, max_parallelism: int, key_group_range: KeyGroupRange) -> None:
        self._max_parallelism = check_max_parallelism(max_parallelism)
        if not isinstance(key_group_range, KeyGroupRange):
            raise ConfigurationError(
                f"key_group_range must be a KeyGroupRange, got {type(key_group_range).__name__}"
            )
        if key_group_range.end >= self._max_parallelism:
            raise ConfigurationError(
                f"key group range {key_group_range} does not fit in max_parallelism "
                f"{self._max_parallelism} (key groups 0 to {self._max_parallelism - 1})"
            )
        self._key_group_range = key_group_range
        self._kinds: dict[str, StateKind] = {}
        self._tables: dict[str, dict[Any, Any]] = {}
        self._current_key: Any = NO_KEY
        self._current_key_group = -1
        # Operator state of event time: the latest watermark of every input channel (in
        # snapshots and working state) and the subtask's watermark, their minimum.
        self.channel_watermarks: dict[int, int] = {}
        self.current_watermark = MIN_WATERMARK

    def __repr__(self) -> str:
        return (
            f"HashMapKeyedStateBackend(max_parallelism={self._max_parallelism}, "
            f"key_group_range={self._key_group_range}, states={sorted(self._kinds)})"
        )

    @property
    def max_parallelism(self) -> int:
        return self._max_parallelism

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self._key_group_range

    @property
    def states(self) -> dict[str, StateKind]:
        """The registered (or restored) states: name -> kind."""
        return dict(self._kinds)

    # ------------------------------------------------------------------------- current key

    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Make ``key`` the key that every state object of this backend acts on.

        Args:
            key: the key (a type :func:`~sparkpoint.state.key_groups.stable_hash` accepts).
            key_group: the key's key group when the caller has already computed it (the
                runtime has, to route the record here); computed from ``key`` otherwise.

        Raises:
            KeyGroupOutOfRangeError: when the key's key group is not in this backend's range.
        """
        if key_group is None:
            key_group = stable_hash(key) % self._max_parallelism
        if not self._key_group_range.start <= key_group <= self._key_group_range.end:
            raise KeyGroupOutOfRangeError(
                f"key {key!r} is in key group {key_group}, outside the key group range "
                f"{self._key_group_range} of this state backend "
                f"(max_parallelism {self._max_parallelism})"
            )
        self._current_key = key
        self._current_key_group = key_group

    @property
    def current_key(self) -> Any:
        """The current key; raises :class:`NoCurrentKeyError` when none was set."""
        if self._current_key is NO_KEY:
            raise NoCurrentKeyError("no current key: call set_current_key(key) first")
        return self._current_key

    @property
    def current_key_group(self) -> int:
        """The key group of the current key."""
        if self._current_key is NO_KEY:
            raise NoCurrentKeyError("no current key: call set_current_key(key) first")
        return self._current_key_group

    # ------------------------------------------------------------------------- states

    @overload
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState: ...

    @overload
    def get_state(self, descriptor: ListStateDescriptor) -> ListState: ...

    @overload
    def get_state(self, descriptor: MapStateDescriptor) -> MapState: ...

    def get_state(self, descriptor: StateDescriptor) -> ValueState | ListState | MapState:
        """The state ``descriptor`` names, bound to this backend's current key.

        Registers the state on first use; a restored state of the same name and kind gets
        its restored contents.

        Raises:
            ConfigurationError: when a state of that name exists with another kind.
        """
        table = self._register(descriptor.name, descriptor.kind)
        return bind_state(self, descriptor, table)

    def table(self, name: str) -> dict[Any, Any]:
        """The raw dict (key -> value) of state ``name``, for vectorized operators.

        Writers must only add keys of this backend's key group range; :meth:`snapshot`
        refuses a key outside it.

        Raises:
            ConfigurationError: when no state of that name was registered or restored.
        """
        try:
            return self._tables[name]
        except KeyError:
            known = ", ".join(sorted(self._tables)) or "none"
            raise ConfigurationError(
                f"no keyed state named {name!r} (registered: {known}); "
                "call get_state(descriptor) first"
            ) from None

    def _register(self, name: str, kind: StateKind) -> dict[Any, Any]:
        existing = self._kinds.get(name)
        if existing is None:
            self._kinds[name] = kind
            self._tables[name] = {}
        elif existing != kind:
            raise ConfigurationError(
                f"keyed state {name!r} is a {existing} state; it cannot be used as a {kind} state"
            )
        return self._tables[name]

    def _key(self, name: str) -> Any:
        key = self._current_key
        if key is NO_KEY:
            raise NoCurrentKeyError(
                f"keyed state {name!r} was accessed with no current key: keyed state is only "
                "available in a keyed operator, after set_current_key(key)"
            )
        return key

    # ------------------------------------------------------------------------- sizes

    def num_keys(self) -> int:
        """How many distinct keys have some state."""
        tables = [table for table in self._tables.values() if table]
        if len(tables) <= 1:
            return len(tables[0]) if tables else 0
        return len(set().union(*tables))

    def state_size(self) -> int:
        """Approximate in-memory size of the state in bytes.

        Measured (``sys.getsizeof`` of keys and values, one level into containers) on up to
        256 entries per state and scaled to the number of entries, so that it is cheap to
        report at every checkpoint.
        """
        total = 0.0
        for table in self._tables.values():
            if not table:
                continue
            sample = list(itertools.islice(table.items(), _SIZE_SAMPLE))
            measured = sum(_sizeof(key) + _sizeof(value) for key, value in sample)
            total += measured * len(table) / len(sample)
        return round(total)

    # ------------------------------------------------------------------------- snapshots

    def snapshot(self) -> bytes:
        """The synchronous part of a snapshot: a serialized copy of the state by key group.

        Raises:
            KeyGroupOutOfRangeError: when a raw table holds a key of another key group range.
        """
        return encode_snapshot(
            self._tables,
            self._kinds,
            self._max_parallelism,
            self._key_group_range,
            self.channel_watermarks,
        )

    @classmethod
    def restore(
        cls,
        blobs: Iterable[bytes],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
    ) -> HashMapKeyedStateBackend:
        """A backend for ``key_group_range`` holding the state of those key groups in ``blobs``.

        ``blobs`` are the snapshots of every subtask of the operator (any old parallelism):

        1. check each blob's header and decode it;
        2. check that it was taken with the same max parallelism;
        3. register its states (name and kind);
        4. merge the key groups that lie in ``key_group_range``, skip the others;
        5. merge the channel watermarks (per channel the minimum over the blobs).

        Raises:
            CorruptSnapshotError: a wrong magic, version or structure, a key group outside the
                blob's own range, or one key group in two blobs.
            ConfigurationError: a blob taken with another max parallelism, or
                ``key_group_range`` outside ``[0, max_parallelism)``.
        """
        backend = cls(max_parallelism, key_group_range)
        start, end = key_group_range.start, key_group_range.end
        owner: dict[int, int] = {}  # key group -> index of the blob it came from
        watermarks: list[dict[int, int]] = []
        for index, blob in enumerate(blobs):
            # Step 1: header and structure.
            payload = decode_snapshot(blob, index)
            # Step 2: max parallelism.
            if payload["max_parallelism"] != backend._max_parallelism:
                raise ConfigurationError(
                    f"snapshot {index} was taken with max_parallelism "
                    f"{payload['max_parallelism']}; it cannot be restored with max_parallelism "
                    f"{backend._max_parallelism} (every key would change key group)"
                )
            # Step 3: states.
            states: dict[str, StateKind] = payload["states"]
            for name, kind in states.items():
                try:
                    backend._register(name, kind)
                except ConfigurationError as err:
                    raise CorruptSnapshotError(f"snapshot {index}: {err}") from err
            # Step 4: the key groups of the new range.
            blob_start, blob_end = payload["key_group_range"]
            for key_group, by_state in payload["groups"].items():
                if not blob_start <= key_group <= blob_end:
                    raise CorruptSnapshotError(
                        f"snapshot {index} of key group range [{blob_start}, {blob_end}] "
                        f"holds key group {key_group}"
                    )
                if not start <= key_group <= end:
                    continue
                if key_group in owner:
                    raise CorruptSnapshotError(
                        f"key group {key_group} is in snapshots {owner[key_group]} and {index}; "
                        "the snapshots of one checkpoint have disjoint key group ranges"
                    )
                owner[key_group] = index
                for name, entries in by_state.items():
                    if name not in states or not isinstance(entries, dict):
                        raise CorruptSnapshotError(
                            f"snapshot {index}: key group {key_group} holds undeclared or "
                            f"malformed state {name!r}"
                        )
                    backend._tables[name].update(entries)
            # Step 5: event time.
            watermarks.append(payload.get("watermarks", {}))
        backend.channel_watermarks = merge_channel_watermarks(watermarks)
        return backend


def _sizeof(value: Any) -> int:
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        size += sum(sys.getsizeof(item) for item in value)
    return size
