"""The hashmap backend's tracked tables and snapshot captures: the keys an epoch read or
wrote, and copy-on-write that keeps a capture as of its synchronous part."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from sparkpoint.state import canonical
from sparkpoint.state.backend import DELETED
from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.state.hashmap import HashMapKeyedStateBackend, TrackedTable
from sparkpoint.testing import MemorySnapshotTarget

from .conftest import COUNT, EVENTS, FULL, LAST_SEEN, copy_of_tables, filled_hashmap


def test_tracked_table_records_every_key_read_or_written() -> None:
    table = TrackedTable({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5})
    assert table.touched == set()  # the initial contents are not changes
    assert table.get("a") == 1 and table.get("missing", 0) == 0
    assert table["b"] == 2
    table["x"] = 10
    assert table.pop("c") == 3 and table.pop("gone") is None
    assert table.get_many(["d", "nope"], -1) == [4, -1]
    table.put_many(["y", "z"], [20, 30])
    assert "e" in table and len(table) == 7  # membership and size are not reads of a value
    assert table.touched == {"a", "missing", "b", "x", "c", "gone", "d", "nope", "y", "z"}
    del table["x"]
    table.setdefault("s", [])
    table.update({"u": 1})
    assert {"s", "u"} <= table.touched
    assert dict(table) == {"a": 1, "b": 2, "d": 4, "e": 5, "y": 20, "z": 30, "s": [], "u": 1}


def test_tracked_table_pickles_as_a_plain_dict() -> None:
    table = TrackedTable({"a": [1]})
    table.get("a")
    copied = pickle.loads(pickle.dumps(table))
    assert type(copied) is dict and copied == {"a": [1]}


def test_take_changes_returns_current_values_and_tombstones_then_forgets() -> None:
    backend = filled_hashmap(6)
    events, last = backend.get_state(EVENTS), backend.get_state(LAST_SEEN)
    backend.set_current_key("k0")
    events.add("x")  # in place: the key was read, so it counts as changed
    backend.set_current_key("k3")
    last.remove("first")  # its last entry: the key's map state is gone
    backend.set_current_key("k4")
    assert events.get() == [4, "e4"]  # a read counts too
    counts = backend.table("count")
    counts.put_many(["k1", "k9"], [11, 99])
    counts.pop("k2")
    changes = backend.take_changes()
    assert changes.changes == {
        "events": {"k0": [0, "e0", "x"], "k4": [4, "e4"]},
        "last-seen": {"k3": DELETED},
        "count": {"k1": 11, "k9": 99, "k2": DELETED},
    }
    assert len(changes) == 6
    assert changes.states == backend.state_infos
    assert changes.watermarks == {0: 100, 1: 150}
    assert backend.take_changes().changes == {}  # forgotten
    backend.set_current_key("k5")
    backend.get_state(COUNT).value()
    assert backend.take_changes().changes == {"count": {"k5": 5}}


# ----------------------------------------------------------------------------- copy-on-write


def _materialize(capture: Any) -> dict[str, dict[Any, Any]]:
    """Run the asynchronous part of a capture; the snapshot's tables."""
    target = MemorySnapshotTarget(1, FULL)
    capture.materialize(target)
    (blob,) = target.blobs
    tables: dict[str, dict[Any, Any]] = {}
    for _, name, key, value in canonical.decode_snapshot(blob, "the capture").entries():
        tables.setdefault(name, {})[key] = value
    return tables


def test_capture_holds_the_values_as_of_the_synchronous_part() -> None:
    backend = filled_hashmap(4)
    events = backend.get_state(EVENTS)
    last = backend.get_state(LAST_SEEN)
    count = backend.get_state(COUNT)
    before = copy_of_tables(backend)
    capture = backend.snapshot(1, native=False)
    backend.set_current_key("k0")
    events.add("after")  # a list mutated in place
    last.put("after", 1)  # a map mutated in place
    count.update(100)
    backend.set_current_key("k2")
    events.clear()
    backend.set_current_key("k3")
    last.put("first", -3)  # an existing map entry overwritten in place
    backend.set_current_key("fresh")
    events.add("new")
    backend.table("count").put_many(["k1", "k2"], [-1, -2])  # vectorized writes
    try:
        assert _materialize(capture) == {n: t for n, t in before.items() if t}
    finally:
        capture.release()
    assert backend.table("events")["k0"] == [0, "e0", "after"]
    assert backend.table("last-seen")["k0"] == {"first": 0, "after": 1}
    assert backend.table("last-seen")["k3"] == {"first": -3}
    assert "k2" not in backend.table("events") and backend.table("events")["fresh"] == ["new"]


def test_copy_on_write_copies_each_value_once_and_stops_after_release() -> None:
    backend = filled_hashmap(2)
    table = backend.table("events")
    assert isinstance(table, TrackedTable)
    shared = dict.__getitem__(table, "k0")  # the object the capture's copy refers to
    capture = backend.snapshot(1, native=False)
    first = table.get("k0")
    assert first == shared and first is not shared  # the live table got its own copy
    assert table["k0"] is first and table.get_many(["k0"], None)[0] is first  # only once
    capture.release()
    after = table.get("k0")
    after.append("no copy")
    assert after is first and table.get("k0") is first  # no copying without a capture
    assert all(t.cow is None for t in backend._tables.values())


@dataclass
class Accumulator:
    total: int = 0


def test_copy_on_write_protects_a_user_object_mutated_in_place() -> None:
    backend = HashMapKeyedStateBackend(128, FULL)
    acc = backend.get_state(ValueStateDescriptor("acc"))
    backend.set_current_key("a")
    acc.update(Accumulator(1))
    capture = backend.snapshot(1, native=False)
    acc.value().total += 41  # in place, as a value read from a table may be
    try:
        assert _materialize(capture) == {"acc": {"a": Accumulator(1)}}
    finally:
        capture.release()
    assert acc.value() == Accumulator(42)


def test_releasing_one_capture_keeps_another_protected() -> None:
    backend = filled_hashmap(1)
    events = backend.get_state(EVENTS)
    backend.set_current_key("k0")
    first = backend.snapshot(1, native=False)
    events.add("between")
    second = backend.snapshot(2, native=False)
    first.release()
    first.release()  # twice is harmless
    events.add("after both")
    try:
        assert _materialize(second)["events"] == {"k0": [0, "e0", "between"]}
    finally:
        second.release()
    assert events.get() == [0, "e0", "between", "after both"]
    assert all(t.cow is None for t in backend._tables.values())
