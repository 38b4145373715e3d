"""Watermarks, event-time timers and windows without Spark: tasks, operators, snapshots."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import KeyedContext, KeyedProcessFunction, ProcessOperator
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode
from sparkpoint.records import Batch
from sparkpoint.runtime.plan import EpochPlan, SplitRange, StateInput
from sparkpoint.runtime.tasks import TaskInfo, run_keyed_task, run_source_task
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range
from sparkpoint.testing import ListSource, snapshot_blob
from sparkpoint.watermarks import MAX_WATERMARK, MIN_WATERMARK, Watermark, WatermarkValve
from sparkpoint.windows import SlidingEventTimeWindows, TumblingEventTimeWindows, WindowOperator


def _backend(subtask: int = 0, parallelism: int = 1) -> HashMapKeyedStateBackend:
    return HashMapKeyedStateBackend(128, key_group_range(subtask, parallelism, 128))


def _advance(op: Any, backend: HashMapKeyedStateBackend, watermark: int) -> list[Any]:
    backend.current_watermark = watermark
    return op.on_watermark(backend).rows


# ----------------------------------------------------------------------------- watermarks


def test_the_watermark_is_the_minimum_over_channels_and_never_goes_back() -> None:
    channels: dict[int, int] = {}
    valve = WatermarkValve(channels, 2)
    assert valve.current == MIN_WATERMARK
    assert valve.input(0, Watermark(10)) is None  # channel 1 has sent nothing yet
    assert valve.input(1, Watermark(5)) == 5
    assert valve.input(1, Watermark(3)) is None  # an older watermark is ignored
    assert valve.input(1, Watermark(20)) == 10
    assert valve.input(0, Watermark(MAX_WATERMARK)) == 20
    assert channels == {0: MAX_WATERMARK, 1: 20}
    assert WatermarkValve(channels, 2).current == 20  # rebuilt from the stored channels


def test_a_watermark_counts_as_no_records_and_no_bytes() -> None:
    assert len(Watermark(7)) == 0 and Watermark(7).nbytes == 0


# ----------------------------------------------------------------------------- timers


class Reminders(KeyedProcessFunction):
    """Registers a timer at the record's ``at``; on firing, maybe one more at ``again``."""

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        timers = ctx.timer_service()
        if value.get("delete"):
            timers.delete_event_time_timer(value["at"])
        else:
            timers.register_event_time_timer(value["at"])
        return ()

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterable[Any]:
        yield (timestamp, ctx.current_key, ctx.timer_service().current_watermark())
        if ctx.current_key == "b" and timestamp == 20:
            ctx.timer_service().register_event_time_timer(25)  # due at once


def test_timers_fire_in_timestamp_then_key_order_when_the_watermark_passes() -> None:
    backend = _backend()
    op = ProcessOperator("p", "k", Reminders())
    op.open(backend)
    records = [
        {"k": "c", "at": 20},
        {"k": "a", "at": 30},
        {"k": "b", "at": 20},
        {"k": "a", "at": 10},
        {"k": "a", "at": 10},  # one timer per key and timestamp
        {"k": "c", "at": 40},
        {"k": "c", "at": 40, "delete": True},
    ]
    op.process(Batch.of_rows(records), backend)
    assert _advance(op, backend, 9) == []
    assert _advance(op, backend, 27) == [
        (10, "a", 27),
        (20, "b", 27),
        (20, "c", 27),
        (25, "b", 27),
    ]
    assert _advance(op, backend, 27) == []
    assert _advance(op, backend, MAX_WATERMARK) == [(30, "a", MAX_WATERMARK)]
    assert backend.table("__timers__") == {}


def test_processing_time_timers_are_refused() -> None:
    backend = _backend()
    op = ProcessOperator("p", "k", Reminders())
    op.open(backend)
    backend.set_current_key("a")
    with pytest.raises(ConfigurationError, match="processing-time timers are not supported"):
        op._ctx.timer_service().register_processing_time_timer(5)


# ----------------------------------------------------------------------------- windows


def _count_op(assigner: Any = None) -> WindowOperator:
    from sparkpoint.windows import count_one

    return WindowOperator(
        "w", "k", assigner or TumblingEventTimeWindows(10), "t", count_one, "n", initial=0
    )


def _rows(pairs: list[tuple[str, int]]) -> Batch:
    return Batch.of_rows([{"k": k, "t": t} for k, t in pairs])


