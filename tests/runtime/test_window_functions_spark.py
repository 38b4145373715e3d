"""Window ``reduce`` and ``aggregate`` on Spark: the operator is pickled to the workers, and a
failed and restored job commits exactly what a plain-Python fold of the source implies."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.graph import StreamExecutionEnvironment, WindowedStream
from sparkpoint.options import JobOptions
from sparkpoint.testing import FailureInjection, committed_lines
from sparkpoint.windows import SlidingEventTimeWindows, TumblingEventTimeWindows, WindowAssigner

from .pv_harness import drive

pytestmark = pytest.mark.spark
EVENTS = 3_000  # event times 1 ms apart: 3 s of event time
APPS = 3
SIZE_MS = 1_000
SLIDE_MS = 500  # sliding windows: 1 s long, every 0.5 s
SOURCE = GeneratorSource(events=EVENTS, apps=APPS, rate=0)


def sum_ids(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The reduce function: a record whose ``event_id`` is the sum, ``event_time`` the max."""
    return {
        "app_id": a["app_id"],
        "event_id": a["event_id"] + b["event_id"],
        "event_time": max(a["event_time"], b["event_time"]),
    }


def count_and_sum(acc: list[int], record: dict[str, Any]) -> list[int]:
    """The aggregate function; it updates ``acc`` in place, so windows must not share one."""
    acc[0] += 1
    acc[1] += record["event_id"]
    return acc


def _source_records() -> list[tuple[str, int, int]]:
    """(app_id, event_id, event_time) of every record, read straight from the source."""
    out: list[tuple[str, int, int]] = []
    for split in range(SOURCE.splits):
        batch = SOURCE.read(split, 0, SOURCE.total(split) or 0)
        out += zip(
            batch.column("app_id").tolist(),
            np.asarray(batch.column("event_id")).tolist(),
            np.asarray(batch.column("event_time")).tolist(),
            strict=True,
        )
    return out


def _window_starts(t: int, sliding: bool) -> list[int]:
    if not sliding:
        return [t - t % SIZE_MS]
    last = t - t % SLIDE_MS
    return list(range(last - SIZE_MS + SLIDE_MS, last + 1, SLIDE_MS))


def _expected(sliding: bool, function: str) -> Counter[str]:
    """The committed lines a plain-Python fold of the source implies."""
    groups: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for app, event_id, t in _source_records():
        for start in _window_starts(t, sliding):
            groups.setdefault((app, start), []).append((event_id, t))
    out: Counter[str] = Counter()
    for (app, start), records in groups.items():
        ids = [i for i, _ in records]
        if function == "reduce":
            value: Any = {
                "app_id": app,
                "event_id": sum(ids),
                "event_time": max(t for _, t in records),
            }
        else:
            value = [len(ids), sum(ids)]
        row = {"app_id": app, "window_start": start, "window_end": start + SIZE_MS, "v": value}
        out[json.dumps(row, sort_keys=True)] += 1
    return out


def _run(
    spark: Any, base: Path, sliding: bool, function: str, failure: FailureInjection | None
) -> Counter[str]:
    out = str(base / "out")
    env = StreamExecutionEnvironment(
        JobOptions(
            job_id=base.name,
            checkpoint=CheckpointConfig(interval_ms=1),
            checkpoint_dir=f"file://{base / 'chk'}",
            checkpoint_storage="filesystem",
            local_dir=str(base / "local"),
            parallelism=2,
            max_epoch_records=500,
            min_epoch_records=500,
            restart_strategy={
                "restart-strategy.type": "fixed-delay",
                "restart-strategy.fixed-delay.delay": "0 ms",
            },
        )
    )
    assigner: WindowAssigner = (
        SlidingEventTimeWindows(SIZE_MS, SLIDE_MS) if sliding else TumblingEventTimeWindows(SIZE_MS)
    )
    windowed: WindowedStream = (
        env.from_source(SOURCE, uid="events")
        .assign_timestamps_and_watermarks("event_time", 100, uid="timestamps")
        .key_by("app_id")
        .window(assigner)
    )
    if function == "reduce":
        stream = windowed.reduce(sum_ids, uid="window", output="v")
    else:
        stream = windowed.aggregate(count_and_sum, [0, 0], uid="window", output="v")
    stream.sink_to(FileSink(out), uid="sink")
    env.graph.name = f"window-{function}"
    result = drive(env.graph, env.options, spark, failure)
    if failure is None:
        assert result.restores == []
    else:  # open windows come back from a checkpoint's state, not from a replay from scratch
        assert len(result.restores) == 1 and result.restores[0] is not None
    return Counter(json.dumps(json.loads(line), sort_keys=True) for line in committed_lines(out))


@pytest.mark.parametrize("function", ["reduce", "aggregate"])
@pytest.mark.parametrize("sliding", [False, True], ids=["tumbling", "sliding"])
def test_window_functions_commit_the_oracle_with_and_without_a_failure(
    engine: Any, tmp_path: Path, sliding: bool, function: str
) -> None:
    expected = _expected(sliding, function)
    windows = EVENTS // (SLIDE_MS if sliding else SIZE_MS) + (1 if sliding else 0)
    assert len(expected) == APPS * windows  # every app has records in every window
    assert _run(engine, tmp_path / "clean", sliding, function, None) == expected
    failure = FailureInjection("keyed", subtask=1, records=100, at_epoch=2)
    assert _run(engine, tmp_path / "failed", sliding, function, failure) == expected
