"""The ``hashmap`` keyed state backend: working state in Python dicts (Flink's
``HashMapStateBackend``).

Per state the backend keeps one :class:`TrackedTable`, a dict of key -> value holding every key
of the backend's key group range, which records the keys read or written since the last
:meth:`HashMapKeyedStateBackend.take_changes`: the epoch's changelog
(:mod:`sparkpoint.state.changelog`) writes only those. A value state declared ``int64`` or
``float64`` (the built-in ``count``'s) keeps its numbers in columns instead
(:class:`~sparkpoint.state.slot_table.SlotTable`): a batch of keys costs one dict lookup each
(thousands of str keys: a search of their hashes in a sorted array), a capture copies arrays,
and its changes are the keys written.

**Snapshots**: a savepoint is canonical (:mod:`sparkpoint.state.canonical`); a checkpoint is
the backend's own format, the tables' columns as the working state's base writes them
(:data:`~sparkpoint.state.changelog_delta.FORMAT_ID`: nothing sorted or hashed, about seven
times cheaper for a million keys). Either backend restores both, at any parallelism. The
synchronous part takes a shallow copy of every table (a copy of
the dicts' slots, not of their values) and turns on copy-on-write: until the asynchronous part
has serialized the copy, the first access of a key whose value may be mutable (anything but
an int, float, str, bytes or None: lists, dicts, sets, user objects) replaces the live value by
a deep copy, so that in-place updates never reach the values being serialized. Copy-on-write
stays on until every live capture is released.
"""

from __future__ import annotations

import copy
import functools
import itertools
import operator
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state import canonical, changelog, changelog_delta, restoring
from sparkpoint.state.backend import (
    DELETED,
    ChangeSet,
    KeyedStateBackend,
    StateInfo,
)
from sparkpoint.state.key_groups import KeyGroupRange, key_groups_of, stable_hash
from sparkpoint.state.slot_table import COLUMN_SERIALIZERS, SlotTable
from sparkpoint.state.snapshot_contracts import (
    SavedVersion,
    SnapshotCapture,
    SnapshotTarget,
    VersionStore,
)
from sparkpoint.state.snapshot_format import SNAPSHOT_MAGIC, decode_snapshot

__all__ = ["HashMapKeyedStateBackend", "TrackedTable"]

_SIZE_SAMPLE = 256  # entries per state that state_size() measures
# Values that cannot change in place: never copied. Anything else (a list, a dict, a user
# object that a value state holds and the user mutates) may, so the capture's copy is kept.
_IMMUTABLE = (int, float, complex, str, bytes, type(None))
_MISSING: Any = object()
# Guards the count of live captures: a capture is taken on the task thread and released on the
# upload thread (rare events: one lock for every backend of the process is enough).
_CAPTURES_LOCK = threading.Lock()