def test_a_window_fires_once_with_its_count_and_a_late_record_is_dropped() -> None:
    backend = _backend()
    op = _count_op()
    op.open(backend)
    op.process(_rows([("a", 1), ("a", 9), ("b", 5), ("a", 10), ("a", 12)]), backend)
    assert _advance(op, backend, 8) == []
    fired = _advance(op, backend, 9)  # window [0, 10) has max timestamp 9
    assert fired == [
        {"k": "a", "window_start": 0, "window_end": 10, "n": 2},
        {"k": "b", "window_start": 0, "window_end": 10, "n": 1},
    ]
    assert _advance(op, backend, 9) == []
    op.process(_rows([("a", 3), ("a", 15)]), backend)  # t=3: its window fired already
    assert op.late_records_dropped == 1
    assert _advance(op, backend, MAX_WATERMARK) == [
        {"k": "a", "window_start": 10, "window_end": 20, "n": 3}
    ]
    assert backend.table("windows") == {} and backend.table("__timers__") == {}


def test_sliding_windows_hold_a_record_in_each_window_that_covers_it() -> None:
    assert SlidingEventTimeWindows(10, 5).assign(12) == [(5, 15), (10, 20)]
    assert SlidingEventTimeWindows(10, 5).assign(-3) == [(-10, 0), (-5, 5)]
    backend = _backend()
    op = WindowOperator(
        "w",
        "k",
        SlidingEventTimeWindows(10, 5),
        "t",
        lambda acc, r: [*acc, r["t"]],
        "ts",
        initial=[],
    )
    op.open(backend)
    op.process(_rows([("a", 12), ("a", 7), ("a", 3)]), backend)
    assert _advance(op, backend, 9) == [
        {"k": "a", "window_start": -5, "window_end": 5, "ts": [3]},
        {"k": "a", "window_start": 0, "window_end": 10, "ts": [7, 3]},
    ]
    op.process(_rows([("a", 8)]), backend)  # [0,10) fired, [5,15) open: not late
    assert op.late_records_dropped == 0
    assert _advance(op, backend, MAX_WATERMARK) == [
        {"k": "a", "window_start": 5, "window_end": 15, "ts": [12, 7, 8]},
        {"k": "a", "window_start": 10, "window_end": 20, "ts": [12]},
    ]


def test_reduce_windows_start_from_the_first_record() -> None:
    backend = _backend()
    op = WindowOperator(
        "w",
        "k",
        TumblingEventTimeWindows(10),
        "t",
        lambda a, b: {**a, "t": max(a["t"], b["t"])},
        "v",
    )
    op.open(backend)
    op.process(_rows([("a", 4), ("a", 2)]), backend)
    assert _advance(op, backend, MAX_WATERMARK) == [
        {"k": "a", "window_start": 0, "window_end": 10, "v": {"k": "a", "t": 4}}
    ]


# ----------------------------------------------------------------------------- snapshots


@pytest.mark.parametrize("parallelism", [1, 3])
def test_a_restore_keeps_pending_timers_window_contents_and_watermarks(parallelism: int) -> None:
    records = [(f"u{i % 11}", (i * 7) % 50) for i in range(200)]
    expected_op, expected_backend = _count_op(), _backend()
    expected_op.open(expected_backend)
    expected_op.process(_rows(records), expected_backend)
    expected = _advance(expected_op, expected_backend, MAX_WATERMARK)
    assert sum(r["n"] for r in expected) == 200

    # Two old subtasks hold the state until watermark 19; it is restored to `parallelism`.
    old = []
    for subtask in (0, 1):
        backend, op = _backend(subtask, 2), _count_op()
        op.open(backend)
        mine = backend.key_group_range
        part = [
            r for r in records if mine.start <= _key_group(r[0]) <= mine.end
        ]  # what the exchange routes here
        op.process(_rows(part), backend)
        backend.channel_watermarks.update({0: 19, 1: 25})
        fired_before = _advance(op, backend, 19)
        assert all(r["window_end"] <= 20 for r in fired_before)
        old.append((snapshot_blob(backend), fired_before))
    fired = [r for _, before in old for r in before]
    for subtask in range(parallelism):
        restored = HashMapKeyedStateBackend.restore(
            [blob for blob, _ in old], 128, key_group_range(subtask, parallelism, 128)
        )
        assert restored.channel_watermarks == {0: 19, 1: 25}
        assert WatermarkValve(restored.channel_watermarks, 2).current == 19
        op = _count_op()
        op.open(restored)
        restored.current_watermark = 19
        fired += _advance(op, restored, MAX_WATERMARK)
    assert sorted(fired, key=json.dumps) == sorted(expected, key=json.dumps)


def _key_group(key: str) -> int:
    from sparkpoint.state.key_groups import stable_hash

    return stable_hash(key) % 128


