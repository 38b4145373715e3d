"""The tail shared by every subtask: snapshots on a barrier, the sink, working state.

:class:`SubtaskCheckpointer` is the per-subtask half of a checkpoint: on barrier *n* it takes
the synchronous part (the keyed state backend's capture, the sink's pre-commit), hands the
asynchronous part (serializing and uploading the capture) to a thread while processing goes
on, and builds the acknowledgement once the upload is done. A snapshot that the checkpoint
storage refuses (too large for inline storage) or cannot take (full, read-only, away: any
error of the upload but a damaged capture, an internal assertion or memory exhausted) becomes
a decline with the reason instead of an acknowledgement.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import AlignmentStats, CheckpointBarrier
from sparkpoint.checkpointing.storage import CheckpointStorage, StateTooLargeError
from sparkpoint.clock import Clock
from sparkpoint.connectors.sinks import SinkWriter
from sparkpoint.errors import CorruptSnapshotError, InjectedFailure
from sparkpoint.functions import TimestampsAndWatermarksOperator
from sparkpoint.job_graph import Vertex
from sparkpoint.protocol_types import CheckpointKind
from sparkpoint.records import Batch
from sparkpoint.runtime import working_state
from sparkpoint.runtime.operator_states import (
    Lists,
    OperatorStateTooLargeError,
    SubtaskOperatorState,
)
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.state import backends
from sparkpoint.state.backend import (
    KeyedStateBackend,
)
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.state.snapshot_contracts import (
    SnapshotCapture,
)
from sparkpoint.watermarks import BoundedOutOfOrdernessWatermarks

log = logging.getLogger(__name__)


@dataclass
class _InFlight:
    barrier: CheckpointBarrier
    first_barrier_wall: int
    alignment: AlignmentStats | None
    sync_ms: float
    state_size: int
    source_positions: dict[str, int]
    sinks: list[p.SinkTransactionModel]
    upload: Future[list[p.StateHandleModel]] | None
    target: _SnapshotTarget | None
    upload_started: float
    operator_state: list[p.OperatorStateModel]
    decline: str | None  # the snapshot cannot be acknowledged, and why


@dataclass
class _SnapshotTarget:
    """Where one subtask's snapshot for one checkpoint goes; counts the bytes uploaded."""

    storage: CheckpointStorage
    job_id: str
    checkpoint_id: int
    name: str  # tagged by job attempt and task attempt (execution contract 2)
    key_group_range: KeyGroupRange
    incremental: bool
    states: list[p.StateDescriptorModel]  # recorded in each handle (and so in _metadata)
    max_parallelism: int  # recorded in each handle: a restore with another is refused early
    uploaded: int = 0  # bytes written this time (Flink's checkpointed size)
    full: int = 0  # bytes the snapshot references in all (Flink's state size)

    def write(self, data: bytes, *, fmt: str) -> p.StateHandleModel:
        handle = self.storage.write_state(
            self.job_id, self.checkpoint_id, self.name, data, key_group_range=self.key_group_range
        ).model_copy(
            update={"format": fmt, "states": self.states, "max_parallelism": self.max_parallelism}
        )
        self.uploaded += handle.size
        self.full += handle.size
        return handle

    def write_native(
        self, private: dict[str, str], shared: dict[str, str], reused: list[Any], *, fmt: str
    ) -> p.StateHandleModel:
        handle = self.storage.write_native(
            self.job_id,
            self.checkpoint_id,
            self.name,
            private,
            shared,
            reused,
            key_group_range=self.key_group_range,
            fmt=fmt,
        ).model_copy(update={"states": self.states, "max_parallelism": self.max_parallelism})
        reused_paths = {r.path for r in reused}
        shared_bytes = sum(f.size for f in handle.shared)
        new_shared = sum(f.size for f in handle.shared if f.path not in reused_paths)
        private_bytes = sum(os.path.getsize(path) for path in private.values())
        self.uploaded += handle.size + private_bytes + new_shared
        self.full += handle.size + private_bytes + shared_bytes
        return handle


