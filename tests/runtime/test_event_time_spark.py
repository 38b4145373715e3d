"""Event-time windows and timers on Spark: a failed and restored job commits the same output."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import FileSource, GeneratorSource
from sparkpoint.functions import KeyedContext, KeyedProcessFunction
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.state.descriptors import ListStateDescriptor, ValueStateDescriptor
from sparkpoint.testing import FailureInjection, committed_files, line_counts
from sparkpoint.windows import TumblingEventTimeWindows

pytestmark = pytest.mark.spark
EVENTS = 12_000
APPS = 7
SESSION_MS = 5_000


def _options(base: Path, epoch_records: int) -> JobOptions:
    return JobOptions(
        job_id=base.name,
        checkpoint=CheckpointConfig(interval_ms=1),
        checkpoint_dir=f"file://{base / 'chk'}",
        checkpoint_storage="filesystem",
        local_dir=str(base / "local"),
        parallelism=2,
        max_epoch_records=epoch_records,
        min_epoch_records=epoch_records,
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
    )


def _run(
    spark: Any, env: StreamExecutionEnvironment, name: str, failure: FailureInjection | None
) -> None:
    env.graph.name = name
    result = JobDriver(env.graph, env.options, spark=spark, failure=failure).run()
    assert len(result.restores) == (0 if failure is None else 1)


# ----------------------------------------------------------------------------- windows


def _windowed_pv(spark: Any, base: Path, failure: FailureInjection | None) -> str:
    out = str(base / "out")
    env = StreamExecutionEnvironment(_options(base, 1_000))
    (
        env.from_source(GeneratorSource(events=EVENTS, apps=APPS, rate=0), uid="events")
        .assign_timestamps_and_watermarks("event_time", 100, uid="timestamps")
        .key_by("app_id")
        .window(TumblingEventTimeWindows(1_000))
        .count(uid="pv-per-second", output="pv")
        .sink_to(FileSink(out), uid="sink")
    )
    _run(spark, env, "windowed-pv", failure)
    return out


def _expected_windows() -> Counter[str]:
    src = GeneratorSource(events=EVENTS, apps=APPS, rate=0)
    counts: Counter[tuple[str, int]] = Counter()
    for split in range(2):
        batch = src.read(split, 0, src.total(split) or 0)
        times = np.asarray(batch.column("event_time")).tolist()
        for app, t in zip(batch.column("app_id").tolist(), times, strict=True):
            counts[(app, t - t % 1_000)] += 1
    return Counter(
        json.dumps({"app_id": app, "window_start": s, "window_end": s + 1_000, "pv": n})
        for (app, s), n in counts.items()
    )


def test_tumbling_window_counts_are_exactly_once(spark: Any, tmp_path: Path) -> None:
    expected = _expected_windows()
    assert len(expected) == APPS * EVENTS // 1_000  # one line per app and second
    clean_dir = _windowed_pv(spark, tmp_path / "clean", None)
    clean = line_counts(clean_dir)
    assert clean == expected
    # Windows fire as the watermark advances, so many checkpoints commit some, not only the last.
    assert len([f for f in committed_files(clean_dir) if os.path.getsize(f)]) > 4
    failed = _windowed_pv(
        spark, tmp_path / "failed", FailureInjection("keyed", subtask=1, records=200, at_epoch=3)
    )
    assert line_counts(failed) == clean


# ----------------------------------------------------------------------------- timers


class SessionSummary(KeyedProcessFunction):
    """Per user: a summary 5 s of event time after the first event of each session."""

    def open(self, ctx: KeyedContext) -> None:
        self.pending = ctx.get_state(ListStateDescriptor("pending"))
        self.deadline = ctx.get_state(ValueStateDescriptor("deadline"))

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        assert ctx.timestamp == value["t"]
        if self.deadline.value() is None:
            self.deadline.update(value["t"] + SESSION_MS)
            ctx.timer_service().register_event_time_timer(value["t"] + SESSION_MS)
        self.pending.add(value["t"])
        return ()

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Iterable[Any]:
        times = self.pending.get()
        inside = [t for t in times if t <= timestamp]
        rest = [t for t in times if t > timestamp]
        yield {"user": ctx.current_key, "first": min(inside), "events": len(inside)}
        self.pending.update(rest)
        self.deadline.clear()
        if rest:  # records after the deadline that came before the watermark passed it
            self.deadline.update(min(rest) + SESSION_MS)
            ctx.timer_service().register_event_time_timer(min(rest) + SESSION_MS)


def _user_events() -> dict[int, list[tuple[str, int]]]:
    """Per file: (user, time) in time order; user u<i> lives in file i % 3."""
    files: dict[int, list[tuple[str, int]]] = {0: [], 1: [], 2: []}
    for u in range(15):
        t = 1_000 * u
        for k in range(40):
            t += 300 + (k * 7 + u * 3) % 11 * 200  # gaps of 0.3 s to 2.3 s
            files[u % 3].append((f"u{u}", t))
    return {f: sorted(events, key=lambda e: (e[1], e[0])) for f, events in files.items()}


def _expected_sessions() -> Counter[str]:
    out: Counter[str] = Counter()
    for events in _user_events().values():
        by_user: dict[str, list[int]] = {}
        for user, t in events:
            by_user.setdefault(user, []).append(t)
        for user, times in by_user.items():
            i = 0
            while i < len(times):
                end = times[i] + SESSION_MS
                n = sum(1 for t in times[i:] if t <= end)
                out[json.dumps({"user": user, "first": times[i], "events": n})] += 1
                i += n
    return out


def _sessions(spark: Any, base: Path, failure: FailureInjection | None) -> str:
    base.mkdir(parents=True)
    paths = []
    for f, events in _user_events().items():
        path = base / f"events-{f}.jsonl"
        path.write_text("".join(json.dumps({"user": u, "t": t}) + "\n" for u, t in events))
        paths.append(str(path))
    out = str(base / "out")
    env = StreamExecutionEnvironment(_options(base, 60))
    (
        env.from_source(FileSource(tuple(paths)), uid="events")
        .assign_timestamps_and_watermarks("t", 200, uid="timestamps")
        .key_by("user")
        .process(SessionSummary(), uid="sessions")
        .sink_to(FileSink(out), uid="sink")
    )
    _run(spark, env, "sessions", failure)
    return out


def test_event_time_timers_of_a_process_function_are_exactly_once(
    spark: Any, tmp_path: Path
) -> None:
    expected = _expected_sessions()
    assert sum(expected.values()) > 15  # users have several sessions
    clean = line_counts(_sessions(spark, tmp_path / "clean", None))
    assert clean == expected
    failed = _sessions(
        spark, tmp_path / "failed", FailureInjection("keyed", subtask=1, records=20, at_epoch=2)
    )
    assert line_counts(failed) == clean
