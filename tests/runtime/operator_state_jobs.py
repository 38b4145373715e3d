"""Jobs whose output depends on operator state, for the operator-state tests.

``Batcher`` (a flat_map chained into the source) keeps a buffer of event ids in a split list
state and emits every ``size`` ids as one record: lose the buffer on a restore and the batches
come out different. ``Tally`` (a keyed process function) keeps how many records its subtask
processed in a split list state: the sum of every subtask's last count is the number of events,
also after a restore at another parallelism.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparkpoint import (
    CheckpointedFunction,
    FileSink,
    FunctionInitializationContext,
    FunctionSnapshotContext,
    GeneratorSource,
    KeyedContext,
    KeyedProcessFunction,
    ListStateDescriptor,
    StreamExecutionEnvironment,
)
from sparkpoint.options import JobOptions
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection

from .pv_harness import drive, job_options

EVENTS = 12_000
EPOCH_RECORDS = 1_000  # per split: six epochs
SIZE = 7


class Batcher(CheckpointedFunction):
    """Emits ``{"ids": [...]}`` for every ``size`` events of its split, in order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.buffer: list[int] = []

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        self.state = ctx.operator_state_store.get_list_state(ListStateDescriptor("buffer"))
        self.buffer = self.state.get()

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        self.state.update(self.buffer)

    def __call__(self, event: dict[str, Any]) -> Iterator[dict[str, Any]]:
        self.buffer.append(int(event["event_id"]))
        if len(self.buffer) == self.size:
            yield {"ids": self.buffer}
            self.buffer = []


def expected_batches(events: int = EVENTS, splits: int = 2) -> Counter[str]:
    """Event ``g`` is in split ``g % splits``: each split's ids in order, cut every SIZE."""
    out: Counter[str] = Counter()
    for split in range(splits):
        ids = list(range(split, events, splits))
        for i in range(0, len(ids) - len(ids) % SIZE, SIZE):
            out[f'{{"ids": {ids[i : i + SIZE]}}}'] += 1
    return out


class Tally(KeyedProcessFunction, CheckpointedFunction):
    """Per record: ``{"of": parallelism, "subtask": i, "seen": n}``, n the records its
    subtask processed so far (with the counts it was given on a restore)."""

    def initialize_state(self, ctx: FunctionInitializationContext) -> None:
        self.subtask = ctx.subtask
        self.parallelism = ctx.parallelism
        self.state = ctx.operator_state_store.get_list_state("seen")
        self.seen = sum(self.state.get())

    def snapshot_state(self, ctx: FunctionSnapshotContext) -> None:
        self.state.update([self.seen])

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterator[dict[str, int]]:
        self.seen += 1
        yield {"of": self.parallelism, "subtask": self.subtask, "seen": self.seen}


def last_counts(out: Counter[str], parallelism: int) -> dict[int, int]:
    """Each subtask's last ``seen``, in the lines written at ``parallelism``."""
    last: dict[int, int] = {}
    for line in out:
        record = json.loads(line)
        if record["of"] == parallelism:
            last[record["subtask"]] = max(last.get(record["subtask"], 0), record["seen"])
    return last


def _options(base: Path, name: str, parallelism: int, **more: Any) -> JobOptions:
    return job_options(
        f"opstate-{name}",
        base,
        name,
        epoch_records=EPOCH_RECORDS,
        parallelism=parallelism,
        retained=100,
        **more,
    )


def run_batcher(
    spark: Any, base: Path, name: str, failure: FailureInjection | None = None
) -> tuple[JobResult, str]:
    out = str(base / name / "out")
    options = _options(base, name, 2)
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(GeneratorSource(events=EVENTS, apps=5, rate=0), uid="events")
        .flat_map(Batcher(SIZE), uid="batcher")
        .sink_to(FileSink(out), uid="sink")
    )
    env.graph.name = "batcher"
    return drive(env.graph, options, spark, failure), out


def run_tally(
    spark: Any,
    base: Path,
    name: str,
    parallelism: int = 2,
    failure: FailureInjection | None = None,
    events: int = EVENTS,
    from_checkpoint: str | None = None,
    out: str | None = None,
) -> tuple[JobResult, str]:
    out = out or str(base / name / "out")
    options = _options(base, name, parallelism, from_checkpoint=from_checkpoint)
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(GeneratorSource(events=events, apps=9, rate=0), uid="events")
        .key_by("app_id")
        .process(Tally(), uid="tally")
        .sink_to(FileSink(out), uid="sink")
    )
    env.graph.name = "tally"
    return drive(env.graph, options, spark, failure), out
