"""Reading a sorted batch from RocksDB: one scan when the batch is a large share of the
entries, point lookups otherwise, the same values either way."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from rocksdict import WriteBatch

from sparkpoint.state import rocksdb_store
from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.state.rocksdb import RocksDBKeyedStateBackend
from sparkpoint.state.rocksdb_store import get_sorted, multi_get, open_db
from sparkpoint.state.table_states import add_to_many

from .conftest import FULL


def _filled(path: Path, stored: list[bytes]) -> object:
    db = open_db(str(path))
    batch = WriteBatch(raw_mode=True)
    for key in stored:
        batch.put(key, key[::-1])
    db.write(batch)
    return db


@pytest.mark.parametrize("share", [0.1, 0.5, 1.0])
def test_a_sorted_batch_reads_the_same_values_by_scan_or_by_lookups(
    tmp_path: Path, share: float
) -> None:
    rng = random.Random(7)
    universe = [b"\x00\x07\x01count\x00\x03app-%d" % i for i in range(20_000)]
    stored = [*rng.sample(universe, 10_000), b"\x00\x07\x01other\x00\x03app-5"]  # a neighbour
    db = _filled(tmp_path / "db", stored)
    asked = sorted(rng.sample(universe, int(share * 10_000)))
    keys = np.array(asked, dtype=bytes)
    try:
        assert get_sorted(db, keys, asked) == multi_get(db, asked)  # type: ignore[arg-type]
        assert sum(v is not None for v in get_sorted(db, keys, asked)) > 0  # type: ignore[arg-type]
    finally:
        db.close()  # type: ignore[attr-defined]


def test_a_stored_key_ending_in_nul_sends_the_batch_to_point_lookups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = [b"k%05d" % i for i in range(2000)] + [b"k00010\x00"]  # "k00010" padded alike
    db = _filled(tmp_path / "db", stored)
    asked = [b"k%05d" % i for i in range(0, 4000, 2)]
    scanned: list[int] = []
    real = rocksdb_store.multi_get
    monkeypatch.setattr(rocksdb_store, "multi_get", lambda d, k: scanned.append(1) or real(d, k))
    try:
        values = get_sorted(db, np.array(asked, dtype=bytes), asked)  # type: ignore[arg-type]
    finally:
        db.close()  # type: ignore[attr-defined]
    assert scanned == [1]
    assert values == [key[::-1] if key in set(stored) else None for key in asked]


def test_counts_of_a_batch_covering_the_state_are_read_by_a_scan(tmp_path: Path) -> None:
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=str(tmp_path / "db"))
    try:
        backend.get_state(ValueStateDescriptor("count", 0, serializer="int64"))
        table = backend.table("count")
        keys = [f"user-{i}" for i in range(5000)]
        ones = np.ones(len(keys), dtype=np.int64)
        assert add_to_many(table, keys, ones, np.array(keys)).tolist() == [1] * 5000
        more = [f"user-{i}" for i in range(2500, 7500)]
        totals = add_to_many(table, more, 2 * ones, np.array(more))
        assert totals.tolist() == [3] * 2500 + [2] * 2500
        assert table.get("user-0") == 1 and table.get("user-7499") == 2
    finally:
        backend.close()
