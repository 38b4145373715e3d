"""The hashmap keyed state backend: state semantics, snapshots, restore with rescaling."""

from __future__ import annotations

import pickle
import sys
from typing import Any

import pytest

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    NoCurrentKeyError,
    ValueStateDescriptor,
)
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import (
    KeyGroupOutOfRangeError,
    KeyGroupRange,
    key_group_for,
    key_group_range,
)

FULL = KeyGroupRange(0, 127)
COUNT = ValueStateDescriptor("count", default=0)
EVENTS = ListStateDescriptor("events")
LAST_SEEN = MapStateDescriptor("last-seen")


@pytest.fixture
def backend() -> HashMapKeyedStateBackend:
    return HashMapKeyedStateBackend(128, FULL)


def _contents(backend: HashMapKeyedStateBackend) -> dict[str, dict[Any, Any]]:
    return {name: dict(backend.table(name)) for name in backend.states}


# ----------------------------------------------------------------------------- value state


def test_value_state_per_key(backend: HashMapKeyedStateBackend) -> None:
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
    assert backend.table("count") == {"a": 2, "b": 5}
    assert backend.current_key == "a" and backend.current_key_group == 55


def test_value_state_clear_and_update_none(backend: HashMapKeyedStateBackend) -> None:
    plain = backend.get_state(ValueStateDescriptor("plain"))
    backend.set_current_key(1)
    assert plain.value() is None
    plain.update("x")
    assert plain.value() == "x"
    plain.update(None)  # as Flink's update(null): clears
    assert plain.value() is None and backend.table("plain") == {}
    plain.update("y")
    plain.clear()
    assert plain.value() is None and backend.table("plain") == {}
    plain.clear()  # clearing an absent value is fine
    assert backend.num_keys() == 0


def test_value_state_mutable_default_is_not_shared(backend: HashMapKeyedStateBackend) -> None:
    seen = backend.get_state(ValueStateDescriptor("seen", default=[]))
    backend.set_current_key("a")
    seen.value().append(1)  # a copy: changing it changes nothing
    backend.set_current_key("b")
    assert seen.value() == []
    assert backend.table("seen") == {}


# ----------------------------------------------------------------------------- list state


def test_list_state(backend: HashMapKeyedStateBackend) -> None:
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
    backend.set_current_key("b")
    events.add_all(iter([7]))
    assert events.get() == [7]
    events.update([8, 9])
    assert events.get() == [8, 9]
    events.update([])
    assert events.get() == []
    backend.set_current_key("a")
    events.clear()
    assert events.get() == [] and backend.table("events") == {}


# ----------------------------------------------------------------------------- map state


def test_map_state(backend: HashMapKeyedStateBackend) -> None:
    last = backend.get_state(LAST_SEEN)
    backend.set_current_key("a")
    assert last.is_empty() and last.get("x") is None and not last.contains("x")
    assert last.keys() == [] and last.values() == [] and last.items() == []
    last.put("x", 1)
    last.put_all({"y": 2, "z": 3})
    last.put_all({})
    last.put("x", 10)
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
    assert backend.table("last-seen") == {"a": {"x": 10, "z": 3}}
    backend.set_current_key("a")
    last.clear()
    assert last.is_empty() and backend.num_keys() == 0


# ----------------------------------------------------------------------------- errors


def test_state_without_current_key_is_refused(backend: HashMapKeyedStateBackend) -> None:
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


def test_key_outside_the_backend_range_is_refused() -> None:
    backend = HashMapKeyedStateBackend(128, KeyGroupRange(0, 42))
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


def test_precomputed_key_group(backend: HashMapKeyedStateBackend) -> None:
    backend.set_current_key("a", key_group=55)
    assert backend.current_key_group == 55


def test_state_name_with_another_kind_is_refused(backend: HashMapKeyedStateBackend) -> None:
    backend.get_state(COUNT)
    with pytest.raises(ConfigurationError) as info:
        backend.get_state(ListStateDescriptor("count"))
    assert str(info.value) == (
        "keyed state 'count' is a value state; it cannot be used as a list state"
    )