class SubtaskCheckpointer:
    """Snapshots one subtask on each barrier; collects acks, declines and events."""

    def __init__(
        self,
        plan: EpochPlan,
        uid: str,
        subtask: int,
        report: TaskReport,
        clock: Clock,
        backend: KeyedStateBackend | None = None,
        sinks: dict[str, SinkWriter] | None = None,
        pending: list[tuple[int, p.SinkTransactionModel]] | None = None,
        operator_state: SubtaskOperatorState | None = None,
    ) -> None:
        self.plan = plan
        self.operator_state = operator_state
        self.uid = uid
        self.subtask = subtask
        self.report = report
        self.clock = clock
        self.backend = backend
        self.sinks = sinks or {}
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
        capture = None
        if self.backend is not None:  # savepoints are canonical, checkpoints may be native
            savepoint = barrier.kind is not CheckpointKind.CHECKPOINT
            native = not savepoint and self.plan.storage.native_snapshots  # else inline
            capture = self.backend.snapshot(barrier.checkpoint_id, native=native)
        operator_state: list[p.OperatorStateModel] = []
        decline = None
        if self.operator_state is not None:
            try:
                operator_state = self.operator_state.snapshot(barrier.checkpoint_id)
            except OperatorStateTooLargeError as err:
                decline = str(err)
        sinks: list[p.SinkTransactionModel] = []
        for sink_uid, writer in self.sinks.items():  # each sink its own transaction
            sealed = writer.pre_commit(barrier.checkpoint_id)
            sealed = sealed.model_copy(update={"sink": sink_uid})
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
        fail = self.plan.injects("after_pre_commit", self.subtask, self.uid)
        if fail is not None and fail.checkpoint_id == barrier.checkpoint_id and self.sinks:
            raise InjectedFailure(
                f"injected failure in {self.uid}[{self.subtask}] after the sink pre-committed "
                f"for checkpoint {barrier.checkpoint_id}",
                self.clock.now_ms(),
            )
        upload = target = None
        if capture is not None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
            assert self.backend is not None
            target = _SnapshotTarget(
                self.plan.storage,
                self.plan.job_id,
                barrier.checkpoint_id,
                f"{self.uid}-{self.subtask}-a{self.report.attempt}-t{self.report.task_attempt}",
                self.backend.key_group_range,
                incremental=self.plan.incremental and barrier.kind is CheckpointKind.CHECKPOINT,
                states=[
                    p.StateDescriptorModel(name=i.name, kind=i.kind, serializer=i.serializer)
                    for i in self.backend.state_infos.values()
                ],
                max_parallelism=self.backend.max_parallelism,
            )
            upload = self._pool.submit(_materialize, capture, target)
        self._inflight.append(
            _InFlight(
                barrier,
                first_wall,
                alignment,
                sync_ms,
                capture.state_size if capture is not None else 0,
                source_positions or {},
                sinks,
                upload,
                target,
                self.clock.monotonic_ms(),
                operator_state,
                decline,
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
        decline = f.decline
        asynchronous = False
        if f.upload is not None:
            try:
                handles = f.upload.result()
            except StateTooLargeError as err:
                decline = str(err)
            except (CorruptSnapshotError, AssertionError, MemoryError):
                raise  # the capture itself is broken, or this process: the task fails
            except Exception as err:  # any other failure of the upload declines
                # Flink's CHECKPOINT_ASYNC_EXCEPTION: the checkpoint fails, the task does not
                # (storage that is full or away); the tolerable failures decide a failover.
                # The storage's own errors in one line, anything else with its traceback.
                dest = _destination(err, f.target)
                log.warning(
                    "job %s: %s[%d]: checkpoint %d declined: its snapshot could not be written "
                    "to %s: %s",
                    self.plan.job_id,
                    self.uid,
                    self.subtask,
                    cid,
                    dest,
                    err,
                    exc_info=not isinstance(err, OSError),
                )
                decline = (
                    f"its snapshot could not be written to {dest}: {type(err).__name__}: {err}"
                )
                asynchronous = True
        if decline is not None:
            self.report.declines.append(
                p.CheckpointDeclined(
                    checkpoint_id=cid,
                    operator_id=self.uid,
                    subtask=self.subtask,
                    reason=decline,
                    asynchronous=asynchronous,
                )
            )
            return
        if f.upload is not None:
            async_ms = max(0.0, self.clock.monotonic_ms() - f.upload_started)
        # Operator state is written with the checkpoint's metadata: it counts in both sizes.
        inline = sum(len(s.data) for s in f.operator_state)
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
                state_size=(f.target.full if f.target is not None else f.state_size) + inline,
                checkpointed_size=(f.target.uploaded if f.target is not None else 0) + inline,
                handles=handles,
                source_positions=f.source_positions,
                sink_transactions=f.sinks,
                operator_state=f.operator_state,
                clock_flagged=raw_delay < 0,
                barrier_timestamp=f.first_barrier_wall,
                alignment_buffered_records=al.buffered_records if al else 0,
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


def _destination(err: BaseException, target: _SnapshotTarget | None) -> str:
    """Where a snapshot's upload failed, for the operator who must free or fix it (a full
    disk's error does not name its file): the file when the error names it, else the
    checkpoint's directory."""
    if isinstance(err, OSError) and err.filename:
        return str(err.filename)
    if target is not None:
        path = target.storage.checkpoint_path(target.job_id, target.checkpoint_id)
        if path is not None:
            return path
    return "checkpoint storage"


def _materialize(capture: SnapshotCapture, target: _SnapshotTarget) -> list[p.StateHandleModel]:
    """The asynchronous part of a snapshot, on the upload thread."""
    try:
        return capture.materialize(target)
    finally:
        capture.release()


def open_working_state(plan: EpochPlan, uid: str, subtask: int) -> working_state.WorkingState:
    """Step 1 of every epoch: open the sink's part of the expected version (or start empty).

    The local copy when this executor has it, else the durable copy; neither is an error
    (:class:`~sparkpoint.runtime.working_state.WorkingStateLostError`), never empty state.
    """
    inp = plan.state_input(uid, subtask)
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


def open_operator_state(
    plan: EpochPlan, vertex: Vertex, subtask: int, state: working_state.WorkingState
) -> SubtaskOperatorState | None:
    """Step 1 too: the operator state of the vertex's checkpointed functions, restored or
    carried from the previous epoch, their ``initialize_state`` called (None: it has none)."""
    inp = plan.state_input(vertex.uid, subtask)
    carried = cast("Lists | None", state.operator_state)
    restoring = inp.restored_from is not None
    return SubtaskOperatorState.open(vertex, subtask, carried, inp.operator_state, restoring)


def _version_store(
    plan: EpochPlan, uid: str, subtask: int, durable_url: str | None
) -> working_state.SubtaskVersionStore:
    return working_state.SubtaskVersionStore(
        local_dir=os.path.join(_local_dir(plan, uid, subtask), "keyed"),
        storage=plan.storage,
        job_id=plan.job_id,
        name=f"{uid}-{subtask}",
        durable=plan.durable_working_state,
        durable_url=durable_url,
    )


def open_keyed_state(
    plan: EpochPlan, uid: str, subtask: int, max_parallelism: int, kg_range: KeyGroupRange
) -> KeyedStateBackend:
    """Step 1 of a keyed subtask's epoch: restore from a checkpoint's handles, else open the
    expected version of the working state, else start empty.

    Raises:
        WorkingStateLostError: the expected version is neither here nor stored durably.
    """
    inp = plan.state_input(uid, subtask)
    store = _version_store(plan, uid, subtask, inp.backend_url)
    if inp.handles:
        overlapping = [
            h
            for h in inp.handles
            if h.key_group_start is None
            or h.key_group_end is None
            or (h.key_group_start <= kg_range.end and h.key_group_end >= kg_range.start)
        ]
        reader = plan.restore_storage or plan.storage
        return backends.restore_backend(
            plan.state_backend,
            overlapping,
            reader,
            max_parallelism,
            kg_range,
            local_dir=store.local_dir,
            own=plan.restore_storage is None,  # a failover to this job's own checkpoint
        )
    if inp.version is not None:
        backend = backends.open_version(
            plan.state_backend, store, inp.version, max_parallelism, kg_range
        )
        if backend is None:
            raise working_state.WorkingStateLostError(
                f"keyed state version {inp.version} of {uid}[{subtask}] is not on this "
                f"executor ({store.local_dir}) and has no durable copy; recovering from the "
                "latest checkpoint"
            )
        if backend.key_group_range != kg_range:
            raise working_state.WorkingStateLostError(
                f"working state of {uid}[{subtask}] holds key groups "
                f"{backend.key_group_range}, expected {kg_range}"
            )
        return backend
    return backends.create_backend(
        plan.state_backend, max_parallelism, kg_range, local_dir=store.local_dir
    )


def save_working_state(
    plan: EpochPlan,
    uid: str,
    subtask: int,
    report: TaskReport,
    state: working_state.WorkingState,
    backend: KeyedStateBackend | None = None,
) -> None:
    """Last step of every epoch: write version v+1, tagged by who wrote it."""
    tag = f"a{report.attempt}-e{plan.epoch}-t{report.task_attempt}"
    data = working_state.encode(tag, state)
    directory = _local_dir(plan, uid, subtask)
    working_state.save_local(directory, tag, data)
    inp = plan.state_input(uid, subtask)
    keep = {working_state.file_name(tag), "keyed"}
    if inp.version is not None:  # until the driver accepts this epoch
        keep.add(working_state.file_name(inp.version))
    working_state.prune(directory, keep)
    durable_files: list[str] = []
    if plan.durable_working_state:
        report.state_durable_path = working_state.write_durable(
            plan.storage, plan.job_id, f"{uid}-{subtask}", tag, data
        )
        if report.state_durable_path is not None:
            durable_files.append(report.state_durable_path)
    report.state_bytes_written = len(data)
    if backend is not None:
        store = _version_store(plan, uid, subtask, inp.backend_url)
        # A restored backend starts a new chain: the previous version is not its base.
        previous = None if inp.handles else inp.version
        saved = backend.save_version(store, tag, previous)
        backend.prune_versions(store, {tag} | ({previous} if previous else set()))
        report.state_backend_url = saved.durable_url
        report.state_bytes_written += saved.bytes_written
        durable_files.extend(saved.durable_files)
    report.state_durable_files = tuple(durable_files)
    report.state_version = tag
