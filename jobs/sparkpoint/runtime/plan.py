"""What the driver sends to the tasks of one epoch, and what each task sends back.

Both are plain picklable dataclasses: an :class:`EpochPlan` travels to the executors in the
task closure; a :class:`TaskReport` comes back in the task's result (execution contract 3:
the driver publishes events only once it accepted the whole epoch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.storage import CheckpointStorage


@dataclass(frozen=True)
class SplitRange:
    """Offsets ``[start, end)`` of one source split in an epoch, and where barrier n goes."""

    split: int
    split_id: str
    start: int
    end: int
    barrier_offset: int | None = None  # start <= offset <= end

    @property
    def records(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class StateInput:
    """Where a keyed subtask's working state comes from at the start of an epoch.

    ``version``: the tag of the version the previous accepted epoch wrote, read from this
    executor's local disk or else from ``durable_path``; ``handles``: a checkpoint's state
    handles to restore (every handle of the operator: the subtask keeps the key groups in its
    range); neither: empty state. ``operator_state``: the restored checkpoint's operator
    state of the vertex, every subtask's (each subtask takes its share).
    """

    version: str | None = None
    durable_path: str | None = None
    handles: tuple[p.StateHandleModel, ...] = ()
    operator_state: tuple[p.OperatorStateModel, ...] = ()  # every subtask's, when restoring
    restored_from: int | None = None
    backend_url: str | None = None  # where the durable copy of the keyed state starts
    durable_files: tuple[str, ...] = ()  # every durable file of the version (sink's included)


@dataclass(frozen=True)
class FailureInjection:
    """A failure to inject in job attempt 1, for ``--fail-after`` and the exactly-once tests.

    ``where``:
      - ``"source"``: source subtask ``subtask`` raises once its split reaches ``offset``;
      - ``"keyed"``: keyed subtask ``subtask`` raises after ``records`` records this epoch
        once ``epoch >= at_epoch``;
      - ``"alignment"``: keyed subtask ``subtask`` raises while aligning checkpoint
        ``checkpoint_id`` (after its first barrier, before its last);
      - ``"after_pre_commit"``: keyed subtask ``subtask`` raises right after its sink
        pre-committed for checkpoint ``checkpoint_id`` (the checkpoint never completes);
      - ``"before_commit"``: the driver fails after checkpoint ``checkpoint_id`` completed
        and before the sinks committed it.

    ``vertex`` names the vertex of ``"source"``, ``"keyed"``, ``"alignment"`` and
    ``"after_pre_commit"`` (e.g. the second keyed stage); None: the first source, the first
    keyed vertex, or for ``"after_pre_commit"`` whichever vertex with sinks pre-commits first.
    """

    where: str
    subtask: int = 0
    offset: int = 0
    records: int = 0
    at_epoch: int = 0
    checkpoint_id: int = 0
    attempt: int = 1
    vertex: str | None = None


@dataclass(frozen=True)
class EpochPlan:
    job_id: str
    job_name: str
    attempt: int
    epoch: int
    mode: p.CheckpointingMode
    ranges: tuple[SplitRange, ...]
    barrier: CheckpointBarrier | None
    # vertex uid -> one per subtask, for every vertex with working state (JobGraph.stateful)
    state_inputs: Mapping[str, tuple[StateInput, ...]]
    committed_up_to: int  # sinks drop pending transactions with checkpoint id <= this
    storage: CheckpointStorage
    local_dir: str
    restore_storage: CheckpointStorage | None = None  # where restored handles live
    durable_working_state: bool = False  # also keep each working-state version in storage
    isolate_workers: bool = False  # testing: every Python worker acts as its own executor
    state_backend: str = "hashmap"  # which keyed state backend the keyed subtasks use
    incremental: bool = False  # native snapshots upload only new files (rocksdb)
    chunk_records: int = 262_144
    alignment_buffer_bytes: int | None = None  # in memory per keyed subtask; None: no limit
    failure: FailureInjection | None = None
    # vertex uid -> the attempt its subtasks run in, for the vertices of regions that a region
    # failover left running (their transactions and working state keep their attempt); any
    # other vertex runs in ``attempt``. Empty unless a job of several regions failed over.
    vertex_attempts: Mapping[str, int] = field(default_factory=dict)

    def attempt_of(self, uid: str) -> int:
        """The attempt that vertex ``uid``'s subtasks run in (see ``vertex_attempts``)."""
        return self.vertex_attempts.get(uid, self.attempt)

    def injects(
        self, where: str, subtask: int, vertex: str | None = None, default: bool = True
    ) -> FailureInjection | None:
        """The failure to inject at ``where`` in ``vertex[subtask]``; ``default``: whether the
        vertex is the one a failure that names no vertex means."""
        f = self.failure
        if f is None or f.attempt != self.attempt:
            return None
        named = f.vertex == vertex if f.vertex is not None else default
        if f.where == where and f.subtask == subtask and named:
            return f
        return None

    def state_input(self, uid: str, subtask: int) -> StateInput:
        """Where ``uid[subtask]``'s working state comes from this epoch."""
        return self.state_inputs[uid][subtask]


@dataclass
class TaskReport:
    """What one task returns: counters, its events, its acknowledgement and working state."""

    operator_id: str
    subtask: int
    epoch: int
    attempt: int
    task_attempt: int
    records_in: int = 0
    records_out: int = 0
    late_records_dropped: int = 0  # by event-time windows: their windows had fired
    duration_ms: float = 0.0
    events: list[p.EventPayload] = field(default_factory=list)
    acks: list[p.SnapshotCompleted] = field(default_factory=list)
    declines: list[p.CheckpointDeclined] = field(default_factory=list)
    state_version: str | None = None
    state_durable_path: str | None = None
    state_backend_url: str | None = None
    state_durable_files: tuple[str, ...] = ()
    state_bytes_written: int = 0  # by the working-state version of this epoch
    split_end: dict[str, int] = field(default_factory=dict)
    restore_ms: float | None = None  # a keyed subtask that restored a checkpoint: how long
    first_record_wall_ms: int | None = None  # when a keyed subtask processed its first records
