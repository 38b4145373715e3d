"""The hashmap's table of int64/float64 value state (numbers in columns): it acts as a dict
of its entries, its changes are the keys written, its captures do not move, and it refuses
values its serializer could not write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import CountOperator
from sparkpoint.records import Batch
from sparkpoint.state.backend import DELETED
from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.state.hashmap import HashMapKeyedStateBackend, TrackedTable
from sparkpoint.state.slot_table import SlotColumns, SlotTable
from sparkpoint.state.table_states import add_to_many
from sparkpoint.testing import MemorySnapshotTarget, snapshot_blob

from .conftest import FULL
from .contract import Backends

TOTAL = ValueStateDescriptor("total", default=0, serializer="int64")
KEYS = st.sampled_from(["a", "b", "c", "d", 7, -3, (1, "x")])
NUMBERS = st.integers(-(1 << 63), (1 << 63) - 1)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, NUMBERS),
        st.tuples(st.just("pop"), KEYS),
        st.tuples(st.just("get"), KEYS),
        st.tuples(st.just("put_many"), st.lists(st.tuples(KEYS, NUMBERS), max_size=6)),
        st.tuples(st.just("add_many"), st.dictionaries(KEYS, st.integers(-1000, 1000))),
        st.tuples(st.just("get_many"), st.lists(KEYS, max_size=6)),
        st.tuples(st.just("take")),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(OPERATIONS)
def test_a_slot_table_acts_as_a_dict_and_its_changes_are_the_keys_written(ops: list) -> None:
    table, model = SlotTable("total", "int64"), {}
    written: dict[Any, Any] = {}
    for op in ops:
        if op[0] == "set":
            table[op[1]] = model[op[1]] = written[op[1]] = op[2]
        elif op[0] == "pop":
            present = op[1] in model
            assert table.pop(op[1], "none") == model.pop(op[1], "none")
            if present:  # removing an absent key changes nothing
                written[op[1]] = DELETED
        elif op[0] == "get":
            assert table.get(op[1], "none") == model.get(op[1], "none")
        elif op[0] == "put_many":
            keys, values = [k for k, _ in op[1]], [v for _, v in op[1]]
            table.put_many(keys, values)
            model.update(zip(keys, values, strict=True))
            written.update(zip(keys, values, strict=True))
        elif op[0] == "add_many":
            keys, deltas = list(op[1]), np.array(list(op[1].values()), dtype=np.int64)
            sums = [model.get(k, 0) + d for k, d in op[1].items()]
            if not all(-(1 << 63) <= total < 1 << 63 for total in sums):
                with pytest.raises(ConfigurationError, match="cannot hold"):
                    table.add_many(keys, deltas)
                continue
            totals = table.add_many(keys, deltas)
            for key, delta, total in zip(keys, deltas.tolist(), totals.tolist(), strict=True):
                model[key] = written[key] = model.get(key, 0) + delta
                assert total == model[key]
        elif op[0] == "get_many":
            assert table.get_many(op[1], None) == [model.get(k) for k in op[1]]
        else:
            changes = table.take_changes(DELETED)
            expected = {k: model.get(k, DELETED) for k in written}
            assert dict(changes.items()) == expected
            written = {}
        assert table == model and len(table) == len(model)
        assert all(k in table for k in model) and sorted(map(repr, table)) == sorted(
            map(repr, model)
        )


@pytest.mark.parametrize(
    ("serializer", "value"),
    [("int64", 1.5), ("int64", 1 << 63), ("int64", "7"), ("int64", None), ("float64", "x")],
)
def test_a_value_the_serializer_cannot_write_is_refused_naming_state_key_and_value(
    serializer: str, value: Any
) -> None:
    table = SlotTable("total", serializer)
    table.put_many(["kept"], [3])
    with pytest.raises(ConfigurationError, match=rf"'total'.*{serializer}.*'bad'.*{value!r}"):
        table["bad"] = value
    with pytest.raises(ConfigurationError, match="'bad'"):
        table.put_many(["fine", "bad"], [1, value])
    assert table == {"kept": 3}  # a refused batch writes nothing


def test_a_capture_keeps_the_values_of_its_synchronous_part() -> None:
    backend = HashMapKeyedStateBackend(128, FULL)
    total = backend.get_state(TOTAL)
    assert isinstance(backend.table("total"), SlotTable)
    add_to_many(backend.table("total"), ["a", "b"], np.array([1, 2]))
    capture = backend.snapshot(1, native=False)
    add_to_many(backend.table("total"), ["a", "c"], np.array([10, 30]))
    backend.set_current_key("b")
    total.update(None)
    expected = HashMapKeyedStateBackend(128, FULL)
    expected.get_state(TOTAL)
    add_to_many(expected.table("total"), ["a", "b"], np.array([1, 2]))
    target = MemorySnapshotTarget(1, FULL)
    capture.materialize(target)
    capture.release()
    assert target.blobs == [snapshot_blob(expected)]


def test_int64_state_moves_between_backends_through_a_snapshot(tmp_path: Path) -> None:
    hashmap = HashMapKeyedStateBackend(128, FULL)
    hashmap.get_state(TOTAL)
    keys = [f"user-{i}" for i in range(300)]
    add_to_many(hashmap.table("total"), keys, np.arange(300, dtype=np.int64))
    rocksdb = Backends("rocksdb", tmp_path)
    try:
        again = Backends("hashmap", tmp_path).restore(
            [snapshot_blob(rocksdb.restore([snapshot_blob(hashmap)]))]
        )
    finally:
        rocksdb.close()
    assert isinstance(again.table("total"), SlotTable)
    assert again.table("total") == dict(zip(keys, range(300), strict=True))


def test_add_to_many_gives_the_same_totals_on_a_table_of_objects() -> None:
    objects, numbers = TrackedTable(), SlotTable("n", "int64")
    for table in (objects, numbers):
        add_to_many(table, ["a", "b"], np.array([2, 3]))
    assert add_to_many(objects, ["b", "c"], np.array([1, 1])).tolist() == [4, 1]
    assert add_to_many(numbers, ["b", "c"], np.array([1, 1])).tolist() == [4, 1]
    assert objects == numbers == {"a": 2, "b": 4, "c": 1}


def test_a_count_restored_from_a_pickle_snapshot_keeps_pickle_and_counts_on() -> None:
    """Counts written by an earlier version (no declared serializer: pickle) restore as such."""
    old = HashMapKeyedStateBackend(128, FULL)
    old.get_state(ValueStateDescriptor("count", 0))
    old.table("count").put_many(["a", "b"], [5, 1])
    restored = HashMapKeyedStateBackend.restore([snapshot_blob(old)], 128, FULL)
    count = CountOperator("pv", "k", output="n", emit="every")
    count.open(restored)
    out = count.process(Batch.of_rows([{"k": "a"}, {"k": "c"}, {"k": "a"}]), restored)
    assert out.rows == [{"k": "a", "n": 6}, {"k": "c", "n": 1}, {"k": "a", "n": 7}]
    assert restored.state_infos["count"].serializer == "pickle"
    assert isinstance(restored.table("count"), TrackedTable)
    fresh = HashMapKeyedStateBackend(128, FULL)
    count.open(fresh)
    assert fresh.state_infos["count"].serializer == "int64"


def test_raw_update_of_an_empty_table_takes_slots_in_order_and_a_repeat_keeps_the_last() -> None:
    table = SlotTable("n", "int64")
    table.raw_update(["a", "b", "c"], [1, 2, 3])
    assert table == {"a": 1, "b": 2, "c": 3} and len(table) == 3
    assert table.take_changes(DELETED) == SlotColumns([], [])  # a restore is not a change
    table.raw_update(["c", "d"], [30, 4])
    assert table == {"a": 1, "b": 2, "c": 30, "d": 4}
    repeated = SlotTable("n", "int64")
    repeated.raw_update(["x", "y", "x"], [1, 2, 3])
    assert repeated == {"x": 3, "y": 2} and len(repeated) == 2
    with pytest.raises(ConfigurationError, match="key 'z' was given 'no'"):
        SlotTable("n", "int64").raw_update(["z"], ["no"])
