"""Arrow interop of batches (``Batch.to_arrow``/``from_arrow``) and ``map_batch`` through
pyarrow.compute: every column kind round trips, nulls and unknown types are refused by
name, a batch made from Arrow goes wherever a source-made one goes, and a PV-style job whose
map_batch stage computes in Arrow commits, after a failure and a restore, exactly what the
same job commits without one."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.connectors.sinks import FileSink, format_json_lines
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import CountOperator, MapBatchOperator
from sparkpoint.graph import KeyedVertex, StreamExecutionEnvironment
from sparkpoint.protocol import JobStatus
from sparkpoint.records import Batch, DictColumn
from sparkpoint.runtime.tasks import _route
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range, key_groups_of
from sparkpoint.testing import FailureInjection, line_counts

from .pv_harness import IN_PROCESS, drive, hidden_files, job_options


def _same(a: Any, b: Any) -> bool:
    """Two columns hold the same records of the same dtype (any width of str; NaN equal to
    NaN)."""
    if isinstance(a, DictColumn) or isinstance(b, DictColumn):
        return (
            isinstance(a, DictColumn)
            and isinstance(b, DictColumn)
            and _same(a.decode(), b.decode())
        )
    if a.dtype != b.dtype and not a.dtype.kind == b.dtype.kind == "U":
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b)) and a.tolist() == b.tolist()


def _round_trip(batch: Batch) -> Batch:
    return Batch.from_arrow(batch.to_arrow())


# ----------------------------------------------------------------------------- each kind

KINDS: dict[str, Any] = {
    "int8": np.array([-128, 0, 127], dtype=np.int8),
    "int32": np.array([-(2**31), 7, 2**31 - 1], dtype=np.int32),
    "int64": np.array([-(2**63), 0, 2**63 - 1], dtype=np.int64),
    "uint8": np.array([0, 200, 255], dtype=np.uint8),
    "uint64": np.array([0, 1, 2**64 - 1], dtype=np.uint64),
    "float32": np.array([1.5, -0.0, np.inf], dtype=np.float32),
    "float64": np.array([np.nan, -1e300, 0.1], dtype=np.float64),
    "bool": np.array([True, False, True]),
    "str-ascii": np.array(["app-1", "", 'q"uote\\', "a\x00b"]),
    "str-unicode": np.array(["ünï", "日本語", "🙂 a\x00b"]),
    "dict-str": DictColumn(np.array([2, 0, 2]), np.array(["a", "bé", "c", "unused"])),
    "dict-int": DictColumn(np.array([1, 1, 0]), np.array([10, -3], dtype=np.int64)),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_column_kind_round_trips(kind: str) -> None:
    column = KINDS[kind]
    numbers = np.arange(len(column))
    back = _round_trip(Batch.of_columns(x=column, n=numbers)).columns
    assert list(back) == ["x", "n"]
    assert _same(back["x"], column), (back["x"], column)
    assert _same(back["n"], numbers)


@pytest.mark.parametrize("kind", list(KINDS))
def test_empty_columns_round_trip_with_their_kind(kind: str) -> None:
    column = KINDS[kind][:0]
    table = Batch.of_columns(x=column).to_arrow()
    assert table.num_rows == 0
    back = Batch.from_arrow(table).column("x")
    assert len(back) == 0
    assert isinstance(back, DictColumn) == isinstance(column, DictColumn)
    assert back.dtype.kind == column.dtype.kind


def test_batches_without_records_or_fields() -> None:
    for empty in (Batch(columns={}), Batch(rows=[])):
        table = empty.to_arrow()
        assert (table.num_rows, table.num_columns) == (0, 0)
        assert len(Batch.from_arrow(table)) == 0
    # Rows but no columns (pc selected none): as many empty records.
    assert Batch.from_arrow(pa.table({"a": [1, 2]}).select([])).rows == [{}, {}]


def test_a_source_batch_goes_to_arrow_encoded_and_without_copying_numbers() -> None:
    batch = GeneratorSource(events=10_000, apps=7, rate=0).read(1, 0, 1_000)
    table = batch.to_arrow()
    assert table.schema == pa.schema(
        [
            ("app_id", pa.dictionary(pa.int32(), pa.string())),
            ("event_id", pa.int64()),
            ("event_time", pa.int64()),
        ]
    )
    app_ids = batch.columns["app_id"]
    assert isinstance(app_ids, DictColumn)
    chunk = table.column("app_id").chunk(0)
    assert chunk.dictionary.to_pylist() == app_ids.values.tolist()  # not decoded
    event_ids, viewed = batch.columns["event_id"], Batch.from_arrow(table).column("event_id")
    assert isinstance(event_ids, np.ndarray) and isinstance(viewed, np.ndarray)
    assert table.column("event_id").chunk(0).buffers()[1].address == event_ids.ctypes.data
    assert viewed.ctypes.data == event_ids.ctypes.data and not viewed.flags.writeable  # a view
    back = Batch.from_arrow(table)
    assert back.rows == batch.rows


def test_arrow_strings_become_fixed_width_str_arrays() -> None:
    strings = Batch.from_arrow(pa.table({"s": ["app-1", "b", "", "日本"]})).column("s")
    assert isinstance(strings, np.ndarray) and strings.dtype == np.dtype("U5")
    assert strings.tolist() == ["app-1", "b", "", "日本"]
    large = pa.table({"s": pa.array(["x", "yz"], type=pa.large_string())})
    assert Batch.from_arrow(large).column("s").tolist() == ["x", "yz"]
    view = pa.table({"s": pa.array(["x", "yz"], type=pa.string_view())})
    assert Batch.from_arrow(view).column("s").tolist() == ["x", "yz"]
    sliced = pa.array(["skip", "a", "bc", "skip"]).slice(1, 2)  # an offset into the buffers
    assert Batch.from_arrow(pa.table({"s": sliced})).column("s").tolist() == ["a", "bc"]


def test_strings_a_str_array_cannot_hold_stay_python_str() -> None:
    """A U array drops trailing NULs ("a\\x00" would read "a"): such a column stays an
    object array of str, as does one that one long string would make very wide."""
    for texts in (["a\x00", "b"], ["ü\x00", "b"]):
        column = Batch.from_arrow(pa.table({"s": texts})).column("s")
        assert column.dtype == object and column.tolist() == texts
    wide = ["x"] * 1_000 + ["y" * 10_000]
    column = Batch.from_arrow(pa.table({"s": wide})).column("s")
    assert column.dtype == object and column.tolist() == wide
    binary = Batch.from_arrow(pa.table({"b": [b"a\x00", b""]})).column("b")
    assert binary.dtype == object and binary.tolist() == [b"a\x00", b""]
    # A numpy bytes array goes to Arrow as binary, interior NULs kept; it comes back bytes.
    table = Batch.of_columns(b=np.array([b"a\x00b", b"c"])).to_arrow()
    assert table.column("b").type == pa.binary()
    assert Batch.from_arrow(table).column("b").tolist() == [b"a\x00b", b"c"]


def test_a_table_of_several_chunks_becomes_one_column() -> None:
    ints = pa.chunked_array([[1, 2], [], [3, 4, 5]])
    strings = pa.chunked_array([["a", "é"], ["bb", "c\x00", ""]])  # the second stays objects
    dicts = pa.chunked_array(
        [
            pa.array(["x", "y", "x"]).dictionary_encode(),
            pa.array(["y", "z"]).dictionary_encode(),
        ]
    )
    cols = Batch.from_arrow(pa.table({"i": ints, "s": strings, "d": dicts})).columns
    assert cols["i"].tolist() == [1, 2, 3, 4, 5] and cols["i"].dtype == np.int64
    assert cols["s"].tolist() == ["a", "é", "bb", "c\x00", ""]
    assert isinstance(cols["d"], DictColumn)
    assert cols["d"].tolist() == ["x", "y", "x", "y", "z"]


def test_a_record_batch_converts_as_a_table_does() -> None:
    record_batch = pa.record_batch({"k": ["a", "b"], "n": [1, 2]})
    assert Batch.from_arrow(record_batch).rows == [{"k": "a", "n": 1}, {"k": "b", "n": 2}]


def test_a_row_batch_converts_through_its_fields() -> None:
    rows = [{"user": "ü", "n": 1, "w": 0.5}, {"user": "b", "n": 2, "w": 1.5}]
    table = Batch.of_rows(rows).to_arrow()
    assert table.schema == pa.schema(
        [("user", pa.string()), ("n", pa.int64()), ("w", pa.float64())]
    )
    assert Batch.from_arrow(table).rows == rows
    with pytest.raises(ConfigurationError, match="only batches of dict records"):
        Batch.of_rows([1, 2]).to_arrow()
    with pytest.raises(ConfigurationError, match="different fields"):
        Batch.of_rows([{"a": 1}, {"b": 2}]).to_arrow()


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "column",
    [
        pa.array([1, None, 3]),
        pa.array(["a", None]),
        pa.array([True, None]),
        pa.DictionaryArray.from_arrays(pa.array([0, None], pa.int32()), pa.array(["a"])),
        pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(["a", None])),
    ],
    ids=["int", "str", "bool", "dictionary-index", "dictionary-value"],
)
def test_nulls_are_refused_naming_the_column(column: pa.Array) -> None:
    table = pa.table({"fine": pa.array(range(len(column))), "holes": column})
    with pytest.raises(ConfigurationError, match=r"column 'holes' has 1 null\(s\)"):
        Batch.from_arrow(table)


def test_a_dictionary_null_no_record_uses_is_dropped() -> None:
    column = pa.DictionaryArray.from_arrays(
        pa.array([2, 0, 2], pa.int32()), pa.array(["a", None, "c"])
    )
    back = Batch.from_arrow(pa.table({"k": column})).column("k")
    assert isinstance(back, DictColumn)
    assert back.values.tolist() == ["a", "c"] and back.tolist() == ["c", "a", "c"]


def test_nones_of_a_row_batch_become_nulls_which_come_back_refused() -> None:
    table = Batch.of_rows([{"n": 1}, {"n": None}]).to_arrow()
    assert table.column("n").null_count == 1
    with pytest.raises(ConfigurationError, match="column 'n' has 1 null"):
        Batch.from_arrow(table)


def test_types_a_batch_has_no_column_for_are_refused_naming_them() -> None:
    table = pa.table({"t": pa.array([1, 2], pa.timestamp("ms"))})
    with pytest.raises(ConfigurationError, match=r"column 't' is of Arrow type timestamp\[ms\]"):
        Batch.from_arrow(table)
    twice = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    with pytest.raises(ConfigurationError, match=r"more than one column named \['a'\]"):
        Batch.from_arrow(twice)
    with pytest.raises(ConfigurationError, match=r"pyarrow\.Table or pyarrow\.RecordBatch"):
        Batch.from_arrow({"a": [1]})


# ----------------------------------------------------------------------------- the runtime


def _arrow_made(batch: Batch) -> Batch:
    """``batch`` rebuilt from Arrow with its dictionary column decoded (plain strings)."""
    table = batch.to_arrow()
    return Batch.from_arrow(table.set_column(0, "app_id", table.column(0).cast(pa.string())))


def test_a_batch_from_arrow_goes_where_a_source_batch_goes() -> None:
    """The exchange's routing, the keyed count, the JSON sink and pickling (what ships a
    batch between tasks) treat a batch from Arrow, dictionary-encoded or plain, as the
    source-made batch it came from."""
    batch = GeneratorSource(events=20_000, apps=37, rate=0).read(0, 0, 5_000)
    made = [Batch.from_arrow(batch.to_arrow()), _arrow_made(batch)]
    assert isinstance(made[0].column("app_id"), DictColumn)
    assert made[1].column("app_id").dtype.kind == "U"
    keyed = KeyedVertex(CountOperator("pv", "app_id", "pv", "every"), 3, 128, inputs=("s",))

    def consumed(b: Batch) -> tuple[Any, ...]:
        op = CountOperator("pv", "app_id", "pv", "every")
        backend = HashMapKeyedStateBackend(128, key_group_range(0, 1, 128))
        op.open(backend)
        return (
            [(t, part.rows) for t, part in _route(b, keyed, 3)],
            key_groups_of(b.column("app_id"), 128).tolist(),
            op.process(b, backend).rows,
            format_json_lines(b),
            pickle.loads(pickle.dumps(b)).rows,
        )

    expected = consumed(batch)
    for b in made:
        assert consumed(b) == expected


def test_map_batch_takes_an_arrow_table_or_record_batch() -> None:
    batch = GeneratorSource(events=100, apps=3, rate=0).read(0, 0, 50)

    def drop_app_0(b: Batch) -> pa.Table:
        table = b.to_arrow()
        return table.filter(pc.not_equal(table["app_id"], "app-0"))

    out = MapBatchOperator("drop", drop_app_0).apply(batch)
    assert out.rows == [r for r in batch.rows if r["app_id"] != "app-0"]
    as_record_batch = MapBatchOperator("rb", lambda b: drop_app_0(b).to_batches()[0])
    assert as_record_batch.apply(batch).rows == out.rows
    with pytest.raises(ConfigurationError, match=r"map_batch 'bad' returned a builtins\.dict"):
        MapBatchOperator("bad", lambda b: {"a": 1}).apply(batch)
    holes = MapBatchOperator("holes", lambda b: pa.table({"x": [None] * len(b)}))
    with pytest.raises(ConfigurationError, match=r"map_batch 'holes': column 'x' has 50 null"):
        holes.apply(batch)


# ----------------------------------------------------------------------------- properties

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_ASCII = st.text(st.characters(max_codepoint=0x7F), max_size=12)  # numpy's path, not Python's


@st.composite
def _columns(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(0, 30))

    def values(elements: Any) -> list[Any]:
        return draw(st.lists(elements, min_size=n, max_size=n))

    text = draw(st.sampled_from([_ASCII, _TEXT]))
    words = draw(st.lists(text, min_size=1, max_size=6))
    return {
        "i": np.array(values(st.integers(-(2**63), 2**63 - 1)), dtype=np.int64),
        "f": np.array(values(st.floats(allow_nan=True, width=64)), dtype=np.float64),
        "b": np.array(values(st.booleans()), dtype=bool),
        # A U array holds no trailing NUL, so what the batch holds is what numpy kept.
        "s": np.array(values(text), dtype=str) if n else np.empty(0, dtype="U1"),
        "d": DictColumn(values(st.integers(0, len(words) - 1)), np.array(words, dtype=str)),
    }


@settings(max_examples=150, deadline=None)
@given(_columns())
def test_any_batch_round_trips_through_arrow(columns: dict[str, Any]) -> None:
    back = _round_trip(Batch(columns=dict(columns))).columns
    assert list(back) == list(columns)
    for name, column in columns.items():
        assert _same(back[name], column), name


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.lists(_ASCII, max_size=30), st.lists(_TEXT, max_size=30)), st.booleans())
def test_any_arrow_strings_come_back_to_arrow_unchanged(texts: list[str], encode: bool) -> None:
    """Arrow -> Batch -> Arrow keeps every string, trailing NULs included."""
    column = pa.array(texts, pa.string())
    if encode:
        column = column.dictionary_encode()
    back = Batch.from_arrow(pa.table({"s": column})).to_arrow().column("s")
    assert back.to_pylist() == texts


# ----------------------------------------------------------------------------- a job

EVENTS = 12_000
APPS = 7
START_MS = GeneratorSource.start_time_ms


def tagged(batch: Batch) -> pa.Table:
    """Drop app-0; add ``bucket`` (the app and event id mod 4) and ``score`` (from event id
    and time); keep app_id, event_id, bucket, score. pyarrow.compute only."""
    table = batch.to_arrow()
    table = table.filter(pc.not_equal(table["app_id"], "app-0"))
    slot = pc.cast(pc.bit_wise_and(table["event_id"], 3), pa.string())
    bucket = pc.binary_join_element_wise(table["app_id"].cast(pa.string()), slot, ":")
    score = pc.add(pc.multiply(table["event_id"], 2), pc.subtract(table["event_time"], START_MS))
    return pa.table(
        {"app_id": table["app_id"], "event_id": table["event_id"], "bucket": bucket, "score": score}
    )


def oracle() -> tuple[Counter[str], Counter[str]]:
    """What the job must commit, record by record in plain Python: the tagged records, and
    each bucket's counts 1..n."""
    src = GeneratorSource(events=EVENTS, apps=APPS, rate=0)
    records: Counter[str] = Counter()
    per_bucket: Counter[str] = Counter()
    for split in range(src.splits):
        for row in src.read(split, 0, src.total(split) or 0).rows:
            if row["app_id"] == "app-0":
                continue
            bucket = f"{row['app_id']}:{row['event_id'] & 3}"
            score = row["event_id"] * 2 + row["event_time"] - START_MS
            record = {"app_id": row["app_id"], "event_id": row["event_id"], "bucket": bucket}
            records[json.dumps(record | {"score": score})] += 1
            per_bucket[bucket] += 1
    counts = Counter(
        json.dumps({"bucket": b, "n": k}) for b, n in per_bucket.items() for k in range(1, n + 1)
    )
    return records, counts