def test_windows_need_timestamps_assigned_before_key_by(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment(JobOptions(job_id="wm", parallelism=1))
    keyed = env.from_source(ListSource(tuple(RECORDS)), uid="src").key_by("k")
    with pytest.raises(ConfigurationError, match="need assign_timestamps_and_watermarks"):
        keyed.window(TumblingEventTimeWindows(10))
    env = StreamExecutionEnvironment(JobOptions(job_id="wm", parallelism=1))
    stream = env.from_source(ListSource(tuple(RECORDS)), uid="src")
    stream.assign_timestamps_and_watermarks("t", 0, uid="ts")
    windowed = stream.key_by("k").window(SlidingEventTimeWindows(10, 5))
    windowed.aggregate(lambda acc, r: acc + r["t"], 0, uid="sum", output="total")
    op = env.graph.keyed.operator  # type: ignore[union-attr]
    assert isinstance(op, WindowOperator) and (op.output, op.initial) == ("total", 0)


# ----------------------------------------------------------------------------- tasks


def _window_graph(tmp_path: Path, records: list[dict[str, Any]]) -> Any:
    env = StreamExecutionEnvironment(JobOptions(job_id="wm", parallelism=1))
    (
        env.from_source(ListSource(tuple(records), splits=2), uid="src")
        .assign_timestamps_and_watermarks("t", 2, uid="wm")
        .key_by("k")
        .window(TumblingEventTimeWindows(10))
        .count(uid="win", output="n")
        .sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    )
    return env.graph


def _window_plan(tmp_path: Path, barrier_offset: int | None) -> EpochPlan:
    return EpochPlan(
        job_id="wm",
        job_name="t",
        attempt=1,
        epoch=0,
        mode=CheckpointingMode.EXACTLY_ONCE,
        ranges=(
            SplitRange(0, "list-0", 0, 4, barrier_offset),
            SplitRange(1, "list-1", 0, 4, barrier_offset),
        ),
        barrier=CheckpointBarrier(1, 0) if barrier_offset is not None else None,
        state_inputs={"win": (StateInput(),)},
        committed_up_to=0,
        storage=FileSystemCheckpointStorage(str(tmp_path / "chk")),
        local_dir=str(tmp_path / "local"),
        chunk_records=2,
    )


# Split 0 gets the even positions (times 10, 30, 20, 40), split 1 the odd ones (1, 2, 11, 25).
RECORDS = [
    {"k": k, "t": t}
    for k, t in [
        ("a", 10),
        ("b", 1),
        ("a", 30),
        ("b", 2),
        ("b", 20),
        ("a", 11),
        ("a", 40),
        ("b", 25),
    ]
]


def test_a_source_sends_watermarks_after_each_chunk_and_the_end_before_the_final_barrier(
    tmp_path: Path,
) -> None:
    graph = _window_graph(tmp_path, RECORDS)
    elements = list(run_source_task(graph, _window_plan(tmp_path, 4), 0, TaskInfo(0, 0)))
    payloads = [payload for _target, (_channel, payload) in elements]
    kinds = [type(x).__name__ for x in payloads]
    assert kinds == [
        "Batch",
        "Watermark",
        "Batch",
        "Watermark",
        "Watermark",
        "CheckpointBarrier",
        "TaskReport",
    ]
    marks = [x.timestamp for x in payloads if isinstance(x, Watermark)]
    assert marks == [30 - 2 - 1, 40 - 2 - 1, MAX_WATERMARK]


def _all_lines(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for f in sorted(directory.iterdir()) for line in f.read_text().splitlines()
    ]


def test_the_keyed_task_fires_windows_as_the_watermark_passes_and_snapshots_the_rest(
    tmp_path: Path,
) -> None:
    graph = _window_graph(tmp_path, RECORDS)
    plan = _window_plan(tmp_path, 2)
    per_channel = [list(run_source_task(graph, plan, s, TaskInfo(s, s))) for s in (0, 1)]
    # Channel 0 whole first: its watermark 27 after the barrier waits (buffered) with its data.
    elements = [e for ch in (0, 1) for e in per_channel[ch]]
    keyed, *_ = list(run_keyed_task(graph, plan, 0, iter(elements), TaskInfo(0, 9)))
    (ack,) = keyed.acks
    snap = HashMapKeyedStateBackend.restore(
        [plan.storage.read_state(h) for h in ack.handles], 128, key_group_range(0, 1, 128)
    )
    # At the barrier: channel 0 had sent 27, channel 1 (times 1, 2) had sent -1.
    assert snap.channel_watermarks == {0: 27, 1: -1}
    assert snap.table("windows") == {"a": {(10, 20): 1, (30, 40): 1}, "b": {(0, 10): 2}}
    # a@11 arrived after watermark 27 on channel 0, but channel 1 held the watermark at -1.
    assert keyed.late_records_dropped == 0
    lines = _all_lines(tmp_path / "out")
    assert sorted(lines, key=json.dumps) == sorted(
        [
            {"k": "a", "window_start": 10, "window_end": 20, "n": 2},
            {"k": "a", "window_start": 30, "window_end": 40, "n": 1},
            {"k": "a", "window_start": 40, "window_end": 50, "n": 1},
            {"k": "b", "window_start": 0, "window_end": 10, "n": 2},
            {"k": "b", "window_start": 20, "window_end": 30, "n": 2},
        ],
        key=json.dumps,
    )
