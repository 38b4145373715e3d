"""The code that runs inside Spark tasks: source subtasks and keyed subtasks (no pyspark here).

Elements that cross a key-group exchange are ``(target subtask, (channel, payload))`` with
``channel`` the sending subtask and ``payload`` a :class:`~sparkpoint.records.Batch` (routed by
key group, or to every target from a broadcast input), a
:class:`~sparkpoint.checkpointing.barriers.CheckpointBarrier` or a
:class:`~sparkpoint.watermarks.Watermark` (both broadcast to every target, behind every record
the sender wrote before them) or a :class:`TaskReport` of an upstream subtask, forwarded to the
driver through the results of the last stage. A keyed vertex that feeds another (chained keyed
stages) aligns barriers on its own inputs, snapshots, and only then forwards the barrier to
every subtask of the next stage, which aligns them again across its inputs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import Aborted, Aligned, BarrierHandler, CheckpointBarrier
from sparkpoint.checkpointing.spill import SpillFile
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.connectors.sinks import SinkWriter, WriterContext
from sparkpoint.errors import InjectedFailure
from sparkpoint.functions import records_of, select_keys
from sparkpoint.graph import JobGraph, KeyedVertex
from sparkpoint.records import Batch
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.subtask import (
    SubtaskCheckpointer,
    open_keyed_state,
    open_operator_state,
    open_working_state,
    run_chain,
    save_working_state,
)
from sparkpoint.state.key_groups import key_group_range, key_groups_of
from sparkpoint.watermarks import (
    MAX_WATERMARK,
    BoundedOutOfOrdernessWatermarks,
    Watermark,
    WatermarkValve,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskInfo:
    """Which Spark task attempt runs this subtask (filled in by the Spark module)."""

    partition: int
    task_attempt: int


def _sink_writers(
    graph: JobGraph, plan: EpochPlan, uid: str, subtask: int, info: TaskInfo, state: Any
) -> dict[str, SinkWriter]:
    """The writers of the sinks chained into vertex ``uid``, by sink uid, each continuing its
    own open transaction."""
    writers = {}
    for node in graph.sinks_of(uid):
        ctx = WriterContext(
            plan.job_id, node.uid, subtask, plan.attempt_of(uid), plan.epoch, info.task_attempt
        )
        writers[node.uid] = node.sink.writer(ctx, state.open_txns.get(node.uid))
    return writers


def _first_of_input(received: set[tuple[int, int]], checkpoint_id: int, input_index: int) -> bool:
    """Whether this is the first barrier of ``checkpoint_id`` from input ``input_index``: a
    subtask reports one ``barrier_received`` per checkpoint and input (when its alignment
    began there), not one per channel, so a checkpoint's events grow with the parallelism,
    not with its square; the alignment's duration covers the other channels."""
    if (checkpoint_id, input_index) in received:
        return False
    received.add((checkpoint_id, input_index))
    return True


def _close_epoch(state: Any, sinks: dict[str, SinkWriter]) -> None:
    """Keep every sink's open transaction for the next epoch."""
    state.open_txns = {uid: writer.close_epoch() for uid, writer in sinks.items()}


def _route(
    batch: Batch, keyed: KeyedVertex, targets: int, input_index: int = 0
) -> Iterator[tuple[int, Batch]]:
    """Split ``batch`` (of input ``input_index`` of ``keyed``) by the key group of its key:
    (target subtask, its records)."""
    if targets == 1:
        yield 0, batch
        return
    keys = select_keys(keyed.operator.selector_for(input_index), batch)
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


