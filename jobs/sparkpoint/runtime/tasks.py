"""The code that runs inside Spark tasks: source subtasks and keyed subtasks (no pyspark here).

Elements that cross the key-group exchange are ``(target subtask, (channel, payload))`` with
``payload`` a :class:`~sparkpoint.records.Batch`, a
:class:`~sparkpoint.checkpointing.barriers.CheckpointBarrier` or a
:class:`~sparkpoint.watermarks.Watermark` (both broadcast to every target, behind every record
the source wrote before them) or a source :class:`TaskReport` forwarded to the driver through
the keyed task's result.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import Aborted, Aligned, BarrierHandler, CheckpointBarrier
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.connectors.sinks import WriterContext
from sparkpoint.errors import InjectedFailure
from sparkpoint.functions import select_keys
from sparkpoint.graph import JobGraph
from sparkpoint.records import Batch
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.subtask import (
    SubtaskCheckpointer,
    open_working_state,
    run_chain,
    save_working_state,
)
from sparkpoint.runtime.working_state import WorkingStateLostError
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range, key_groups_of
from sparkpoint.watermarks import (
    MAX_WATERMARK,
    BoundedOutOfOrdernessWatermarks,
    Watermark,
    WatermarkValve,
)


@dataclass(frozen=True)
class TaskInfo:
    """Which Spark task attempt runs this subtask (filled in by the Spark module)."""

    partition: int
    task_attempt: int


def _sink_tail(
    graph: JobGraph, plan: EpochPlan, uid: str, subtask: int, info: TaskInfo, state: Any
) -> Any:
    assert graph.sink is not None and graph.sink_uid is not None
    ctx = WriterContext(
        plan.job_id, graph.sink_uid, subtask, plan.attempt, plan.epoch, info.task_attempt
    )
    return graph.sink.writer(ctx, state.open_txn)


def _route(batch: Batch, graph: JobGraph, targets: int) -> Iterator[tuple[int, Batch]]:
    keyed = graph.keyed
    assert keyed is not None
    if targets == 1:
        yield 0, batch
        return
    keys = select_keys(keyed.operator.selector, batch)
    groups = key_groups_of(keys, keyed.max_parallelism)
    dest = (groups.astype(np.int64) * targets) // keyed.max_parallelism
    # dest < targets <= 32768: as uint16, numpy's stable sort is a radix sort (O(n)).
    order = np.argsort(dest.astype(np.uint16), kind="stable")
    counts = np.bincount(dest, minlength=targets)
    offset = 0
    for target, n in enumerate(counts.tolist()):
        if n:
            yield target, batch.take(order[offset : offset + n])
        offset += n


def run_source_task(
    graph: JobGraph, plan: EpochPlan, subtask: int, info: TaskInfo, clock: Clock | None = None
) -> Iterator[Any]:
    """Read this split's range, inject the barrier at its offset, route or sink the records.

    Yields exchange elements when the job has a keyed vertex, else this task's report.
    """
    clock = clock or SystemClock()
    started = clock.monotonic_ms()
    rng = plan.ranges[subtask]
    uid = graph.source.uid
    report = TaskReport(uid, subtask, plan.epoch, plan.attempt, info.task_attempt)
    keyed = graph.keyed
    targets = keyed.parallelism if keyed is not None else 0
    state = sink = checkpointer = None
    if keyed is None:  # the sink is chained into the source vertex
        state = open_working_state(plan, uid, subtask)
        state.pending = [t for t in state.pending if t[0] > plan.committed_up_to]
        sink = _sink_tail(graph, plan, uid, subtask, info, state)
    checkpointer = SubtaskCheckpointer(
        plan, uid, subtask, report, clock, sink=sink, pending=state.pending if state else None
    )
    failure = plan.injects("source", subtask)
    stop = rng.end
    if failure is not None and rng.start <= failure.offset < rng.end:
        stop = failure.offset

    assigner = graph.source.watermarks
    generator = None
    if assigner is not None and keyed is not None:
        generator = BoundedOutOfOrdernessWatermarks(
            assigner.timestamps, assigner.out_of_orderness_ms
        )
    total = graph.source.source.total(rng.split) if generator is not None else None
    split_ends = total is not None and rng.end >= total
    ended = False  # Watermark(MAX_WATERMARK) went out

    def emit(batch: Batch) -> Iterator[Any]:
        batch = run_chain(graph.source.chain, batch, generator)
        report.records_out += len(batch)
        if keyed is None:
            assert sink is not None
            sink.write(batch)
            return
        for target, part in _route(batch, graph, targets):
            yield target, (subtask, part)

    def broadcast(watermark: Watermark) -> Iterator[Any]:
        for target in range(targets):
            yield target, (subtask, watermark)

    def read(start: int, end: int) -> Iterator[Any]:
        last: Watermark | None = None
        for lo in range(start, end, plan.chunk_records):
            hi = min(end, lo + plan.chunk_records)
            batch = graph.source.source.read(rng.split, lo, hi)
            report.records_in += len(batch)
            yield from emit(batch)
            watermark = generator.current() if generator is not None else None
            if watermark is not None and watermark != last:
                last = watermark
                yield from broadcast(watermark)

    def end_of_split() -> Iterator[Any]:
        """At the end of a bounded split: the end of event time, once."""
        nonlocal ended
        if split_ends and not ended:
            ended = True
            yield from broadcast(Watermark(MAX_WATERMARK))

    barrier_at = rng.barrier_offset
    if plan.barrier is not None and barrier_at is not None and barrier_at <= stop:
        yield from read(rng.start, barrier_at)
        if barrier_at == rng.end:  # the final barrier: event time ends before it
            yield from end_of_split()
        report.events.append(
            p.BarrierInjected(
                checkpoint_id=plan.barrier.checkpoint_id,
                operator_id=uid,
                subtask=subtask,
                epoch=plan.epoch,
                split_id=rng.split_id,
                offset=barrier_at,
                timestamp=clock.now_ms(),
            )
        )
        checkpointer.on_barrier(plan.barrier, None, {rng.split_id: barrier_at})
        for target in range(targets):
            yield target, (subtask, plan.barrier)
        yield from read(barrier_at, stop)
    else:
        yield from read(rng.start, stop)
    if stop == rng.end:
        yield from end_of_split()
    else:
        raise InjectedFailure(
            f"injected failure in source {uid}[{subtask}] at offset {stop} of {rng.split_id} "
            f"(job attempt {plan.attempt}, epoch {plan.epoch})"
        )
    checkpointer.finish()
    report.split_end = {rng.split_id: rng.end}
    if keyed is None:
        assert sink is not None and state is not None
        state.open_txn = sink.close_epoch()
        save_working_state(plan, uid, subtask, report, state)
    report.duration_ms = clock.monotonic_ms() - started
    if keyed is None:
        yield report
    else:
        yield subtask % targets, (subtask, report)


def run_keyed_task(
    graph: JobGraph,
    plan: EpochPlan,
    subtask: int,
    elements: Iterable[tuple[int, tuple[int, Any]]],
    info: TaskInfo,
    clock: Clock | None = None,
) -> Iterator[TaskReport]:
    """Align barriers across the source channels, run the keyed operator, sink, snapshot.

    Steps: (1) open working state version v (or restore), (2) process the input through the
    barrier handler, snapshotting on every aligned barrier, (3) flush per-epoch output and the
    sink part, (4) write version v+1, (5) wait for uploads and acknowledge, (6) return this
    report and the forwarded source reports.
    """
    clock = clock or SystemClock()
    started = clock.monotonic_ms()
    keyed = graph.keyed
    assert keyed is not None
    uid = keyed.uid
    report = TaskReport(uid, subtask, plan.epoch, plan.attempt, info.task_attempt)
    forwarded: list[TaskReport] = []
    # Step 1
    kg_range = key_group_range(subtask, keyed.parallelism, keyed.max_parallelism)
    state = open_working_state(plan, uid, subtask)
    inp = plan.state_inputs[subtask]
    if inp.handles:
        reader = plan.restore_storage or plan.storage
        blobs = [
            reader.read_state(h)
            for h in inp.handles
            if h.key_group_start is None
            or h.key_group_end is None
            or (h.key_group_start <= kg_range.end and h.key_group_end >= kg_range.start)
        ]
        backend = HashMapKeyedStateBackend.restore(blobs, keyed.max_parallelism, kg_range)
    elif state.backend is not None:
        if state.backend.key_group_range != kg_range:
            raise WorkingStateLostError(
                f"working state of {uid}[{subtask}] holds key groups "
                f"{state.backend.key_group_range}, expected {kg_range}"
            )
        backend = state.backend
    else:
        backend = HashMapKeyedStateBackend(keyed.max_parallelism, kg_range)
    state.pending = [t for t in state.pending if t[0] > plan.committed_up_to]
    sink = _sink_tail(graph, plan, uid, subtask, info, state)
    checkpointer = SubtaskCheckpointer(
        plan, uid, subtask, report, clock, backend=backend, sink=sink, pending=state.pending
    )
    op = keyed.operator
    valve = WatermarkValve(backend.channel_watermarks, graph.source.parallelism)
    backend.current_watermark = valve.current
    op.open(backend)
    handler = BarrierHandler(graph.source.parallelism, plan.mode, clock)
    fail_records = plan.injects("keyed", subtask)
    fail_alignment = plan.injects("alignment", subtask)

    def emit(out: Batch) -> None:
        out = run_chain(keyed.chain, out)
        report.records_out += len(out)
        sink.write(out)

    def process(batch: Batch) -> None:
        report.records_in += len(batch)
        emit(op.process(batch, backend))
        if (
            fail_records is not None
            and plan.epoch >= fail_records.at_epoch
            and report.records_in >= fail_records.records
        ):
            raise InjectedFailure(
                f"injected failure in {uid}[{subtask}] after {report.records_in} records "
                f"(job attempt {plan.attempt}, epoch {plan.epoch})"
            )

    # Step 2
    for _target, (channel, payload) in elements:
        if isinstance(payload, TaskReport):
            forwarded.append(payload)
            continue
        if isinstance(payload, CheckpointBarrier):
            report.events.append(
                p.BarrierReceived(
                    checkpoint_id=payload.checkpoint_id,
                    operator_id=uid,
                    subtask=subtask,
                    channel=channel,
                    timestamp=clock.now_ms(),
                )
            )
        for out in handler.process(channel, payload):
            if isinstance(out, Aligned):
                stats = out.stats
                report.events.append(
                    p.AlignmentCompleted(
                        checkpoint_id=out.barrier.checkpoint_id,
                        operator_id=uid,
                        subtask=subtask,
                        duration_ms=stats.duration_ms,
                        buffered_bytes=stats.buffered_bytes,
                        buffered_records=stats.buffered_records,
                    )
                )
                emit(op.flush_updates(backend))
                checkpointer.on_barrier(out.barrier, stats)
            elif isinstance(out, Aborted):
                continue
            elif isinstance(out.element, Watermark):
                advanced = valve.input(out.channel, out.element)
                if advanced is not None:
                    backend.current_watermark = advanced
                    emit(op.on_watermark(backend))
            else:
                process(out.element)  # type: ignore[arg-type]
        if (
            fail_alignment is not None
            and handler.pending_checkpoint_id is not None
            and handler.pending_checkpoint_id == fail_alignment.checkpoint_id
        ):
            raise InjectedFailure(
                f"injected failure in {uid}[{subtask}] while aligning checkpoint "
                f"{fail_alignment.checkpoint_id}"
            )
    handler.end_of_input()
    # Step 3
    emit(op.flush_updates(backend))
    report.late_records_dropped = op.late_records_dropped
    state.open_txn = sink.close_epoch()
    state.backend = backend
    # Step 4
    save_working_state(plan, uid, subtask, report, state)
    # Step 5
    checkpointer.finish()
    report.duration_ms = clock.monotonic_ms() - started
    # Step 6
    yield report
    yield from forwarded
