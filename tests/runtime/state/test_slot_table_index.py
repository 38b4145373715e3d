"""The slot table's hash index (str keys found by 64-bit hashes a batch at a time): the same
answers as its dict, across new keys, single-key access, removal, restores and collisions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint import hash_grouping
from sparkpoint.state import hash_index, slot_table
from sparkpoint.state.backend import DELETED
from sparkpoint.state.slot_table import SlotTable

# Str keys a U array holds exactly, and some it does not ("a\x00" loses its NUL).
STR_KEYS = st.sampled_from(["a", "b", "", "é", "a\x00", "k" * 70, "app-1", "app-10", "x y"])
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("add_many"), st.dictionaries(STR_KEYS, st.integers(-9, 9))),
        st.tuples(st.just("add_grouped"), st.dictionaries(STR_KEYS, st.integers(-9, 9))),
        st.tuples(st.just("set"), st.one_of(STR_KEYS, st.just(7)), st.integers(-9, 9)),
        st.tuples(st.just("pop"), STR_KEYS),
        st.tuples(st.just("get"), STR_KEYS),
        st.tuples(st.just("take")),
        st.tuples(st.just("load"), st.lists(st.tuples(STR_KEYS, st.integers(-9, 9)))),
    ),
    max_size=30,
)


def _add(table: SlotTable, batch: dict[str, int]) -> list[int]:
    keys = list(batch)
    deltas = np.array(list(batch.values()), dtype=np.int64)
    return table.add_many(keys, deltas, np.array(keys, dtype=str)).tolist()


def _add_grouped(table: SlotTable, batch: dict[str, int]) -> dict[str, int]:
    """``add_many`` as the count operator calls it after grouping the keys by hash: in hash
    order, with the hashes (none when a key is too wide to hash or two share a hash)."""
    strings = np.array(list(batch), dtype=str)
    hashes = hash_grouping.string_hashes(strings)
    order = np.arange(len(strings)) if hashes is None else np.argsort(hashes, kind="stable")
    keys = [list(batch)[i] for i in order.tolist()]
    if hashes is not None:
        hashes = hashes[order]
        if np.any(hashes[1:] == hashes[:-1]):
            hashes = None
    deltas = np.array([batch[key] for key in keys], dtype=np.int64)
    totals = table.add_many(keys, deltas, strings[order], hashes).tolist()
    return dict(zip(keys, totals, strict=True))


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_the_index_answers_as_the_dict_does(ops: list[Any]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slot_table, "INDEX_MIN_KEYS", 1)  # every batch moves to the index
        table, model = SlotTable("total", "int64"), {}
        written: dict[Any, Any] = {}
        for op in ops:
            if op[0] in ("add_many", "add_grouped"):
                if op[0] == "add_many":
                    totals = _add(table, op[1])
                else:
                    by_key = _add_grouped(table, op[1])
                    totals = [by_key[key] for key in op[1]]
                for (key, delta), total in zip(op[1].items(), totals, strict=True):
                    model[key] = written[key] = model.get(key, 0) + delta
                    assert total == model[key]
            elif op[0] == "set":
                table[op[1]] = model[op[1]] = written[op[1]] = op[2]
            elif op[0] == "pop":
                if op[1] in model:
                    written[op[1]] = DELETED
                assert table.pop(op[1], "none") == model.pop(op[1], "none")
            elif op[0] == "load":  # a restore: repeated keys, the last one wins
                table.raw_update([k for k, _ in op[1]], [v for _, v in op[1]])
                model.update(op[1])
            elif op[0] == "get":
                assert table.get(op[1], "none") == model.get(op[1], "none")
            else:
                assert dict(table.take_changes(DELETED).items()) == {
                    k: model.get(k, DELETED) for k in written
                }
                written = {}
            assert table == model and len(table) == len(model)


def test_a_large_batch_of_str_keys_moves_to_the_index_and_single_keys_move_back() -> None:
    table = SlotTable("total", "int64")
    keys = [f"app-{i}" for i in range(10_000)]
    ones = np.ones(len(keys), dtype=np.int64)
    assert _add(table, dict(zip(keys, ones.tolist(), strict=True))) == [1] * len(keys)
    assert table._index is not None  # found by hash from here on
    half = keys[::2] + [f"new-{i}" for i in range(5000)]
    totals = _add(table, dict.fromkeys(half, 2))
    assert totals == [3] * 5000 + [2] * 5000
    assert table._index is not None and table._index.indexed == 15_000
    assert table["app-0"] == 3 and table["app-1"] == 1 and "new-4999" in table
    assert table._index is None  # a lookup of one key: the dict from now on
    assert _add(table, {"app-1": 5, "newer": 1}) == [6, 1] and table["newer"] == 1


def test_a_hash_shared_by_two_keys_sends_the_batch_to_the_dict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def few_hashes(strings: np.ndarray, width: int | None = None) -> np.ndarray:
        return np.arange(len(strings), dtype=np.uint64) % np.uint64(3)  # keys collide

    monkeypatch.setattr(hash_index, "string_hashes", few_hashes)
    monkeypatch.setattr(slot_table, "INDEX_MIN_KEYS", 1)
    table = SlotTable("total", "int64")
    assert _add(table, {"a": 1, "b": 1, "c": 1}) == [1, 1, 1]
    assert _add(table, {"d": 1, "c": 1, "a": 4}) == [1, 2, 5]  # "d" shares a's hash
    assert table._index is None and dict(table.items()) == {"a": 5, "b": 1, "c": 2, "d": 1}


def test_a_restored_table_indexes_its_loaded_keys() -> None:
    table = SlotTable("total", "int64")
    keys = [f"user-{i}" for i in range(5000)]
    table.raw_update(keys, list(range(5000)))
    totals = _add(table, {f"user-{i}": 1 for i in range(2500, 7500)})
    assert totals == list(range(2501, 5001)) + [1] * 2500
    assert table._index is not None and len(table) == 7500


def test_a_restore_of_many_str_keys_indexes_them_without_a_dict() -> None:
    table = SlotTable("total", "int64")
    table.raw_update([f"user-{i}" for i in range(5000)], list(range(5000)))
    assert table._slot is None and table._index is not None
    table.raw_update([f"user-{i}" for i in range(4000, 6000)], [-1] * 2000)  # the next delta
    assert table._slot is None and len(table) == 6000
    assert _add(table, {"user-1": 1, "user-4500": 1, "user-7000": 1}) == [2, 0, 1]
    assert table._index is not None and table._index.indexed == 6001


def test_a_restore_with_a_repeated_key_keeps_the_last_value() -> None:
    table = SlotTable("total", "int64")
    keys = [f"user-{i}" for i in range(5000)] + ["user-7"]
    table.raw_update(keys, [*range(5000), 70])
    assert len(table) == 5000 and table["user-7"] == 70 and table["user-4999"] == 4999