class _Outputs:
    """Where a subtask's records go after its chain: its sinks, the next stage's exchange."""

    def __init__(
        self,
        graph: JobGraph,
        uid: str,
        subtask: int,
        report: TaskReport,
        sinks: dict[str, SinkWriter],
    ) -> None:
        self.down = graph.downstream(uid)
        self.targets = self.down.parallelism if self.down is not None else 0
        self.subtask = subtask
        # This subtask's channel at the next stage (after the channels of earlier inputs).
        self.channel = subtask + (graph.channel_offset(self.down, uid) if self.down else 0)
        self.input_index = self.down.inputs.index(uid) if self.down else 0
        # A broadcast input: every record to every subtask, not by key group.
        self.broadcasting = self.down is not None and uid in self.down.broadcast_inputs
        # The fields the next stage's operator reads: only these cross the exchange.
        self.reads = self.down.operator.fields_read(self.input_index) if self.down else None
        self.report = report
        tags = {n.uid: n.tag for n in graph.sinks_of(uid)}
        self.sinks = [w for sink_uid, w in sinks.items() if tags[sink_uid] is None]
        self.side_sinks = {
            tag: [w for sink_uid, w in sinks.items() if tags[sink_uid] == tag]
            for tag in set(tags.values()) - {None}
        }

    def records(self, batch: Batch) -> Iterator[Any]:
        self.report.records_out += len(batch)
        for sink in self.sinks:
            sink.write(batch)
        if self.down is not None and len(batch):
            if self.broadcasting:
                yield from self.broadcast(batch)
                return
            pruned = batch if self.reads is None else batch.select(self.reads)
            partial = self.down.operator.partial(pruned)
            shipped = pruned if partial is None else partial
            for target, part in _route(shipped, self.down, self.targets, self.input_index):
                yield target, (self.channel, part)

    def side(self, outputs: dict[str, Batch]) -> None:
        """Side outputs go to the sinks of their tag (a tag without a sink: dropped)."""
        for tag, batch in outputs.items():
            for sink in self.side_sinks.get(tag, ()):
                sink.write(batch)

    def broadcast(self, payload: Any) -> Iterator[Any]:
        """A barrier, a watermark or a broadcast input's records to every subtask of the next
        stage."""
        for target in range(self.targets):
            yield target, (self.channel, payload)

    def reports(self, reports: Iterable[TaskReport]) -> Iterator[Any]:
        """Reports go to the driver: through the next stage, or as this task's result."""
        for r in reports:
            yield (self.subtask % self.targets, (self.channel, r)) if self.targets else r