def test_unknown_table_is_refused(backend: HashMapKeyedStateBackend) -> None:
    backend.get_state(COUNT)
    with pytest.raises(ConfigurationError) as info:
        backend.table("sum")
    assert str(info.value) == (
        "no keyed state named 'sum' (registered: count); call get_state(descriptor) first"
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: HashMapKeyedStateBackend(0, FULL), "max_parallelism must be between 1 and 32768"),
        (
            lambda: HashMapKeyedStateBackend(64, FULL),
            "key group range [0, 127] does not fit in max_parallelism 64 (key groups 0 to 63)",
        ),
        (
            lambda: HashMapKeyedStateBackend(128, (0, 127)),  # type: ignore[arg-type]
            "must be a KeyGroupRange, got tuple",
        ),
        (lambda: ValueStateDescriptor(""), "a ValueStateDescriptor needs a non-empty str name"),
    ],
)
def test_invalid_construction(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()
    assert message in str(info.value)


# ----------------------------------------------------------------------------- raw tables


def test_raw_table_for_vectorized_operators(backend: HashMapKeyedStateBackend) -> None:
    backend.get_state(COUNT)
    counts = backend.table("count")
    for key, n in {"a": 3, "b": 1}.items():  # what a batch count operator does
        counts[key] = counts.get(key, 0) + n
    backend.set_current_key("a")
    assert backend.get_state(COUNT).value() == 3


def test_snapshot_refuses_a_raw_key_outside_the_range() -> None:
    backend = HashMapKeyedStateBackend(128, KeyGroupRange(0, 42))
    backend.get_state(COUNT)
    backend.table("count")["c"] = 1
    backend.table("count")["a"] = 2  # key group 55: written around set_current_key's check
    with pytest.raises(KeyGroupOutOfRangeError) as info:
        backend.snapshot()
    assert str(info.value) == (
        "keyed state 'count' holds key 'a' of key group 55, outside the key group range "
        "[0, 42] of this state backend (max_parallelism 128)"
    )


# ----------------------------------------------------------------------------- sizes


def test_num_keys_and_state_size(backend: HashMapKeyedStateBackend) -> None:
    assert backend.num_keys() == 0 and backend.state_size() == 0
    count, events = backend.get_state(COUNT), backend.get_state(EVENTS)
    backend.set_current_key("a")
    count.update(1000)
    assert backend.num_keys() == 1
    assert backend.state_size() == sys.getsizeof("a") + sys.getsizeof(1000)
    events.add("x")
    backend.set_current_key("b")
    events.add("y")
    assert backend.num_keys() == 2  # distinct keys over all states
    list_size = sys.getsizeof(["x"]) + sys.getsizeof("x")
    assert backend.state_size() == sys.getsizeof("a") + sys.getsizeof(1000) + 2 * (
        sys.getsizeof("a") + list_size
    )


def test_state_size_is_scaled_from_a_sample(backend: HashMapKeyedStateBackend) -> None:
    backend.get_state(COUNT)
    backend.table("count").update({i: 10**6 + i for i in range(1000)})
    per_entry = sys.getsizeof(10**6)  # small ints and large ints have different sizes
    sample = sum(sys.getsizeof(i) for i in range(256)) + 256 * per_entry
    assert backend.state_size() == round(sample * 1000 / 256)


# ----------------------------------------------------------------------------- snapshots


def _fill(backend: HashMapKeyedStateBackend, keys: list[Any]) -> None:
    count = backend.get_state(COUNT)
    events = backend.get_state(EVENTS)
    last = backend.get_state(LAST_SEEN)
    for i, key in enumerate(keys):
        backend.set_current_key(key)
        count.update(i + 1)
        if i % 2 == 0:
            events.add_all([i, str(i)])
        if i % 3 == 0:
            last.put(("page", i), float(i))


def test_snapshot_format(backend: HashMapKeyedStateBackend) -> None:
    count = backend.get_state(COUNT)
    backend.get_state(EVENTS)  # registered, never written
    for key, value in (("a", 1), ("c", 2), (8, 3)):
        backend.set_current_key(key)
        count.update(value)
    blob = backend.snapshot()
    assert blob[:5] == b"SPKS\x01"
    assert pickle.loads(blob[5:]) == {
        "max_parallelism": 128,
        "key_group_range": (0, 127),
        "states": {"count": "value", "events": "list"},
        "groups": {55: {"count": {"a": 1}}, 15: {"count": {"c": 2}}, 48: {"count": {8: 3}}},
        "watermarks": {},  # the operator's channel watermarks (event time)
    }


def test_snapshot_of_int_keys(backend: HashMapKeyedStateBackend) -> None:
    backend.get_state(COUNT)
    backend.table("count").update({0: "x", 8: "y", 2**63: "z", True: "t"})  # True == 1
    groups = pickle.loads(backend.snapshot()[5:])["groups"]
    assert groups == {
        57: {"count": {0: "x"}},
        48: {"count": {8: "y"}},
        34: {"count": {2**63: "z"}},
        108: {"count": {True: "t"}},
    }


def test_snapshot_is_a_copy(backend: HashMapKeyedStateBackend) -> None:
    events = backend.get_state(EVENTS)
    backend.set_current_key("a")
    events.add(1)
    blob = backend.snapshot()
    events.add(2)
    restored = HashMapKeyedStateBackend.restore([blob], 128, FULL)
    assert restored.table("events") == {"a": [1]}


def test_snapshot_then_restore_gives_identical_state(backend: HashMapKeyedStateBackend) -> None:
    keys: list[Any] = [f"app-{i}" for i in range(200)] + list(range(100)) + [None, (1, "x")]
    _fill(backend, keys)
    restored = HashMapKeyedStateBackend.restore([backend.snapshot()], 128, FULL)
    assert _contents(restored) == _contents(backend)
    assert restored.states == {"count": "value", "events": "list", "last-seen": "map"}
    assert restored.num_keys() == backend.num_keys() == 302
    restored.set_current_key("app-4")
    assert restored.get_state(COUNT).value() == 5
    assert restored.get_state(EVENTS).get() == [4, "4"]
    assert restored.get_state(LAST_SEEN).items() == []
    restored.set_current_key("app-3")
    assert restored.get_state(LAST_SEEN).items() == [(("page", 3), 3.0)]


def test_empty_backend_round_trip(backend: HashMapKeyedStateBackend) -> None:
    restored = HashMapKeyedStateBackend.restore([backend.snapshot()], 128, FULL)
    assert restored.states == {} and restored.num_keys() == 0
    assert HashMapKeyedStateBackend.restore([], 128, FULL).num_keys() == 0


def _rescale(
    blobs: list[bytes], parallelism: int, max_parallelism: int
) -> list[HashMapKeyedStateBackend]:
    return [
        HashMapKeyedStateBackend.restore(
            blobs, max_parallelism, key_group_range(i, parallelism, max_parallelism)
        )
        for i in range(parallelism)
    ]


def test_restore_with_parallelism_2_then_3_then_1() -> None:
    max_parallelism = 128
    keys: list[Any] = [f"user-{i}" for i in range(500)] + list(range(-50, 250))
    # Two subtasks, each filled with the keys it owns (as the key-group shuffle routes them).
    subtasks = [
        HashMapKeyedStateBackend(max_parallelism, key_group_range(i, 2, max_parallelism))
        for i in range(2)
    ]
    for subtask in subtasks:
        kg_range = subtask.key_group_range
        _fill(subtask, [k for k in keys if key_group_for(k, max_parallelism) in kg_range])
    before: dict[str, dict[Any, Any]] = {name: {} for name in ("count", "events", "last-seen")}
    for subtask in subtasks:
        for name, table in _contents(subtask).items():
            before[name].update(table)
    assert len(before["count"]) == len(keys)

    for parallelism in (3, 1):
        blobs = [subtask.snapshot() for subtask in subtasks]
        subtasks = _rescale(blobs, parallelism, max_parallelism)
        for name, expected in before.items():
            seen: dict[Any, Any] = {}
            for subtask in subtasks:
                table = subtask.table(name)
                assert not seen.keys() & table.keys()  # every key exactly once
                seen.update(table)
                assert all(key_group_for(k) in subtask.key_group_range for k in table)
            assert seen == expected
    assert [len(s.table("count")) for s in subtasks] == [800]


def test_restore_keeps_only_the_new_range(backend: HashMapKeyedStateBackend) -> None:
    _fill(backend, ["a", "c", 8])  # key groups 55, 15, 48
    blob = backend.snapshot()
    low = HashMapKeyedStateBackend.restore([blob], 128, KeyGroupRange(0, 50))
    assert low.table("count") == {"c": 2, 8: 3}
    assert low.states == {"count": "value", "events": "list", "last-seen": "map"}
    high = HashMapKeyedStateBackend.restore([blob], 128, KeyGroupRange(51, 127))
    assert high.table("count") == {"a": 1} and high.table("events") == {"a": [0, "0"]}


def test_restored_backend_is_picklable(backend: HashMapKeyedStateBackend) -> None:
    _fill(backend, ["a", "b"])
    count = backend.get_state(COUNT)
    backend.set_current_key("b")
    copy_backend, copy_state = pickle.loads(pickle.dumps((backend, count)))
    assert copy_state.value() == 2
    copy_state.update(7)
    assert copy_backend.table("count") == {"a": 1, "b": 7}
    assert backend.table("count") == {"a": 1, "b": 2}
    fresh = pickle.loads(pickle.dumps(HashMapKeyedStateBackend(128, FULL)))
    with pytest.raises(NoCurrentKeyError):
        fresh.get_state(COUNT).value()


# ----------------------------------------------------------------------------- corrupt input


def _blob(payload: Any, header: bytes = b"SPKS\x01") -> bytes:
    return header + pickle.dumps(payload, protocol=5)


GOOD = {
    "max_parallelism": 128,
    "key_group_range": (0, 127),
    "states": {"count": "value"},
    "groups": {55: {"count": {"a": 1}}},
}


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (
            b"",
            "snapshot 0 is not a hashmap state snapshot: it starts with b'', "
            "expected magic b'SPKS'",
        ),
        (b"XXXX\x01abc", "snapshot 0 is not a hashmap state snapshot: it starts with b'XXXX\\x01'"),
        (
            _blob(GOOD, b"SPKS\x02"),
            "snapshot 0 has format version 2; this version of Sparkpoint reads version 1",
        ),
        (_blob(GOOD)[:-3], "snapshot 0 cannot be decoded"),
        (b"SPKS\x01not a pickle", "snapshot 0 cannot be decoded (17 bytes)"),
        (_blob([1, 2]), "snapshot 0 is malformed: payload is a list, expected a dict"),
        (_blob({**GOOD, "groups": None}), "snapshot 0 is malformed: groups is not a mapping"),
        (
            _blob({k: v for k, v in GOOD.items() if k != "states"}),
            "snapshot 0 is malformed: missing states",
        ),
        (
            _blob({**GOOD, "states": {"count": "tree"}}),
            "snapshot 0 is malformed: states is not a mapping",
        ),
        (
            _blob({**GOOD, "key_group_range": (0, 10)}),
            "snapshot 0 of key group range [0, 10] holds key group 55",
        ),
        (
            _blob({**GOOD, "groups": {55: {"sum": {"a": 1}}}}),
            "key group 55 holds undeclared or malformed state 'sum'",
        ),
    ],
)
def test_corrupt_snapshots_are_refused(blob: bytes, message: str) -> None:
    with pytest.raises(CorruptSnapshotError) as info:
        HashMapKeyedStateBackend.restore([blob], 128, FULL)
    assert message in str(info.value)


