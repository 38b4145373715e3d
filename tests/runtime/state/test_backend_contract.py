"""What every keyed state backend must do, run against each of them (``hashmap``, ``rocksdb``):
state semantics, the refusals, tables and changes. Snapshots restored with rescaling and
working-state files are in ``test_backend_contract_snapshots.py``.

What only one backend does (legacy snapshots, copy-on-write, the write-back cache, native and
incremental snapshots, working-state versions) is tested in that backend's own files.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparkpoint.errors import ConfigurationError
from sparkpoint.records import DictColumn, object_array
from sparkpoint.state.backend import DELETED, KeyedStateBackend
from sparkpoint.state.descriptors import (
    ListStateDescriptor,
    NoCurrentKeyError,
    ValueStateDescriptor,
)
from sparkpoint.state.key_groups import (
    KeyGroupOutOfRangeError,
    KeyGroupRange,
    key_group_for,
)
from sparkpoint.testing import snapshot_blob

from .conftest import COUNT, EVENTS, KEYS, LAST_SEEN
from .contract import Backends, table_of, write_back

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
    assert table_of(backend, "count") == {"a": 2, "b": 5}
    assert count.value() == 2  # read again after the table was read whole
    assert backend.current_key == "a" and backend.current_key_group == 55


def test_value_state_clear_and_update_none(backend: KeyedStateBackend) -> None:
    plain = backend.get_state(ValueStateDescriptor("plain"))
    backend.set_current_key(1)
    assert plain.value() is None
    plain.update("x")
    assert plain.value() == "x"
    plain.update(None)  # as Flink's update(null): clears
    assert plain.value() is None and table_of(backend, "plain") == {}
    plain.update("y")
    write_back(backend)
    plain.clear()
    assert plain.value() is None and table_of(backend, "plain") == {}
    plain.clear()  # clearing an absent value is fine
    assert backend.num_keys() == 0


def test_value_state_mutable_default_is_not_shared(backend: KeyedStateBackend) -> None:
    seen = backend.get_state(ValueStateDescriptor("seen", default=[]))
    backend.set_current_key("a")
    seen.value().append(1)  # a copy: changing it changes nothing
    backend.set_current_key("b")
    assert seen.value() == []
    assert table_of(backend, "seen") == {}


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
    write_back(backend)
    events.add(4)  # appended in place to the stored value
    write_back(backend)
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
    assert events.get() == [] and table_of(backend, "events") == {}


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
    write_back(backend)
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
    assert table_of(backend, "last-seen") == {"a": {"x": 10, "z": 3}}
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


def test_each_key_makes_every_key_of_a_batch_current_in_turn(backend: KeyedStateBackend) -> None:
    """The per-record operators' key switching: as set_current_key of each key, for every
    kind of key and column (a str array, a dictionary-encoded one, objects)."""
    count = backend.get_state(COUNT)
    columns = [
        np.array(["a", "b", "a", "c"]),
        DictColumn(np.array([1, 0, 1, 1], dtype=np.int32), np.array(["x", "y"])),
        np.arange(-3, 3),
        object_array(KEYS),
    ]
    for column in columns:
        seen = []
        for key in backend.each_key(column):
            seen.append((key, backend.current_key, backend.current_key_group))
            count.update(count.value() + 1)
        assert seen == [(k, k, key_group_for(k, 128)) for k in column.tolist()]
    assert table_of(backend, "count")["a"] == 2 and table_of(backend, "count")["y"] == 3


def test_each_key_refuses_a_key_when_its_turn_comes(backends: Backends) -> None:
    """A key outside the range, or one that has no stable hash, raises what set_current_key
    raises, after the keys before it were made current (and stays the last good key)."""
    backend = backends.create(KeyGroupRange(0, 42))
    seen = []
    with pytest.raises(KeyGroupOutOfRangeError) as info:
        seen.extend(backend.each_key(np.array(["c", "c", "a", "c"])))  # a: key group 55
    assert seen == ["c", "c"] and backend.current_key == "c"
    assert str(info.value) == (
        "key 'a' is in key group 55, outside the key group range [0, 42] of this state backend "
        "(max_parallelism 128)"
    )
    seen.clear()
    with pytest.raises(TypeError, match="cannot compute a stable hash of a key of type"):
        seen.extend(backend.each_key(object_array(["c", {"not": "hashable"}])))
    assert seen == ["c"]


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
    write_back(backend)
    got = counts.get_many([*keys, "k3", "k3"], -1)
    assert got == [*range(500), *([-1] * 500), 3, 3]
    counts.put_many(keys, [v + 1 for v in got[:1000]])  # a batch count operator
    assert counts.get_many(["k0", "k1", "k999"], None) == [1, 2, 0]
    assert len(counts) == 1000
    assert table_of(backend, "count")["k500"] == 0
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
    write_back(backend)
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


def test_dict_protocol_of_atable_of(backend: KeyedStateBackend) -> None:
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
    write_back(backend)
    backend.take_changes()
    backend.table("events").get("k").append(2)  # what a vectorized operator does
    backend.table("last-seen")["k"]["v"] = 2
    assert backend.take_changes().changes == {
        "events": {"k": [1, 2]},
        "last-seen": {"k": {"u": 1, "v": 2}},
    }
    assert table_of(backend, "events") == {"k": [1, 2]}
    restored = backends.restore([snapshot_blob(backend)])
    assert table_of(restored, "events") == {"k": [1, 2]}
    assert table_of(restored, "last-seen") == {"k": {"u": 1, "v": 2}}


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