def run_source_task(
    graph: JobGraph,
    plan: EpochPlan,
    subtask: int,
    info: TaskInfo,
    clock: Clock | None = None,
    *,
    vertex: str | None = None,
) -> Iterator[Any]:
    """Read this split's range, inject the barrier at its offset, route or sink the records.

    ``vertex``: the source vertex (default: the first). Yields exchange elements when the
    vertex feeds a keyed vertex, else this task's report.
    """
    clock = clock or SystemClock()
    started = clock.monotonic_ms()
    src = graph.vertex(vertex) if vertex is not None else graph.source
    assert not isinstance(src, KeyedVertex)
    uid = src.uid
    rng = plan.ranges[graph.split_offset(uid) + subtask]
    split = rng.split - graph.split_offset(uid)  # the split's index in its own source
    report = TaskReport(uid, subtask, plan.epoch, plan.attempt_of(uid), info.task_attempt)
    state = None
    sinks: dict[str, SinkWriter] = {}
    operators = None
    if uid in graph.stateful():  # sinks, or functions with operator state, in the source vertex
        state = open_working_state(plan, uid, subtask)
        state.pending = [t for t in state.pending if t[0] > plan.committed_up_to]
        sinks = _sink_writers(graph, plan, uid, subtask, info, state)
        operators = open_operator_state(plan, src, subtask, state)
    outputs = _Outputs(graph, uid, subtask, report, sinks)
    checkpointer = SubtaskCheckpointer(
        plan,
        uid,
        subtask,
        report,
        clock,
        sinks=sinks,
        pending=state.pending if state else None,
        operator_state=operators,
    )
    failure = plan.injects("source", subtask, uid, uid == graph.source.uid)
    stop = rng.end
    if failure is not None and rng.start <= failure.offset < rng.end:
        stop = failure.offset

    assigner = src.watermarks
    generator = None
    if assigner is not None and outputs.down is not None:
        generator = BoundedOutOfOrdernessWatermarks(
            assigner.timestamps, assigner.out_of_orderness_ms
        )
    total = src.source.total(split) if generator is not None else None
    split_ends = total is not None and rng.end >= total
    ended = False  # Watermark(MAX_WATERMARK) went out

    def read(start: int, end: int) -> Iterator[Any]:
        last: Watermark | None = None
        for lo in range(start, end, plan.chunk_records):
            hi = min(end, lo + plan.chunk_records)
            batch = src.source.read(split, lo, hi)
            report.records_in += len(batch)
            yield from outputs.records(run_chain(src.chain, batch, generator))
            watermark = generator.current() if generator is not None else None
            if watermark is not None and watermark != last:
                last = watermark
                yield from outputs.broadcast(watermark)

    def end_of_split() -> Iterator[Any]:
        """At the end of a bounded split: the end of event time, once."""
        nonlocal ended
        if split_ends and not ended:
            ended = True
            yield from outputs.broadcast(Watermark(MAX_WATERMARK))

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
        yield from outputs.broadcast(plan.barrier)
        yield from read(barrier_at, stop)
    else:
        yield from read(rng.start, stop)
    if stop == rng.end:
        yield from end_of_split()
    else:
        raise InjectedFailure(
            f"injected failure in source {uid}[{subtask}] at offset {stop} of {rng.split_id} "
            f"(job attempt {plan.attempt}, epoch {plan.epoch})",
            clock.now_ms(),
        )
    checkpointer.finish()
    report.split_end = {rng.split_id: rng.end}
    if state is not None:
        if operators is not None:
            state.operator_state = operators.carry()
        _close_epoch(state, sinks)
        save_working_state(plan, uid, subtask, report, state)
    report.duration_ms = clock.monotonic_ms() - started
    yield from outputs.reports([report])