def test_snapshot_with_another_max_parallelism_is_refused(
    backend: HashMapKeyedStateBackend,
) -> None:
    _fill(backend, ["a"])
    with pytest.raises(ConfigurationError) as info:
        HashMapKeyedStateBackend.restore([backend.snapshot()], 256, KeyGroupRange(0, 255))
    assert str(info.value) == (
        "snapshot 0 was taken with max_parallelism 128; it cannot be restored with "
        "max_parallelism 256 (every key would change key group)"
    )


def test_the_same_key_group_in_two_snapshots_is_refused(backend: HashMapKeyedStateBackend) -> None:
    _fill(backend, ["a"])
    blob = backend.snapshot()
    with pytest.raises(CorruptSnapshotError) as info:
        HashMapKeyedStateBackend.restore([blob, blob], 128, FULL)
    assert str(info.value) == (
        "key group 55 is in snapshots 0 and 1; the snapshots of one checkpoint have disjoint "
        "key group ranges"
    )


def test_conflicting_state_kinds_across_snapshots_are_refused() -> None:
    other = _blob({**GOOD, "states": {"count": "list"}, "groups": {}})
    with pytest.raises(CorruptSnapshotError, match="snapshot 1: keyed state 'count' is a value"):
        HashMapKeyedStateBackend.restore([_blob(GOOD), other], 128, FULL)