class TrackedTable(dict[Any, Any]):
    """A dict that records the keys read or written (see the module docstring)."""

    __slots__ = ("cow", "touched")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.touched: set[Any] = set()
        self.cow: set[Any] | None = None  # keys copied since the last capture; None: off

    def _own(self, key: Any) -> None:
        """Copy-on-write: the first access to a mutable value after a capture copies it."""
        cow = self.cow
        if cow is not None and key not in cow:
            cow.add(key)
            value = dict.get(self, key, _MISSING)
            if value is not _MISSING and not isinstance(value, _IMMUTABLE):
                dict.__setitem__(self, key, copy.deepcopy(value))

    def get(self, key: Any, default: Any = None) -> Any:
        self.touched.add(key)
        if self.cow is not None:
            self._own(key)
        return dict.get(self, key, default)

    def __getitem__(self, key: Any) -> Any:
        self.touched.add(key)
        if self.cow is not None:
            self._own(key)
        return dict.__getitem__(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.touched.add(key)
        cow = self.cow  # read once: the upload thread may release the capture meanwhile
        if cow is not None:
            cow.add(key)  # a new value: nothing shared with the capture
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        self.touched.add(key)
        dict.__delitem__(self, key)

    def pop(self, key: Any, default: Any = None) -> Any:
        self.touched.add(key)
        return dict.pop(self, key, default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.touched.add(key)
        if self.cow is not None:
            self._own(key)
        return dict.setdefault(self, key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        new = dict(*args, **kwargs)
        self.touched.update(new)
        cow = self.cow
        if cow is not None:
            cow.update(new)
        dict.update(self, new)

    def get_many(self, keys: list[Any], default: Any) -> list[Any]:
        self.touched.update(keys)
        values = list(map(dict.get, itertools.repeat(self), keys, itertools.repeat(default)))
        cow = self.cow
        if cow is None:
            return values
        if all(map(isinstance, values, itertools.repeat(_IMMUTABLE))):
            cow.update(keys)  # nothing to copy: what _own would do, at once
            return values
        for key in keys:
            self._own(key)
        return list(map(dict.get, itertools.repeat(self), keys, itertools.repeat(default)))

    def put_many(self, keys: list[Any], values: list[Any]) -> None:
        self.touched.update(keys)
        cow = self.cow
        if cow is not None:
            cow.update(keys)
        dict.update(self, zip(keys, values, strict=True))

    def __reduce__(self) -> Any:  # a plain dict when pickled: tracking is per process
        return (dict, (dict(self),))

    # The backend's own access, shared with SlotTable: restores are not changes.

    def raw_set(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)

    def raw_pop(self, key: Any) -> None:
        dict.pop(self, key, None)

    def raw_update(self, keys: list[Any], values: list[Any]) -> None:
        dict.update(self, zip(keys, values, strict=True))

    def copy(self) -> dict[Any, Any]:
        """A shallow copy (of the slots, not the values)."""
        return dict(self)

    def take_changes(self, deleted: Any) -> dict[Any, Any]:
        """The keys read or written since the last call and their values (``deleted`` for a
        removed key); then none is."""
        keys = list(self.touched)
        self.touched = set()
        values = map(dict.get, itertools.repeat(self), keys, itertools.repeat(deleted))
        return dict(zip(keys, values, strict=False))


class _Capture(SnapshotCapture):
    """Shallow copies of the tables, serialized by :meth:`materialize`."""

    def __init__(self, backend: HashMapKeyedStateBackend, native: bool) -> None:
        self._backend = backend
        self._native = native
        self._infos = dict(backend._infos)
        self._copies = {name: table.copy() for name, table in backend._tables.items()}
        self._watermarks = dict(backend.channel_watermarks)
        self.state_size = backend.state_size()
        self._released = False
        with _CAPTURES_LOCK:
            backend._live_captures += 1
            for table in backend._tables.values():
                table.cow = set()

    def materialize(self, target: SnapshotTarget) -> list[Any]:
        backend = self._backend
        if self._native:
            blob = changelog_delta.encode_delta(
                self._infos,
                self._copies,
                max_parallelism=backend.max_parallelism,
                key_group_range=backend.key_group_range,
                watermarks=self._watermarks,
                full=True,
            )
            return [target.write(blob, fmt=changelog_delta.FORMAT_ID)]
        blob = canonical.encode_snapshot(
            self._infos,
            _entries(self._copies, backend.max_parallelism),
            max_parallelism=backend.max_parallelism,
            key_group_range=backend.key_group_range,
            watermarks=self._watermarks,
            backend=backend.name,
        )
        return [target.write(blob, fmt=canonical.FORMAT_ID)]

    def release(self) -> None:
        backend = self._backend
        with _CAPTURES_LOCK:
            if self._released:
                return
            self._released = True
            self._copies = {}
            backend._live_captures -= 1
            if backend._live_captures == 0:  # another capture still shares values: keep copying
                for table in backend._tables.values():
                    table.cow = None


class HashMapKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one subtask in dicts (see the module docstring)."""

    name = "hashmap"

    def __init__(self, max_parallelism: int, key_group_range: KeyGroupRange) -> None:
        super().__init__(max_parallelism, key_group_range)
        self._tables: dict[str, TrackedTable | SlotTable] = {}
        self._live_captures = 0  # snapshot captures taken and not yet released

    def _create_table(self, info: StateInfo) -> None:
        if info.kind == "value" and info.serializer in COLUMN_SERIALIZERS:
            self._tables[info.name] = SlotTable(info.name, info.serializer)
        else:
            self._tables[info.name] = TrackedTable()

    def _table(self, name: str) -> TrackedTable | SlotTable:
        return self._tables[name]

    # ------------------------------------------------------------------------- sizes

    def num_keys(self) -> int:
        tables = [table for table in self._tables.values() if table]
        if len(tables) <= 1:
            return len(tables[0]) if tables else 0
        return len(set().union(*tables))

    def state_size(self) -> int:
        """Approximate in-memory size of the state in bytes.

        Measured (``sys.getsizeof`` of keys and values, one level into containers) on up to
        256 entries per state and scaled to the number of entries.
        """
        total = 0.0
        for table in self._tables.values():
            if not table:
                continue
            sample = list(itertools.islice(table.items(), _SIZE_SAMPLE))
            measured = sum(_sizeof(key) + _sizeof(value) for key, value in sample)
            total += measured * len(table) / len(sample)
        return round(total)

    # ------------------------------------------------------------------------- export

    def entries(self) -> Iterable[tuple[int, str, Any, Any]]:
        tables = {name: table.copy() for name, table in self._tables.items()}
        return _entries(tables, self.max_parallelism)  # columns: the encoder takes them whole

    def load(self, entries: Iterable[tuple[int, str, Any, Any]]) -> None:
        start, end = self.key_group_range.start, self.key_group_range.end
        for key_group, name, key, value in entries:
            if start <= key_group <= end:
                table = self._tables[name]
                if value is DELETED:
                    table.raw_pop(key)
                else:
                    table.raw_set(key, value)

    def load_columns(self, name: str, keys: list[Any], values: list[Any]) -> None:
        table = self._tables[name]
        if not any(map(operator.is_, values, itertools.repeat(DELETED))):
            table.raw_update(keys, values)
            return
        for key, value in zip(keys, values, strict=True):
            if value is DELETED:
                table.raw_pop(key)
            else:
                table.raw_set(key, value)

    def take_changes(self) -> ChangeSet:
        changes: dict[str, Mapping[Any, Any]] = {}
        for name, table in self._tables.items():
            changed = table.take_changes(DELETED)
            if changed:
                changes[name] = changed
        return ChangeSet(dict(self._infos), changes, dict(self.channel_watermarks))

    # ------------------------------------------------------------------------- snapshots

    def snapshot(self, checkpoint_id: int, *, native: bool) -> SnapshotCapture:
        """The synchronous part: shallow copies, then copy-on-write. ``native``: the
        asynchronous part writes the tables' columns, else a canonical snapshot."""
        return _Capture(self, native)

    @classmethod
    def restore(
        cls,
        blobs: Iterable[bytes],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
    ) -> HashMapKeyedStateBackend:
        """A backend for ``key_group_range`` holding the state of those key groups in
        ``blobs``: canonical snapshots, checkpoints in the columns format, or legacy pickled
        snapshots (``SPKS``) of earlier versions.

        Raises:
            CorruptSnapshotError: a damaged blob, or one key group in two blobs.
            ConfigurationError: a blob taken with another max parallelism.
        """
        merge = restoring.SnapshotMerge(cls(max_parallelism, key_group_range))
        for index, blob in enumerate(blobs):
            if bytes(blob[: len(SNAPSHOT_MAGIC)]) == SNAPSHOT_MAGIC:
                _load_legacy(merge, decode_snapshot(blob, index), index)
            elif changelog_delta.is_delta(blob):
                merge.add_columns(changelog_delta.decode_delta(blob, f"snapshot {index}"), index)
            else:
                merge.add(canonical.decode_snapshot(blob, f"snapshot {index}"), index)
        backend = merge.finish()
        assert isinstance(backend, HashMapKeyedStateBackend)
        return backend

    # ------------------------------------------------------------------------- versions

    def save_version(self, store: VersionStore, tag: str, previous: str | None) -> SavedVersion:
        return changelog.save(self, store, tag, previous)

    @classmethod
    def open_version(
        cls, store: VersionStore, tag: str, max_parallelism: int, key_group_range: KeyGroupRange
    ) -> HashMapKeyedStateBackend | None:
        backend = cls(max_parallelism, key_group_range)
        live = changelog.open_version(backend, store, tag, catch_up=True)
        assert live is None or isinstance(live, HashMapKeyedStateBackend)
        return live

    def prune_versions(self, store: VersionStore, keep: set[str]) -> None:
        changelog.prune(store, keep)


def _entries(tables: Mapping[str, Mapping[Any, Any]], max_parallelism: int) -> Iterable[Any]:
    """``(key group, state, key, value)`` of every entry of ``tables``, as columns that the
    canonical encoding takes whole."""
    return canonical.EntryColumns(
        tables, functools.partial(_key_groups, max_parallelism=max_parallelism)
    )


def _key_groups(keys: list[Any], max_parallelism: int) -> list[int]:
    """The key group of every key: ints, strs and bytes at once (numpy), others one by one."""
    types = set(map(type, keys))
    if types <= {int, bool} or types == {str} or types == {bytes}:
        array = np.fromiter(keys, dtype=object, count=len(keys))
        return key_groups_of(array, max_parallelism).tolist()
    return [stable_hash(key) % max_parallelism for key in keys]


def _load_legacy(merge: restoring.SnapshotMerge, payload: dict[str, Any], index: int) -> None:
    """A pickled snapshot of an earlier version (format ``SPKS`` 1): states by key group."""
    backend = merge.backend
    assert isinstance(backend, HashMapKeyedStateBackend)
    restoring.check_max_parallelism(payload["max_parallelism"], backend.max_parallelism, index)
    states = payload["states"]
    for name, kind in states.items():
        restoring.register(backend, StateInfo(name, kind, "pickle"), index)
    start, end = backend.key_group_range.start, backend.key_group_range.end
    blob_start, blob_end = payload["key_group_range"]
    for key_group, by_state in payload["groups"].items():
        if not blob_start <= key_group <= blob_end:
            raise CorruptSnapshotError(
                f"snapshot {index} of key group range [{blob_start}, {blob_end}] "
                f"holds key group {key_group}"
            )
        if not start <= key_group <= end:
            continue
        merge.claim(key_group, index)
        for name, entries in by_state.items():
            if name not in states or not isinstance(entries, dict):
                raise CorruptSnapshotError(
                    f"snapshot {index}: key group {key_group} holds undeclared or "
                    f"malformed state {name!r}"
                )
            backend._tables[name].raw_update(list(entries), list(entries.values()))
    merge.add_watermarks(payload.get("watermarks", {}))


def _sizeof(value: Any) -> int:
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        size += sum(sys.getsizeof(item) for item in value)
    return size