def run_tagged(base: Path, name: str, failure: FailureInjection | None) -> tuple[Any, str, str]:
    options = job_options(f"arrow-{name}", base, name, epoch_records=1_000)
    env = StreamExecutionEnvironment(options)
    tagged_out, counts_out = str(base / name / "tagged"), str(base / name / "counts")
    stream = env.from_source(
        GeneratorSource(events=EVENTS, apps=APPS, rate=0), uid="events"
    ).map_batch(tagged, uid="tag")
    stream.sink_to(FileSink(tagged_out), uid="tagged-sink")
    stream.key_by("bucket").count(uid="per-bucket", output="n").sink_to(
        FileSink(counts_out), uid="counts-sink"
    )
    env.graph.name = "arrow-tagged"
    return drive(env.graph, options, IN_PROCESS, failure), tagged_out, counts_out


@pytest.fixture(scope="module")
def failure_free(tmp_path_factory: pytest.TempPathFactory) -> tuple[Counter[str], Counter[str]]:
    result, tagged_out, counts_out = run_tagged(tmp_path_factory.mktemp("arrow"), "clean", None)
    assert result.status is JobStatus.FINISHED and result.restores == []
    return line_counts(tagged_out), line_counts(counts_out)


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(FailureInjection("keyed", subtask=1, records=300, at_epoch=3), id="keyed"),
        pytest.param(FailureInjection("source", subtask=0, offset=3_500), id="source"),
    ],
)
def test_a_map_batch_job_in_arrow_commits_after_a_restore_what_it_commits_without(
    tmp_path: Path,
    failure: FailureInjection,
    failure_free: tuple[Counter[str], Counter[str]],
) -> None:
    assert failure_free == oracle()
    result, tagged_out, counts_out = run_tagged(tmp_path, "failed", failure)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2 and len(result.restores) == 1
    assert (line_counts(tagged_out), line_counts(counts_out)) == failure_free
    assert hidden_files(tagged_out) == [] and hidden_files(counts_out) == []