def run_keyed_task(
    graph: JobGraph,
    plan: EpochPlan,
    subtask: int,
    elements: Iterable[tuple[int, tuple[int, Any]]],
    info: TaskInfo,
    clock: Clock | None = None,
    *,
    vertex: str | None = None,
) -> Iterator[Any]:
    """Align barriers across the input channels, run the keyed operator, sink or route on,
    snapshot. ``vertex``: the keyed vertex (default: the first).

    Steps: (1) open working state version v (or restore), (2) process the input through the
    barrier handler, snapshotting on every aligned barrier and then forwarding it to the next
    stage, (3) flush per-epoch output and the sink part, (4) write version v+1, (5) wait for
    uploads and acknowledge, (6) hand this report and the upstream ones on (to the driver, or
    through the next stage).
    """
    clock = clock or SystemClock()
    started = clock.monotonic_ms()
    keyed = graph.vertex(vertex) if vertex is not None else graph.keyed
    assert isinstance(keyed, KeyedVertex)
    uid = keyed.uid
    channels = graph.channels(keyed)
    report = TaskReport(uid, subtask, plan.epoch, plan.attempt_of(uid), info.task_attempt)
    forwarded: list[TaskReport] = []
    # Step 1
    kg_range = key_group_range(subtask, keyed.parallelism, keyed.max_parallelism)
    state = open_working_state(plan, uid, subtask)
    backend = open_keyed_state(plan, uid, subtask, keyed.max_parallelism, kg_range)
    state.pending = [t for t in state.pending if t[0] > plan.committed_up_to]
    sinks = _sink_writers(graph, plan, uid, subtask, info, state)
    operators = open_operator_state(plan, keyed, subtask, state)  # before the function's open
    if plan.state_input(uid, subtask).restored_from is not None:
        report.restore_ms = clock.monotonic_ms() - started
    outputs = _Outputs(graph, uid, subtask, report, sinks)
    checkpointer = SubtaskCheckpointer(
        plan,
        uid,
        subtask,
        report,
        clock,
        backend=backend,
        sinks=sinks,
        pending=state.pending,
        operator_state=operators,
    )
    op = keyed.operator
    valve = WatermarkValve(backend.channel_watermarks, channels)
    backend.current_watermark = valve.current
    op.open(backend)
    spill = SpillFile(os.path.join(plan.local_dir, plan.job_id, "alignment"))
    handler = BarrierHandler(
        channels,
        plan.mode,
        clock,
        count_of=records_of,
        buffer_limit=plan.alignment_buffer_bytes,
        spill=spill,
    )
    first = uid == graph.keyed_vertices[0].uid
    fail_records = plan.injects("keyed", subtask, uid, first)
    fail_alignment = plan.injects("alignment", subtask, uid, first)

    def emit(out: Batch) -> Iterator[Any]:
        outputs.side(op.take_side_outputs())
        yield from outputs.records(run_chain(keyed.chain, out))

    starts = [graph.channel_offset(keyed, i) for i in keyed.inputs]

    def input_of(channel: int) -> int:
        return sum(1 for s in starts if s <= channel) - 1

    def process(channel: int, batch: Batch) -> Iterator[Any]:
        report.records_in += records_of(batch)
        out = op.process_input(input_of(channel), batch, backend)
        if report.first_record_wall_ms is None and report.records_in:
            report.first_record_wall_ms = clock.now_ms()
        yield from emit(out)
        if (
            fail_records is not None
            and plan.epoch >= fail_records.at_epoch
            and report.records_in >= fail_records.records
        ):
            raise InjectedFailure(
                f"injected failure in {uid}[{subtask}] after {report.records_in} records "
                f"(job attempt {plan.attempt}, epoch {plan.epoch})",
                clock.now_ms(),
            )

    # Step 2
    received: set[tuple[int, int]] = set()  # (checkpoint, input) whose first barrier came
    for _target, (channel, payload) in elements:
        if isinstance(payload, TaskReport):
            forwarded.append(payload)
            continue
        if isinstance(payload, CheckpointBarrier) and _first_of_input(
            received, payload.checkpoint_id, input_of(channel)
        ):
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
                if stats.spilled_bytes:
                    log.warning(
                        "%s[%d]: aligning checkpoint %d held back %d bytes, %d of them "
                        "spilled to local disk past --alignment-buffer %d",
                        uid,
                        subtask,
                        stats.checkpoint_id,
                        stats.buffered_bytes,
                        stats.spilled_bytes,
                        plan.alignment_buffer_bytes,
                    )
                yield from emit(op.flush_updates(backend))
                checkpointer.on_barrier(out.barrier, stats)
                yield from outputs.broadcast(out.barrier)
            elif isinstance(out, Aborted):
                continue
            elif isinstance(out.element, Watermark):
                advanced = valve.input(out.channel, out.element)
                if advanced is not None:
                    backend.current_watermark = advanced
                    yield from emit(op.on_watermark(backend))
            else:
                yield from process(out.channel, out.element)  # type: ignore[arg-type]
        if (
            fail_alignment is not None
            and handler.pending_checkpoint_id is not None
            and handler.pending_checkpoint_id == fail_alignment.checkpoint_id
        ):
            raise InjectedFailure(
                f"injected failure in {uid}[{subtask}] while aligning checkpoint "
                f"{fail_alignment.checkpoint_id}",
                clock.now_ms(),
            )
    handler.end_of_input()
    spill.close()
    # Step 3
    yield from emit(op.flush_updates(backend))
    report.late_records_dropped = op.late_records_dropped
    if operators is not None:
        state.operator_state = operators.carry()
    _close_epoch(state, sinks)
    # Step 4
    save_working_state(plan, uid, subtask, report, state, backend)
    # Step 5
    checkpointer.finish()
    report.duration_ms = clock.monotonic_ms() - started
    # Step 6
    yield from outputs.reports([report, *forwarded])
