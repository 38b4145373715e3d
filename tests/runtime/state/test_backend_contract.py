"""What every keyed state backend must do, run against each of them (``hashmap``, ``rocksdb``):
state semantics, the refusals, tables, changes, and canonical snapshots restored with rescaling.

What only one backend does (legacy snapshots, copy-on-write, the write-back cache, native and
incremental snapshots, working-state versions) is tested in that backend's own files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.errors import ConfigurationError
from sparkpoint.state import backends as backend_registry
from sparkpoint.state import canonical
from sparkpoint.state.backend import DELETED, KeyedStateBackend, StateInfo
from sparkpoint.state.changelog_delta import decode_delta, encode_delta
from sparkpoint.state.descriptors import (
    ListStateDescriptor,
    NoCurrentKeyError,
    ValueStateDescriptor,
)
from sparkpoint.state.key_groups import (
    KeyGroupOutOfRangeError,
    KeyGroupRange,
    key_group_for,
    key_group_range,
)
from sparkpoint.testing import MemorySnapshotTarget, snapshot_blob

from .conftest import COUNT, EVENTS, FULL, KEYS, LAST_SEEN, contents, contents_of_subtasks, fill


class BlobReader:
    """A :class:`~sparkpoint.state.backends.HandleReader` over canonical snapshots in memory:
    a handle is the position of its blob."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs
        self.handles: list[Any] = list(range(len(blobs)))

    def read_state(self, handle: Any) -> bytes:
        return self.blobs[handle]

    def fetch_native(self, handle: Any, dest_dir: str) -> None:
        raise AssertionError("the contract restores canonical snapshots only")


