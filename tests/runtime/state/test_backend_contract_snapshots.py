"""What every keyed state backend must do with snapshots, run against each of them: canonical
snapshots taken and restored (with rescaling, merged watermarks, kept serializers), and the
working state's columnar files loaded into either backend.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparkpoint.errors import ConfigurationError
from sparkpoint.state import canonical
from sparkpoint.state.backend import DELETED, KeyedStateBackend, StateInfo
from sparkpoint.state.changelog_delta import decode_delta, encode_delta
from sparkpoint.state.descriptors import ListStateDescriptor, ValueStateDescriptor
from sparkpoint.state.key_groups import KeyGroupRange, key_group_for, key_group_range
from sparkpoint.testing import MemorySnapshotTarget, snapshot_blob

from .conftest import COUNT, EVENTS, FULL, KEYS, LAST_SEEN, contents, contents_of_subtasks, fill
from .contract import Backends, table_of, write_back

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
    assert table_of(restored, "events") == {"a": [1]} and table_of(restored, "count") == {"a": 1}
    assert table_of(backend, "events") == {"a": [1, 2]} and table_of(backend, "count") == {"a": 999}


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
    assert table_of(low, "count") == {"c": 2, 8: 3}
    assert low.states == {"count": "value", "events": "list", "last-seen": "map"}
    high = backends.restore([blob], KeyGroupRange(51, 127))
    assert table_of(high, "count") == {"a": 1} and table_of(high, "events") == {"a": [0, "0"]}


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
    write_back(backend)
    mine = {k: v for k, v in counts.items() if key_group_for(k, 128) in low}
    assert 50 < len(mine) < 150  # both halves had keys: the other half was skipped
    assert table_of(backend, "count") == {k: v for k, v in mine.items() if v is not DELETED}
    assert table_of(backend, "events") == ({keys[5]: [1, "x"]} if keys[5] in mine else {})
