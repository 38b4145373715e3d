"""The tail shared by every subtask: snapshots on a barrier, the sink, working state.

:class:`SubtaskCheckpointer` is the per-subtask half of a checkpoint: on barrier *n* it takes
the synchronous part (a serialized copy of keyed state, the sink's pre-commit), hands the
upload (the asynchronous part) to a thread, and builds the acknowledgement once the upload is
done. A snapshot that the checkpoint storage refuses (too large for inline storage) becomes a
decline with the reason instead of an acknowledgement.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import AlignmentStats, CheckpointBarrier
from sparkpoint.checkpointing.storage import StateTooLargeError
from sparkpoint.clock import Clock
from sparkpoint.connectors.sinks import SinkWriter
from sparkpoint.errors import InjectedFailure
from sparkpoint.functions import TimestampsAndWatermarksOperator
from sparkpoint.records import Batch
from sparkpoint.runtime import working_state
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.watermarks import BoundedOutOfOrdernessWatermarks


@dataclass
class _InFlight:
    barrier: CheckpointBarrier
    first_barrier_wall: int
    alignment: AlignmentStats | None
    sync_ms: float
    state_size: int
    source_positions: dict[str, int]
    sinks: list[p.SinkTransactionModel]
    upload: Future[p.StateHandleModel] | None
    upload_started: float


class SubtaskCheckpointer:
    """Snapshots one subtask on each barrier; collects acks, declines and events."""

    def __init__(
        self,
        plan: EpochPlan,
        uid: str,
        subtask: int,
        report: TaskReport,
        clock: Clock,
        backend: HashMapKeyedStateBackend | None = None,
        sink: SinkWriter | None = None,
        pending: list[tuple[int, p.SinkTransactionModel]] | None = None,
    ) -> None:
        self.plan = plan
        self.uid = uid
        self.subtask = subtask
        self.report = report
        self.clock = clock
        self.backend = backend
        self.sink = sink
        self.pending = pending if pending is not None else []
        self._inflight: list[_InFlight] = []
        self._pool: ThreadPoolExecutor | None = None

    # Step 1 (synchronous part) and step 2 (start the asynchronous upload) of a snapshot.
    def on_barrier(
        self,
        barrier: CheckpointBarrier,
        alignment: AlignmentStats | None,
        source_positions: dict[str, int] | None = None,
    ) -> None:
        first_wall = self.clock.now_ms()
        if alignment is not None and alignment.barrier_wall_ms:
            first_wall = min(alignment.barrier_wall_ms.values())
        start = self.clock.monotonic_ms()
        blob = self.backend.snapshot() if self.backend is not None else None
        sinks: list[p.SinkTransactionModel] = []
        if self.sink is not None:
            sealed = self.sink.pre_commit(barrier.checkpoint_id)
            self.pending.append((barrier.checkpoint_id, sealed))
            sinks = [txn for _, txn in self.pending]
            self.report.events.append(
                p.SinkPreCommitted(
                    checkpoint_id=barrier.checkpoint_id,
                    operator_id=self.uid,
                    subtask=self.subtask,
                    transaction=sealed,
                )
            )
        sync_ms = self.clock.monotonic_ms() - start
        fail = self.plan.injects("after_pre_commit", self.subtask)
        if fail is not None and fail.checkpoint_id == barrier.checkpoint_id and self.sink:
            raise InjectedFailure(
                f"injected failure in {self.uid}[{self.subtask}] after the sink pre-committed "
                f"for checkpoint {barrier.checkpoint_id}"
            )
        upload = None
        if blob is not None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
            assert self.backend is not None
            kg = self.backend.key_group_range
            upload = self._pool.submit(
                self.plan.storage.write_state,
                self.plan.job_id,
                barrier.checkpoint_id,
                # Tagged by job attempt and task attempt (execution contract 2).
                f"{self.uid}-{self.subtask}-a{self.plan.attempt}-t{self.report.task_attempt}",
                blob,
                key_group_range=kg,
            )
        self._inflight.append(
            _InFlight(
                barrier,
                first_wall,
                alignment,
                sync_ms,
                len(blob) if blob else 0,
                source_positions or {},
                sinks,
                upload,
                self.clock.monotonic_ms(),
            )
        )

    # Step 3: wait for the uploads and acknowledge (or decline).
    def finish(self) -> None:
        try:
            for f in self._inflight:
                self._acknowledge(f)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)

    def _acknowledge(self, f: _InFlight) -> None:
        cid = f.barrier.checkpoint_id
        handles: list[p.StateHandleModel] = []
        async_ms = 0.0
        if f.upload is not None:
            try:
                handles = [f.upload.result()]
            except StateTooLargeError as err:
                self.report.declines.append(
                    p.CheckpointDeclined(
                        checkpoint_id=cid,
                        operator_id=self.uid,
                        subtask=self.subtask,
                        reason=str(err),
                    )
                )
                return
            async_ms = max(0.0, self.clock.monotonic_ms() - f.upload_started)
        raw_delay = f.first_barrier_wall - f.barrier.timestamp
        al = f.alignment
        self.report.acks.append(
            p.SnapshotCompleted(
                checkpoint_id=cid,
                operator_id=self.uid,
                subtask=self.subtask,
                epoch=self.plan.epoch,
                ack_timestamp=self.clock.now_ms(),
                start_delay_ms=max(0.0, float(raw_delay)),
                alignment_duration_ms=al.duration_ms if al else 0.0,
                alignment_buffered_bytes=al.buffered_bytes if al else 0,
                sync_duration_ms=f.sync_ms,
                async_duration_ms=async_ms,
                state_size=f.state_size,
                checkpointed_size=sum(h.size for h in handles),
                handles=handles,
                source_positions=f.source_positions,
                sink_transactions=f.sinks,
                clock_flagged=raw_delay < 0,
            )
        )


def run_chain(
    chain: list[Any], batch: Batch, watermarks: BoundedOutOfOrdernessWatermarks | None = None
) -> Batch:
    """Apply the chained operators; ``watermarks`` observes the records where the chain
    assigns timestamps."""
    for op in chain:
        if not len(batch):
            return batch
        batch = op.apply(batch)
        if watermarks is not None and isinstance(op, TimestampsAndWatermarksOperator):
            watermarks.observe(batch)
    return batch


def _local_dir(plan: EpochPlan, uid: str, subtask: int) -> str:
    base = plan.local_dir
    if plan.isolate_workers:  # testing: no two Python workers share a local copy
        base = os.path.join(base, f"worker-{os.getpid()}")
    return working_state.version_dir(base, plan.job_id, uid, subtask)


def open_working_state(plan: EpochPlan, uid: str, subtask: int) -> working_state.WorkingState:
    """Step 1 of every epoch: open the expected version (or start empty / from a restore).

    The local copy when this executor has it, else the durable copy; neither is an error
    (:class:`~sparkpoint.runtime.working_state.WorkingStateLostError`), never empty state.
    """
    inp = plan.state_inputs[subtask]
    if inp.version is None:
        return working_state.WorkingState()
    directory = _local_dir(plan, uid, subtask)
    data = working_state.read_local(directory, inp.version)
    where = os.path.join(directory, working_state.file_name(inp.version))
    if data is None and inp.durable_path is not None:
        data = plan.storage.read_working_state(inp.durable_path)
        where = inp.durable_path
    if data is None:
        raise working_state.WorkingStateLostError(
            f"working state {inp.version} of {uid}[{subtask}] is not on this executor "
            f"({where}) and has no durable copy; recovering from the latest checkpoint"
        )
    return working_state.decode(data, inp.version, where)


def save_working_state(
    plan: EpochPlan, uid: str, subtask: int, report: TaskReport, state: working_state.WorkingState
) -> None:
    """Last step of every epoch: write version v+1, tagged by who wrote it."""
    tag = f"a{plan.attempt}-e{plan.epoch}-t{report.task_attempt}"
    data = working_state.encode(tag, state)
    directory = _local_dir(plan, uid, subtask)
    working_state.save_local(directory, tag, data)
    keep = {working_state.file_name(tag)}
    inp = plan.state_inputs[subtask]
    if inp.version is not None:  # until the driver accepts this epoch
        keep.add(working_state.file_name(inp.version))
    working_state.prune(directory, keep)
    if plan.durable_working_state:
        report.state_durable_path = plan.storage.write_working_state(
            plan.job_id, f"{uid}-{subtask}", tag, data
        )
    report.state_version = tag
