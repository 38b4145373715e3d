"""Dictionary-encoded columns: DictColumn itself, and every place a batch's columns go."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from typing import Any

import numpy as np
import pytest

from sparkpoint.connectors.sinks import format_json_lines
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.functions import CountOperator, select_keys
from sparkpoint.graph import KeyedVertex
from sparkpoint.hash_grouping import mix64
from sparkpoint.records import Batch, DictColumn
from sparkpoint.runtime.tasks import _route
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_for, key_group_range, key_groups_of


def _objects(*items: Any) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


def _random_column(seed: int, n: int = 200) -> DictColumn:
    rng = np.random.default_rng(seed)
    values = np.array(["x", "y", 'q"uote', "ünï", "unused"])
    return DictColumn(rng.integers(0, 4, size=n), values)


# ----------------------------------------------------------------------------- the column


def test_a_dict_column_behaves_like_its_decoded_array() -> None:
    col = DictColumn(np.array([2, 0, 2, 1]), np.array(["a", "b", "c"]))
    plain = np.array(["c", "a", "c", "b"])
    assert col.codes.dtype == np.int32
    assert len(col) == 4 and col.dtype == plain.dtype and col.shape == (4,)
    assert col.tolist() == plain.tolist()
    assert np.array_equal(col.decode(), plain) and np.array_equal(np.asarray(col), plain)
    assert col[1] == "a"
    sliced, picked = col[1:3], col[np.array([3, 0])]
    assert isinstance(sliced, DictColumn) and sliced.values is col.values
    assert sliced.tolist() == ["a", "c"] and picked.tolist() == ["b", "c"]
    assert col[[True, False, False, True]].tolist() == ["c", "b"]
    assert col.nbytes == 4 * 4 + col.values.nbytes
    assert (col == "c").tolist() == [True, False, True, False]
    assert (col != "c").tolist() == [False, True, False, True]
    assert (col == plain).all()
    assert np.array_equal(np.concatenate([col, col[:1]]), ["c", "a", "c", "b", "c"])


def test_a_dict_column_checks_its_codes() -> None:
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 2\)"):
        DictColumn([0, 2], ["a", "b"])
    with pytest.raises(ValueError, match=r"codes must lie"):
        DictColumn([-1], ["a"])
    with pytest.raises(TypeError, match="codes must be integers"):
        DictColumn(np.array([0.5]), ["a"])
    assert DictColumn([], np.array([], dtype=str)).tolist() == []


def test_a_dict_column_pickles_codes_and_values_only() -> None:
    names = np.array([f"application-{i}" for i in range(100)])
    col = DictColumn(np.arange(100_000) % 100, names)[np.arange(0, 100_000, 2)]
    data = pickle.dumps(col, protocol=5)
    back = pickle.loads(data)
    assert isinstance(back, DictColumn) and back.tolist() == col.tolist()
    assert len(data) < col.codes.nbytes + names.nbytes + 1024
    assert len(data) * 5 < len(pickle.dumps(col.decode(), protocol=5))


def test_encode_round_trips() -> None:
    plain = np.array([3, 1, 3, 2])
    col = DictColumn.encode(plain)
    assert col.values.tolist() == [1, 2, 3] and col.tolist() == plain.tolist()


def test_batches_mix_dict_columns_and_arrays() -> None:
    col = DictColumn(np.array([1, 0, 1]), np.array(["a", "b"]))
    batch = Batch.of_columns(k=col, v=np.array([10, 20, 30]))
    assert batch.column("k") is col
    assert select_keys("k", batch) is col
    assert batch.rows == [{"k": "b", "v": 10}, {"k": "a", "v": 20}, {"k": "b", "v": 30}]
    taken = batch.take(np.array([2, 0]))
    assert isinstance(taken.column("k"), DictColumn)
    assert taken.rows == [{"k": "b", "v": 30}, {"k": "b", "v": 10}]
    assert batch.take([1]).rows == [{"k": "a", "v": 20}]
    assert batch.nbytes == col.nbytes + 3 * 8
    with pytest.raises(ValueError, match="differ in length"):
        Batch.of_columns(k=col, v=np.array([1]))


# ----------------------------------------------------------------------------- key groups


@pytest.mark.parametrize("max_parallelism", [1, 7, 128, 32768])
@pytest.mark.parametrize(
    "values",
    [
        np.array(["app-0", "app-1", "", "ünïcode", "app-1"]),
        np.array([b"a", b"bb", b"ccc"]),
        np.array([0, -1, 2**40, 7], dtype=np.int64),
        np.array([True, False]),
        np.array([0.5, 2.0, float("nan")]),
        _objects(1, 1.0, True, "a", None, (1, "b"), 2**70),
    ],
    ids=["str", "bytes", "int", "bool", "float", "object"],
)
def test_key_groups_of_a_dict_column_equal_the_scalar_key_group(
    values: np.ndarray, max_parallelism: int
) -> None:
    rng = np.random.default_rng(len(values))
    col = DictColumn(rng.integers(0, len(values), size=300), values)
    groups = key_groups_of(col, max_parallelism)
    assert groups.dtype == np.int32 and groups.shape == (300,)
    assert groups.tolist() == [key_group_for(k, max_parallelism) for k in col.tolist()]
    if values.dtype != object:
        assert np.array_equal(groups, key_groups_of(col.decode(), max_parallelism))


def test_routing_a_dict_column_splits_the_records_as_the_decoded_column_does() -> None:
    src = GeneratorSource(events=10_000, apps=37, rate=0)
    op = CountOperator("pv", "app_id", "pv", "epoch")
    keyed = KeyedVertex(op, 3, 128, inputs=("s",))
    encoded = src.read(1, 100, 2100)
    plain = Batch.of_columns(**{n: np.asarray(c) for n, c in encoded.columns.items()})
    routed = [(t, b.rows) for t, b in _route(encoded, keyed, 3)]
    assert routed == [(t, b.rows) for t, b in _route(plain, keyed, 3)]
    assert sum(len(rows) for _, rows in routed) == 2000


# ----------------------------------------------------------------------------- count


@pytest.mark.parametrize("seed", range(5))
def test_running_count_of_a_dict_column_equals_a_plain_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    op = CountOperator("c", "k", output="n", emit="every")
    backend = HashMapKeyedStateBackend(128, key_group_range(0, 1, 128))
    op.open(backend)
    seen: Counter[str] = Counter()
    # "x" twice among the values: both codes are one key, as in the state table.
    values = np.array(["x", "y", "z", "w", "x", "never"])
    for _ in range(3):
        keys = DictColumn(rng.integers(0, 5, size=int(rng.integers(0, 50))), values)
        out = op.process(Batch.of_columns(k=keys), backend)
        expected = []
        for k in keys.tolist():
            seen[k] += 1
            expected.append({"k": k, "n": seen[k]})
        assert out.rows == expected
    assert backend.table("count") == dict(seen)


def test_count_per_epoch_of_a_dict_column_equals_the_plain_array_path() -> None:
    def counts(encoded: bool) -> tuple[list[Any], dict[Any, int]]:
        op = CountOperator("c", "k", output="n", emit="epoch")
        backend = HashMapKeyedStateBackend(128, key_group_range(0, 1, 128))
        op.open(backend)
        for seed in range(3):
            col = _random_column(seed)
            keys: Any = col if encoded else col.decode()
            assert not len(op.process(Batch.of_columns(k=keys), backend))
        return op.flush_updates(backend).rows, dict(backend.table("count"))

    assert counts(True) == counts(False)


@pytest.mark.parametrize("seed", range(4))
def test_count_per_epoch_over_several_flushes_equals_a_plain_model(seed: int) -> None:
    """Batches counted together at each flush (dictionary-encoded, plain str, int and object
    keys, a value twice in one dictionary): each flush emits every key updated since the
    last with its total, the state holds every total, as a dict of counts would."""
    rng = np.random.default_rng(seed)
    op = CountOperator("c", "k", output="n", emit="epoch")
    backend = HashMapKeyedStateBackend(128, key_group_range(0, 1, 128))
    op.open(backend)
    model: Counter[Any] = Counter()
    names = np.array(["x", "y", "z", "w", "x", "v"])
    for _ in range(4):
        changed: dict[Any, int] = {}
        for _ in range(int(rng.integers(0, 4))):
            kind = int(rng.integers(0, 4))
            size = int(rng.integers(0, 30))
            keys: Any
            if kind == 0:
                keys = DictColumn(rng.integers(0, len(names), size=size), names)
            elif kind == 1:
                keys = rng.choice(names, size=size)
            elif kind == 2:
                keys = rng.integers(0, 5, size=size)
            else:
                keys = _objects(*rng.choice(["x", "y", 3, 4], size=size).tolist())
            assert not len(op.process(Batch.of_columns(k=keys), backend))
            for key in np.asarray(keys).tolist():
                model[key] += 1
                changed[key] = model[key]
        rows = op.flush_updates(backend).rows
        assert {row["k"]: row["n"] for row in rows} == changed
        assert len(rows) == len(changed)
    assert backend.table("count") == dict(model)


# ----------------------------------------------------------------------------- sink and source


@pytest.mark.parametrize(
    "values",
    [
        np.array(['a"b', "c", "ünï\n", "\\"]),
        np.array([1, -20, 2**62], dtype=np.int64),
        np.array([True, False]),
        np.array([0.5, 1e300, float("nan")]),
        _objects(3, 1.5, 2**70, -1, np.int64(4)),
    ],
    ids=["str", "int", "bool", "float", "object"],
)
def test_json_lines_of_a_dict_column_are_byte_identical(values: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    col = DictColumn(rng.integers(0, len(values), size=50), values)
    pv = np.arange(50)
    encoded = Batch.of_columns(k=col, pv=pv)
    plain = Batch.of_columns(k=col.decode(), pv=pv)
    assert format_json_lines(encoded) == format_json_lines(plain)
    assert format_json_lines(encoded).count("\n") == 50
    order = rng.permutation(50)[:20]
    assert format_json_lines(encoded.take(order)) == format_json_lines(plain.take(order))


def test_json_lines_of_a_dict_column_need_no_ordering_of_its_values() -> None:
    col = DictColumn(np.array([0, 1, 2, 1]), _objects("s", 3, None))
    assert format_json_lines(Batch.of_columns(k=col)) == (
        '{"k": "s"}\n{"k": 3}\n{"k": null}\n{"k": 3}\n'
    )


def test_json_lines_escape_braces_in_field_names() -> None:
    batch = Batch.of_columns(**{"{a}": np.array([1, 2]), "b}{": np.array(["{}", "x"])})
    assert format_json_lines(batch) == "".join(json.dumps(r) + "\n" for r in batch.rows)


def test_generated_app_ids_are_the_records_the_source_always_produced() -> None:
    def app_ids_before(src: GeneratorSource, split: int, start: int, end: int) -> list[str]:
        g = np.arange(start, end, dtype=np.int64) * src.splits + split
        idx = mix64(g.astype(np.uint64) ^ np.uint64(src.seed)) % np.uint64(src.apps)
        return [f"app-{i}" for i in idx.tolist()]

    for src, (start, end) in [
        (GeneratorSource(events=None, apps=100, rate=0, seed=3), (0, 5000)),
        (GeneratorSource(events=None, apps=100_000, splits=3), (7, 507)),  # fewer than apps
        (GeneratorSource(events=None, apps=100_000), (0, 20_000)),  # counted over the apps
        (GeneratorSource(events=None, apps=30_000_000_000), (0, 400)),  # names per batch
        (GeneratorSource(events=None, apps=1), (0, 0)),
    ]:
        for split in range(src.splits):
            batch = src.read(split, start, end)
            col = batch.column("app_id")
            assert isinstance(col, DictColumn)
            assert len(col.values) <= max(len(batch), 1) or len(col.values) == src.apps
            assert col.tolist() == app_ids_before(src, split, start, end)
            assert batch.rows == src.read(split, start, end).rows


def test_a_pickled_dict_column_of_ascii_str_ships_one_byte_per_character() -> None:
    ascii_values = np.array([f"app-{i}" for i in range(1000)] + ["", "a\x00b"])
    column = DictColumn(np.arange(len(ascii_values)) % len(ascii_values), ascii_values)
    blob = pickle.dumps(column, protocol=5)
    back = pickle.loads(blob)
    assert back.values.dtype == ascii_values.dtype
    assert back.values.tolist() == ascii_values.tolist()
    assert back.codes.tolist() == column.codes.tolist()
    assert len(blob) < ascii_values.nbytes / 2  # UTF-32 would need all of nbytes
    wide = np.array(["é", "naïve", "a"])  # not ASCII: shipped as it is
    back = pickle.loads(pickle.dumps(DictColumn([2, 0, 1], wide)))
    assert back.values.tolist() == wide.tolist()
    assert back.decode().tolist() == ["a", "é", "naïve"]


def test_a_pickled_selection_ships_only_the_values_its_codes_use() -> None:
    names = np.array([f"app-{i}" for i in range(10_000)])
    whole = DictColumn(np.arange(10_000)[::-1], names)
    half = whole[np.arange(0, 10_000, 2)]  # one target's share: it shares all 10,000 values
    assert len(half.values) == 10_000
    back = pickle.loads(pickle.dumps(half, protocol=5))
    assert back.tolist() == half.tolist()
    assert len(back.values) == 5_000 and back.codes.dtype == half.codes.dtype
    assert back.values.tolist() == sorted(set(half.tolist()), key=names.tolist().index)
    empty = pickle.loads(pickle.dumps(whole[np.array([], dtype=np.int64)]))
    assert empty.tolist() == [] and len(empty.values) == 0