class Backends:
    """Creates and restores backends of one kind, each in a local directory of its own, as the
    runtime does (:mod:`sparkpoint.state.backends`); :meth:`close` closes them all."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self._root = root
        self._made: list[KeyedStateBackend] = []

    def _local_dir(self) -> str:
        return str(self._root / f"{self.name}-{len(self._made)}")

    def create(self, kg_range: KeyGroupRange = FULL) -> KeyedStateBackend:
        backend = backend_registry.create_backend(
            self.name, 128, kg_range, local_dir=self._local_dir()
        )
        self._made.append(backend)
        return backend

    def restore(self, blobs: list[bytes], kg_range: KeyGroupRange = FULL) -> KeyedStateBackend:
        reader = BlobReader(blobs)
        backend = backend_registry.restore_backend(
            self.name, reader.handles, reader, 128, kg_range, local_dir=self._local_dir()
        )
        self._made.append(backend)
        return backend

    def close(self) -> None:
        for backend in self._made:
            backend.close()


@pytest.fixture(params=backend_registry.BACKEND_NAMES)
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backends]:
    made = Backends(request.param, tmp_path)
    yield made
    made.close()


@pytest.fixture
def backend(backends: Backends) -> KeyedStateBackend:
    """An empty backend of each kind for key groups 0 to 127 of 128."""
    return backends.create()


def _table(backend: KeyedStateBackend, name: str) -> dict[Any, Any]:
    return dict(backend.table(name).items())


def _write_back(backend: KeyedStateBackend) -> None:
    """Write what a backend caches to its store (``rocksdb``'s write-back cache), so that
    what follows reads values loaded back from it; nothing for a backend without a cache."""
    flush = getattr(backend, "flush", None)
    if flush is not None:
        flush()


# ----------------------------------------------------------------------------- value state


def test_value_state_per_key(backend: KeyedStateBackend) -> None:
    count = backend.get_state(COUNT)
    backend.set_current_key("a")
    assert count.value() == 0  # the default
    count.update(count.value() + 1)
    count.update(count.value() + 1)
    backend.set_current_key("b")
    assert count.value() == 0
    count.update(5)
    backend.set_current_key("a")
    assert count.value() == 2
    assert _table(backend, "count") == {"a": 2, "b": 5}
    assert count.value() == 2  # read again after the table was read whole
    assert backend.current_key == "a" and backend.current_key_group == 55


def test_value_state_clear_and_update_none(backend: KeyedStateBackend) -> None:
    plain = backend.get_state(ValueStateDescriptor("plain"))
    backend.set_current_key(1)
    assert plain.value() is None
    plain.update("x")
    assert plain.value() == "x"
    plain.update(None)  # as Flink's update(null): clears
    assert plain.value() is None and _table(backend, "plain") == {}
    plain.update("y")
    _write_back(backend)
    plain.clear()
    assert plain.value() is None and _table(backend, "plain") == {}
    plain.clear()  # clearing an absent value is fine
    assert backend.num_keys() == 0


def test_value_state_mutable_default_is_not_shared(backend: KeyedStateBackend) -> None:
    seen = backend.get_state(ValueStateDescriptor("seen", default=[]))
    backend.set_current_key("a")
    seen.value().append(1)  # a copy: changing it changes nothing
    backend.set_current_key("b")
    assert seen.value() == []
    assert _table(backend, "seen") == {}


# ----------------------------------------------------------------------------- list state


def test_list_state(backend: KeyedStateBackend) -> None:
    events = backend.get_state(EVENTS)
    backend.set_current_key("a")
    assert events.get() == []
    events.add(1)
    events.add(None)
    events.add_all([2, 3])
    events.add_all([])
    assert events.get() == [1, None, 2, 3]
    got = events.get()
    got.append(99)  # a copy
    assert events.get() == [1, None, 2, 3]
    _write_back(backend)
    events.add(4)  # appended in place to the stored value
    _write_back(backend)
    assert events.get() == [1, None, 2, 3, 4]
    backend.set_current_key("b")
    events.add_all(iter([7]))
    assert events.get() == [7]
    events.update([8, 9])
    assert events.get() == [8, 9]
    events.update([])
    assert events.get() == []
    backend.set_current_key("a")
    events.clear()
    assert events.get() == [] and _table(backend, "events") == {}


# ----------------------------------------------------------------------------- map state


def test_map_state(backend: KeyedStateBackend) -> None:
    last = backend.get_state(LAST_SEEN)
    backend.set_current_key("a")
    assert last.is_empty() and last.get("x") is None and not last.contains("x")
    assert last.keys() == [] and last.values() == [] and last.items() == []
    last.put("x", 1)
    last.put_all({"y": 2, "z": 3})
    last.put_all({})
    last.put("x", 10)
    _write_back(backend)
    assert last.get("x") == 10 and last.contains("y") and not last.is_empty()
    assert last.keys() == ["x", "y", "z"]
    assert last.values() == [10, 2, 3]
    assert last.items() == [("x", 10), ("y", 2), ("z", 3)]
    last.remove("y")
    last.remove("missing")
    assert last.items() == [("x", 10), ("z", 3)]
    backend.set_current_key("b")
    assert last.is_empty()
    last.put_all({"k": "v"})
    last.remove("k")  # the last entry: the key has no map state any more
    assert _table(backend, "last-seen") == {"a": {"x": 10, "z": 3}}
    backend.set_current_key("a")
    last.clear()
    assert last.is_empty() and backend.num_keys() == 0


# ----------------------------------------------------------------------------- refusals


def test_state_without_current_key_is_refused(backend: KeyedStateBackend) -> None:
    count = backend.get_state(COUNT)
    with pytest.raises(NoCurrentKeyError) as info:
        count.value()
    assert str(info.value) == (
        "keyed state 'count' was accessed with no current key: keyed state is only available "
        "in a keyed operator, after set_current_key(key)"
    )
    with pytest.raises(NoCurrentKeyError, match="no current key"):
        backend.get_state(EVENTS).add(1)
    with pytest.raises(NoCurrentKeyError, match="no current key"):
        backend.get_state(LAST_SEEN).put(1, 2)
    with pytest.raises(NoCurrentKeyError, match=r"call set_current_key\(key\) first"):
        _ = backend.current_key


def test_key_outside_the_backend_range_is_refused(backends: Backends) -> None:
    backend = backends.create(KeyGroupRange(0, 42))
    backend.set_current_key("c")  # key group 15
    with pytest.raises(KeyGroupOutOfRangeError) as info:
        backend.set_current_key("a")  # key group 55
    assert str(info.value) == (
        "key 'a' is in key group 55, outside the key group range [0, 42] of this state backend "
        "(max_parallelism 128)"
    )
    assert backend.current_key == "c"  # unchanged
    with pytest.raises(KeyGroupOutOfRangeError, match="key group 100"):
        backend.set_current_key("a", key_group=100)


def test_precomputed_key_group(backend: KeyedStateBackend) -> None:
    backend.set_current_key("a", key_group=55)
    assert backend.current_key_group == 55


def test_state_name_with_another_kind_is_refused(backend: KeyedStateBackend) -> None:
    backend.get_state(COUNT)
    with pytest.raises(ConfigurationError) as info:
        backend.get_state(ListStateDescriptor("count"))
    assert str(info.value) == (
        "keyed state 'count' is a value state; it cannot be used as a list state"
    )
    assert backend.states == {"count": "value"}


def test_unknown_table_is_refused(backend: KeyedStateBackend) -> None:
    backend.get_state(COUNT)
    with pytest.raises(ConfigurationError) as info:
        backend.table("sum")
    assert str(info.value) == (
        "no keyed state named 'sum' (registered: count); call get_state(descriptor) first"
    )


# ----------------------------------------------------------------------------- tables


def test_get_many_and_put_many(backend: KeyedStateBackend) -> None:
    backend.get_state(COUNT)
    counts = backend.table("count")
    keys = [f"k{i}" for i in range(1000)]
    counts.put_many(keys[:500], list(range(500)))
    _write_back(backend)
    got = counts.get_many([*keys, "k3", "k3"], -1)
    assert got == [*range(500), *([-1] * 500), 3, 3]
    counts.put_many(keys, [v + 1 for v in got[:1000]])  # a batch count operator
    assert counts.get_many(["k0", "k1", "k999"], None) == [1, 2, 0]
    assert len(counts) == 1000
    assert _table(backend, "count")["k500"] == 0
    with pytest.raises(ValueError):
        counts.put_many(["a", "b"], [1])


def test_batch_writes_of_every_key_kind(backends: Backends) -> None:
    """Keys of every kind written and read in batches as one by one."""
    low = KeyGroupRange(0, 63)
    backend = backends.create(low)
    backend.get_state(COUNT)
    counts = backend.table("count")
    mine = [key for key in KEYS if key_group_for(key, 128) in low]
    counts.put_many(mine, list(range(len(mine))))
    _write_back(backend)
    assert counts.get_many(mine, -1) == list(range(len(mine)))
    for i, key in enumerate(mine):
        backend.set_current_key(key)
        assert backend.get_state(COUNT).value() == i


def test_raw_table_writes_are_seen_by_the_state(backend: KeyedStateBackend) -> None:
    backend.get_state(COUNT)
    counts = backend.table("count")
    for key, n in {"a": 3, "b": 1}.items():  # what a batch count operator does
        counts[key] = counts.get(key, 0) + n
    backend.set_current_key("a")
    assert backend.get_state(COUNT).value() == 3


def test_dict_protocol_of_a_table(backend: KeyedStateBackend) -> None:
    backend.get_state(COUNT)
    table: Any = backend.table("count")
    table["a"] = 1
    assert "a" in table and "b" not in table and table["a"] == 1
    with pytest.raises(KeyError):
        table["b"]
    with pytest.raises(KeyError):
        del table["b"]
    assert table.setdefault("b", 7) == 7 and table.setdefault("b", 8) == 7
    assert table.pop("a") == 1 and table.pop("a", "gone") == "gone"
    del table["b"]
    assert len(table) == 0 and list(table.items()) == []


def test_in_place_mutation_of_a_list_value_is_persisted(backends: Backends) -> None:
    backend = backends.create()
    events, last = backend.get_state(EVENTS), backend.get_state(LAST_SEEN)
    backend.set_current_key("k")
    events.add(1)
    last.put("u", 1)
    _write_back(backend)
    backend.take_changes()
    backend.table("events").get("k").append(2)  # what a vectorized operator does
    backend.table("last-seen")["k"]["v"] = 2
    assert backend.take_changes().changes == {
        "events": {"k": [1, 2]},
        "last-seen": {"k": {"u": 1, "v": 2}},
    }
    assert _table(backend, "events") == {"k": [1, 2]}
    restored = backends.restore([snapshot_blob(backend)])
    assert _table(restored, "events") == {"k": [1, 2]}
    assert _table(restored, "last-seen") == {"k": {"u": 1, "v": 2}}


# ----------------------------------------------------------------------------- changes


def test_take_changes(backend: KeyedStateBackend) -> None:
    count, events = backend.get_state(COUNT), backend.get_state(EVENTS)
    backend.set_current_key("a")
    count.update(1)
    events.add(1)
    backend.channel_watermarks = {0: 5}
    first = backend.take_changes()
    assert first.changes == {"count": {"a": 1}, "events": {"a": [1]}}
    assert first.watermarks == {0: 5} and first.states == backend.state_infos
    assert len(backend.take_changes()) == 0
    events.get().append(2)  # a copy: but a read counts as a change
    backend.set_current_key("b")
    count.value()  # a miss is a change too: DELETED
    backend.set_current_key("a")
    count.clear()
    assert backend.take_changes().changes == {
        "count": {"a": DELETED, "b": DELETED},
        "events": {"a": [1]},
    }


# ----------------------------------------------------------------------------- snapshots


def test_writes_after_the_synchronous_part_are_not_in_the_snapshot(
    backends: Backends,
) -> None:
    backend = backends.create()
    count, events = backend.get_state(COUNT), backend.get_state(EVENTS)
    backend.set_current_key("a")
    count.update(1)
    events.add(1)
    capture = backend.snapshot(1, native=False)
    events.add(2)  # in place, after the synchronous part, before the asynchronous one
    count.update(999)
    target = MemorySnapshotTarget(1, FULL)
    try:
        (handle,) = capture.materialize(target)
    finally:
        capture.release()
    assert handle.format == canonical.FORMAT_ID
    restored = backends.restore(target.blobs)
    assert _table(restored, "events") == {"a": [1]} and _table(restored, "count") == {"a": 1}
    assert _table(backend, "events") == {"a": [1, 2]} and _table(backend, "count") == {"a": 999}


def test_snapshot_then_restore_gives_identical_state(
    backends: Backends, backend: KeyedStateBackend
) -> None:
    fill(backend, KEYS)
    backend.channel_watermarks = {0: 10, 1: 12}
    blob = snapshot_blob(backend)
    expected = contents(backend)
    snap = canonical.decode_snapshot(blob, "the snapshot")
    assert snap.backend == backends.name
    assert snap.entry_count == sum(len(table) for table in expected.values())
    restored = backends.restore([blob])
    assert contents(restored) == expected
    assert restored.states == {"count": "value", "events": "list", "last-seen": "map"}
    assert restored.state_infos == backend.state_infos
    assert restored.channel_watermarks == {0: 10, 1: 12}
    assert restored.num_keys() == backend.num_keys() == len(KEYS)
    restored.set_current_key("user-4")
    assert restored.get_state(COUNT).value() == 5
    assert restored.get_state(EVENTS).get() == [4, "4"]
    assert restored.get_state(LAST_SEEN).items() == []
    restored.set_current_key("user-3")
    assert restored.get_state(LAST_SEEN).items() == [(("page", 3), 3.0)]


def test_empty_backend_round_trip(backends: Backends, backend: KeyedStateBackend) -> None:
    restored = backends.restore([snapshot_blob(backend)])
    assert restored.states == {} and restored.num_keys() == 0
    assert backends.restore([]).num_keys() == 0


def test_restore_with_parallelism_2_then_3_then_1(backends: Backends) -> None:
    # Two subtasks, each filled with the keys it owns (as the key-group shuffle routes them).
    subtasks = [backends.create(key_group_range(i, 2, 128)) for i in range(2)]
    for subtask in subtasks:
        fill(subtask, [k for k in KEYS if key_group_for(k) in subtask.key_group_range])
    before = contents_of_subtasks(subtasks)
    assert set(before) == {"count", "events", "last-seen"}
    assert len(before["count"]) == len(KEYS)

    for parallelism in (3, 1):
        blobs = [snapshot_blob(subtask) for subtask in subtasks]
        subtasks = [
            backends.restore(blobs, key_group_range(i, parallelism, 128))
            for i in range(parallelism)
        ]
        assert contents_of_subtasks(subtasks) == before  # every key exactly once
    assert subtasks[0].num_keys() == len(KEYS)


def test_restore_keeps_only_the_new_range(backends: Backends, backend: KeyedStateBackend) -> None:
    fill(backend, ["a", "c", 8])  # key groups 55, 15, 48
    blob = snapshot_blob(backend)
    low = backends.restore([blob], KeyGroupRange(0, 50))
    assert _table(low, "count") == {"c": 2, 8: 3}
    assert low.states == {"count": "value", "events": "list", "last-seen": "map"}
    high = backends.restore([blob], KeyGroupRange(51, 127))
    assert _table(high, "count") == {"a": 1} and _table(high, "events") == {"a": [0, "0"]}


def test_restore_merges_the_channel_watermarks(backends: Backends) -> None:
    halves = [backends.create(key_group_range(i, 2, 128)) for i in range(2)]
    halves[0].channel_watermarks = {0: 10, 1: 50, 2: 7}
    halves[1].channel_watermarks = {0: 30, 1: 20}  # channel 2 unknown to it
    restored = backends.restore([snapshot_blob(h) for h in halves])
    assert restored.channel_watermarks == {0: 10, 1: 20}  # per channel the minimum


def test_restored_serializer_is_kept(backends: Backends, backend: KeyedStateBackend) -> None:
    total = backend.get_state(ValueStateDescriptor("total", serializer="int64"))
    backend.set_current_key("a")
    total.update(7)
    restored = backends.restore([snapshot_blob(backend)])
    assert restored.state_infos == {"total": StateInfo("total", "value", "int64")}
    with pytest.raises(ConfigurationError, match="written with serializer 'int64'"):
        restored.get_state(ValueStateDescriptor("total"))  # pickle, by default
    restored.set_current_key("a")
    assert restored.get_state(ValueStateDescriptor("total", serializer="int64")).value() == 7


# ----------------------------------------------------------------------------- working state


def test_a_columnar_delta_loads_only_this_backends_key_groups(backends: Backends) -> None:
    low = KeyGroupRange(0, 63)
    backend = backends.create(low)
    backend.get_state(ValueStateDescriptor("count", default=0, serializer="int64"))
    backend.get_state(ListStateDescriptor("events"))
    keys = [f"user-{i}" for i in range(200)]
    counts: dict[Any, Any] = {key: i for i, key in enumerate(keys)}
    removed = [key for key in keys if key_group_for(key, 128) in low][:3]
    for key in removed:
        counts[key] = DELETED  # removes a key loaded from an earlier file
    blob = encode_delta(
        backend.state_infos,
        {"count": counts, "events": {keys[5]: [1, "x"]}},
        max_parallelism=128,
        key_group_range=FULL,
        watermarks={},
    )
    backend.load_columns("count", removed, [-1, -2, -3])
    decode_delta(blob, "d").load_into(backend)
    _write_back(backend)
    mine = {k: v for k, v in counts.items() if key_group_for(k, 128) in low}
    assert 50 < len(mine) < 150  # both halves had keys: the other half was skipped
    assert _table(backend, "count") == {k: v for k, v in mine.items() if v is not DELETED}
    assert _table(backend, "events") == ({keys[5]: [1, "x"]} if keys[5] in mine else {})
