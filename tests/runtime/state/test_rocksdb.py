"""The rocksdb keyed state backend: what only it does (reopening its database, the write-back
cache's bound and table checks, RocksDB's key counts, state larger than its block cache).

The behaviour every backend shares is in test_backend_contract.py (and its _snapshots)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.errors import ConfigurationError
from sparkpoint.state.backend import StateInfo
from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.state.key_groups import KeyGroupOutOfRangeError, KeyGroupRange, key_group_for
from sparkpoint.state.rocksdb import RocksDBKeyedStateBackend
from sparkpoint.state.rocksdb_tables import _bytewise_order
from sparkpoint.state.table_states import add_to_many

from .conftest import COUNT, EVENTS, FULL, LAST_SEEN


@pytest.fixture
def backend(tmp_path: Path) -> Any:
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=str(tmp_path / "db"))
    yield backend
    backend.close()


def _table(backend: RocksDBKeyedStateBackend, name: str) -> dict[Any, Any]:
    return dict(backend.table(name).items())


# ----------------------------------------------------------------------------- reopening


def test_in_place_mutation_is_written_back(tmp_path: Path) -> None:
    db_dir = str(tmp_path / "db")
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=db_dir)
    events, last = backend.get_state(EVENTS), backend.get_state(LAST_SEEN)
    backend.set_current_key("k")
    events.add(1)
    last.put("u", 1)
    backend.flush()
    table = backend.table("events")
    table.get("k").append(2)  # what a vectorized operator does: mutate what it read
    backend.table("last-seen")["k"]["v"] = 2
    backend.close()
    reopened = RocksDBKeyedStateBackend(128, FULL, db_dir=db_dir, reopen=True)
    assert reopened.states == {"events": "list", "last-seen": "map"}
    assert _table(reopened, "events") == {"k": [1, 2]}
    assert _table(reopened, "last-seen") == {"k": {"u": 1, "v": 2}}
    reopened.close()
    fresh = RocksDBKeyedStateBackend(128, FULL, db_dir=db_dir)  # not reopen: starts empty
    assert fresh.states == {} and fresh.num_keys() == 0
    fresh.close()


# ----------------------------------------------------------------------------- tables


def test_put_many_of_none_removes_and_a_length_mismatch_is_named(
    backend: RocksDBKeyedStateBackend,
) -> None:
    backend.get_state(COUNT)
    counts = backend.table("count")
    counts.put_many(["k0", "k1"], [1, 2])
    backend.flush()
    counts.put_many(["k0"], [None])  # None removes (as table[key] = None)
    assert counts.get_many(["k0", "k1"], -1) == [-1, 2]
    assert len(counts) == 1 and _table(backend, "count") == {"k1": 2}
    with pytest.raises(ValueError) as info:
        counts.put_many(["a", "b"], [1])
    assert str(info.value) == "put_many on keyed state 'count': 2 keys, 1 values"
    assert _table(backend, "count") == {"k1": 2}  # refused before anything is written


def test_a_batch_with_a_key_of_another_key_group_is_refused_before_any_write(
    tmp_path: Path,
) -> None:
    low = KeyGroupRange(0, 63)
    backend = RocksDBKeyedStateBackend(128, low, db_dir=str(tmp_path / "db"))
    try:
        backend.get_state(COUNT)
        counts = backend.table("count")
        keys = [f"k{i}" for i in range(50)]
        mine = [k for k in keys if key_group_for(k, 128) in low]
        other = next(k for k in keys if key_group_for(k, 128) not in low)
        with pytest.raises(KeyGroupOutOfRangeError, match=f"given key '{other}' of key group"):
            counts.put_many([*mine, other], [1] * (len(mine) + 1))
        with pytest.raises(KeyGroupOutOfRangeError, match=f"given key '{other}' of key group"):
            counts.get_many([mine[0], other], -1)
        assert _table(backend, "count") == {}  # nothing of the refused batch was written
    finally:
        backend.close()


def test_cache_is_flushed_when_it_grows(tmp_path: Path) -> None:
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=str(tmp_path / "db"), cache_entries=10)
    events = backend.get_state(EVENTS)
    for i in range(100):
        backend.set_current_key(i % 37)
        events.add(i)
    table = backend.table("events")
    assert len(table._cache) <= 11  # type: ignore[attr-defined]
    assert _table(backend, "events") == {k: list(range(k, 100, 37)) for k in range(37)}
    backend.close()


def test_a_table_write_outside_the_range_is_refused(tmp_path: Path) -> None:
    backend = RocksDBKeyedStateBackend(128, KeyGroupRange(0, 42), db_dir=str(tmp_path / "db"))
    backend.get_state(COUNT)
    with pytest.raises(KeyGroupOutOfRangeError) as info:
        backend.table("count")["a"] = 2  # key group 55, written around set_current_key's check
    assert str(info.value) == (
        "keyed state 'count' was given key 'a' of key group 55, outside the key group range "
        "[0, 42] of this state backend (max_parallelism 128)"
    )
    with pytest.raises(KeyGroupOutOfRangeError, match="key group 55"):
        backend.table("count").put_many(["c", "a"], [1, 2])
    backend.close()


def test_names_directories_and_reopens_that_are_refused(
    backend: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    backend.get_state(COUNT)
    with pytest.raises(ConfigurationError, match="at most 255"):
        backend.register(StateInfo("x" * 300, "value", "pickle"))
    assert backend.states == {"count": "value"}
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(ConfigurationError, match=r"holds todo\.txt, which are not RocksDB files"):
        RocksDBKeyedStateBackend(128, FULL, db_dir=str(tmp_path / "notes"))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    with pytest.raises(ConfigurationError, match="does not fit in max_parallelism 64"):
        RocksDBKeyedStateBackend(64, FULL, db_dir=str(tmp_path / "other"))
    with pytest.raises(ConfigurationError, match="is open in another backend of this process"):
        RocksDBKeyedStateBackend(128, FULL, db_dir=backend.db_dir, reopen=True)
    backend.close()
    with pytest.raises(ConfigurationError) as info:
        RocksDBKeyedStateBackend(256, FULL, db_dir=backend.db_dir, reopen=True)
    assert "holds key group range [0, 127] of max_parallelism 128; it cannot be opened as key " in (
        str(info.value)
    )


# ----------------------------------------------------------------------------- sizes, entries


def test_num_keys_and_state_size(backend: RocksDBKeyedStateBackend) -> None:
    assert backend.num_keys() == 0
    count, events = backend.get_state(COUNT), backend.get_state(EVENTS)
    backend.set_current_key("a")
    count.update(1000)
    assert backend.num_keys() == 1
    events.add("x")
    backend.set_current_key("b")
    events.add("y")
    assert backend.num_keys() == 2  # distinct keys over all states
    assert 0 < backend.state_size() < 10_000
    backend.table("count").put_many(list(range(20_000)), [1] * 20_000)
    assert 20_000 <= backend.num_keys() <= 20_005  # RocksDB's estimate above 10,000 entries


def test_entries_by_key_group(backend: RocksDBKeyedStateBackend) -> None:
    backend.get_state(COUNT)
    backend.get_state(LAST_SEEN)
    backend.table("count").put_many(["a", "c", 8], [1, 2, 3])
    backend.table("last-seen")["a"] = {("p", 1): 1.5}
    assert list(backend.entries()) == [
        (15, "count", "c", 2),
        (48, "count", 8, 3),
        (55, "count", "a", 1),
        (55, "last-seen", "a", {("p", 1): 1.5}),
    ]


# ----------------------------------------------------------------------------- big state


def _value(i: int) -> bytes:
    return hashlib.shake_128(i.to_bytes(8, "little")).digest(4096)  # incompressible


def test_state_larger_than_the_block_cache(tmp_path: Path) -> None:
    process = psutil.Process()
    n = 50_000  # 200 MB of values, against an 8 MB block cache
    backend = RocksDBKeyedStateBackend(
        128,
        FULL,
        db_dir=str(tmp_path / "db"),
        block_cache_bytes=8 << 20,
        write_buffer_bytes=4 << 20,
        cache_entries=2_000,
    )
    backend.get_state(ValueStateDescriptor("blob", serializer="bytes"))
    table = backend.table("blob")
    started, rss_before, peak = time.monotonic(), process.memory_info().rss, 0
    for low in range(0, n, 1_000):
        keys = list(range(low, low + 1_000))
        table.put_many(keys, [_value(i) for i in keys])
        peak = max(peak, process.memory_info().rss)
    backend.flush()
    assert backend.state_size() > 150 << 20
    for low in range(0, n, 1_000):
        keys = list(range(low, low + 1_000))
        assert table.get_many(keys, None) == [_value(i) for i in keys]
        peak = max(peak, process.memory_info().rss)
    assert key_group_for(n - 1) in FULL and table.get(n) is None
    backend.close()
    # RocksDB's block cache, memtables and the Python side (~80 MB measured): half the state.
    assert peak - rss_before < 100 << 20, f"RSS grew by {(peak - rss_before) >> 20} MB"
    assert time.monotonic() - started < 30


def test_put_many_writes_through_so_a_snapshot_has_nothing_left_to_write(tmp_path: Path) -> None:
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=str(tmp_path / "db"))
    backend.get_state(COUNT)
    table = backend.table("count")
    keys = list(range(1000))
    table.put_many(keys, table.get_many(keys, 0))
    table.put_many(keys, [k + 1 for k in keys])
    assert table.flush() == 0  # every value already in RocksDB
    assert table.get_many([1, 2], 0) == [2, 3]
    table[3] = 40  # a key-by-key write stays cached until the flush
    assert table.flush() == 3  # 1 and 2 were handed out by get_many: written again
    reopened = dict(backend.table("count").items())
    assert reopened[3] == 40 and reopened[999] == 1000
    backend.close()


def test_put_many_writes_in_batches_and_a_snapshot_keeps_the_cache_clean(tmp_path: Path) -> None:
    backend = RocksDBKeyedStateBackend(
        128, FULL, db_dir=str(tmp_path / "db"), write_buffer_bytes=1 << 20
    )
    backend.get_state(ValueStateDescriptor("blob", serializer="bytes"))
    table = backend.table("blob")
    keys = list(range(3_000))
    table.put_many(keys, [_value(i)[:1_000] for i in keys])  # 3 MB: three batches
    # RocksDB moved to a new memtable between batches (the full ones flush in the background).
    active = backend.db.property_int_value("rocksdb.num-entries-active-mem-table")
    assert active is not None and active < 2_000
    table[5] = b"five"
    del table[6]
    backend.snapshot(1, native=True).release()  # writes the two dirty entries, keeps the rest
    cache = table._cache  # type: ignore[attr-defined]
    assert len(cache) == 3_000 and table.flush(evict=False) == 0
    assert table.get_many([5, 6, 7], None) == [b"five", None, _value(7)[:1_000]]
    stored = dict(table.items())  # items() empties the cache and reads RocksDB
    assert len(cache) == 0 and len(stored) == 2_999
    assert stored[5] == b"five" and 6 not in stored and stored[2_999] == _value(2_999)[:1_000]
    backend.close()


def test_add_many_adds_numbers_in_one_pass_and_refuses_a_wrapping_sum(
    backend: RocksDBKeyedStateBackend,
) -> None:
    backend.get_state(ValueStateDescriptor("total", serializer="int64"))
    backend.get_state(ValueStateDescriptor("mean", serializer="float64"))
    totals = backend.table("total")
    totals.put_many(["a", "b"], [1, 2])
    backend.set_current_key("c")  # a value set key by key, still in the write-back cache
    backend.get_state(ValueStateDescriptor("total", serializer="int64")).update(5)
    added = add_to_many(totals, ["a", "c", "d"], np.array([10, 20, 30], dtype=np.int64))
    assert added.tolist() == [11, 25, 30]
    assert _table(backend, "total") == {"a": 11, "b": 2, "c": 25, "d": 30}
    means = backend.table("mean")
    assert add_to_many(means, ["x"], np.array([0.5])).tolist() == [0.5]
    assert add_to_many(means, ["x", "y"], np.array([1.25, 2.0])).tolist() == [1.75, 2.0]
    assert _table(backend, "mean") == {"x": 1.75, "y": 2.0}
    with pytest.raises(ConfigurationError, match="key 'b' was given 9223372036854775809"):
        add_to_many(totals, ["a", "b"], np.array([1, 2**63 - 1], dtype=np.int64))
    assert _table(backend, "total") == {"a": 11, "b": 2, "c": 25, "d": 30}  # nothing written
    backend.get_state(COUNT)  # a state of another serializer reads and writes key by key
    counts = backend.table("count")
    assert counts.add_many(["a"], np.array([1])) is None
    assert add_to_many(counts, ["a"], np.array([4])).tolist() == [4]
    assert _table(backend, "count") == {"a": 4}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=19).filter(lambda b: not b.endswith(b"\0"))))
def test_keys_are_read_and_written_in_rocksdbs_bytewise_order(keys: list[bytes]) -> None:
    fixed = np.array(keys, dtype=f"S{max(map(len, keys), default=1)}")
    order = _bytewise_order(fixed)
    assert [keys[i] for i in order.tolist()] == sorted(keys)


def test_add_many_of_many_str_keys_reads_and_writes_them_in_key_order(
    backend: RocksDBKeyedStateBackend,
) -> None:
    backend.get_state(ValueStateDescriptor("total", serializer="int64"))
    totals = backend.table("total")
    keys = [f"user-{i}" for i in range(5000, 0, -1)] + ["", "a\x00b"]  # ASCII: in key order
    first = add_to_many(totals, keys, np.arange(len(keys), dtype=np.int64))
    keys.append("naïve")  # not ASCII: the batch goes key by key
    again = add_to_many(totals, keys[::2], np.full(len(keys[::2]), 10, dtype=np.int64))
    assert first.tolist() == list(range(len(keys) - 1))
    assert again.tolist() == [v + 10 for v in range(0, len(keys) - 1, 2)] + [10]
    stored = _table(backend, "total")
    expected = {key: i + (10 if i % 2 == 0 else 0) for i, key in enumerate(keys[:-1])}
    assert stored == {**expected, "naïve": 10}
