"""Window operators survive pickling, as they do on their way to the Spark workers (issue 11).

No Spark here: the operator is pickled and unpickled in this process, which is enough to tell
a marker compared by identity (``object()``) from one that pickles as itself.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
from pyspark import cloudpickle

from sparkpoint.records import Batch
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range
from sparkpoint.testing import snapshot_blob
from sparkpoint.watermarks import MAX_WATERMARK
from sparkpoint.windows import (
    _NO_INITIAL,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowOperator,
)

ROUND_TRIPS: dict[str, Callable[[Any], Any]] = {
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj, protocol=5)),
    "cloudpickle": lambda obj: pickle.loads(cloudpickle.dumps(obj)),  # what PySpark ships
}
RECORDS = [("a", 4), ("b", 7), ("a", 2), ("a", 13), ("b", 9), ("a", 11)]


def latest(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"k": a["k"], "t": max(a["t"], b["t"]), "n": a.get("n", 1) + 1}


def collect_times(acc: list[int], record: dict[str, Any]) -> list[int]:
    acc.append(record["t"])  # in place: each window needs its own copy of `initial`
    return acc


def _backend() -> HashMapKeyedStateBackend:
    return HashMapKeyedStateBackend(128, key_group_range(0, 1, 128))


def _rows(pairs: list[tuple[str, int]]) -> Batch:
    return Batch.of_rows([{"k": k, "t": t} for k, t in pairs])


def _fire_all(op: WindowOperator, backend: HashMapKeyedStateBackend) -> list[Any]:
    backend.current_watermark = MAX_WATERMARK
    return sorted(op.on_watermark(backend).rows, key=lambda r: (r["k"], r["window_start"]))


def _reduce_op() -> WindowOperator:
    return WindowOperator("w", "k", TumblingEventTimeWindows(10), "t", latest, "v")


def _aggregate_op() -> WindowOperator:
    return WindowOperator(
        "w", "k", SlidingEventTimeWindows(10, 5), "t", collect_times, "ts", initial=[]
    )


REDUCED = [
    {"k": "a", "window_start": 0, "window_end": 10, "v": {"k": "a", "t": 4, "n": 2}},
    {"k": "a", "window_start": 10, "window_end": 20, "v": {"k": "a", "t": 13, "n": 2}},
    {"k": "b", "window_start": 0, "window_end": 10, "v": {"k": "b", "t": 9, "n": 2}},
]
AGGREGATED = [
    {"k": "a", "window_start": -5, "window_end": 5, "ts": [4, 2]},
    {"k": "a", "window_start": 0, "window_end": 10, "ts": [4, 2]},
    {"k": "a", "window_start": 5, "window_end": 15, "ts": [13, 11]},
    {"k": "a", "window_start": 10, "window_end": 20, "ts": [13, 11]},
    {"k": "b", "window_start": 0, "window_end": 10, "ts": [7, 9]},
    {"k": "b", "window_start": 5, "window_end": 15, "ts": [7, 9]},
]


@pytest.mark.parametrize("round_trip", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_the_no_initial_marker_unpickles_as_itself(round_trip: Callable[[Any], Any]) -> None:
    assert round_trip(_NO_INITIAL) is _NO_INITIAL


@pytest.mark.parametrize("round_trip", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
@pytest.mark.parametrize(
    ("make_op", "expected"),
    [(_reduce_op, REDUCED), (_aggregate_op, AGGREGATED)],
    ids=["reduce", "aggregate"],
)
def test_an_unpickled_window_operator_folds_as_the_original(
    round_trip: Callable[[Any], Any], make_op: Callable[[], WindowOperator], expected: list[Any]
) -> None:
    original = make_op()
    op = round_trip(original)
    assert op.initial == original.initial
    backend = _backend()
    op.open(backend)
    op.process(_rows(RECORDS), backend)
    assert _fire_all(op, backend) == expected


@pytest.mark.parametrize("round_trip", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
@pytest.mark.parametrize(
    ("make_op", "expected"),
    [(_reduce_op, REDUCED), (_aggregate_op, AGGREGATED)],
    ids=["reduce", "aggregate"],
)
def test_open_windows_restored_from_a_snapshot_keep_folding(
    round_trip: Callable[[Any], Any], make_op: Callable[[], WindowOperator], expected: list[Any]
) -> None:
    # Step 1: half the records reach a subtask, whose state is then snapshotted.
    before, backend = round_trip(make_op()), _backend()
    before.open(backend)
    before.process(_rows(RECORDS[:3]), backend)
    blob = snapshot_blob(backend)
    # Step 2: a fresh copy of the operator, as a restored job ships it, folds the rest.
    restored = HashMapKeyedStateBackend.restore([blob], 128, key_group_range(0, 1, 128))
    after = round_trip(make_op())
    after.open(restored)
    after.process(_rows(RECORDS[3:]), restored)
    assert _fire_all(after, restored) == expected
