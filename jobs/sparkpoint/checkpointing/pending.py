"""The lifecycle records of one checkpoint: pending, then completed or failed (Flink's names).

A :class:`PendingCheckpoint` collects the acknowledgements of every expected subtask. Once all
have arrived it becomes a :class:`CompletedCheckpoint`; if it is expired, declined or aborted it
becomes a :class:`FailedCheckpoint` carrying the acknowledgements received so far, so that the
host can delete their state handles. :class:`AckResult` and :class:`FailoverDecision` are what
the coordinator answers. These are plain records: no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.errors import CheckpointError, ConfigurationError
from sparkpoint.protocol import CheckpointKind, SinkTransactionModel, SnapshotCompleted

#: One subtask of one operator: ``(operator uid, subtask index)``.
SubtaskKey = tuple[str, int]

#: How many missing subtasks a message names before it says "and N more".
_MAX_NAMED_MISSING = 10


class CheckpointFailureReason(str, enum.Enum):
    """Why a checkpoint failed; the names of Flink's ``CheckpointFailureReason``."""

    PERIODIC_SCHEDULER_SHUTDOWN = "PERIODIC_SCHEDULER_SHUTDOWN"
    TOO_MANY_CHECKPOINT_REQUESTS = "TOO_MANY_CHECKPOINT_REQUESTS"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = "MINIMUM_TIME_BETWEEN_CHECKPOINTS"
    NOT_ALL_REQUIRED_TASKS_RUNNING = "NOT_ALL_REQUIRED_TASKS_RUNNING"
    IO_EXCEPTION = "IO_EXCEPTION"
    CHECKPOINT_ASYNC_EXCEPTION = "CHECKPOINT_ASYNC_EXCEPTION"
    CHECKPOINT_EXPIRED = "CHECKPOINT_EXPIRED"
    CHECKPOINT_SUBSUMED = "CHECKPOINT_SUBSUMED"
    CHECKPOINT_DECLINED = "CHECKPOINT_DECLINED"
    CHECKPOINT_DECLINED_TASK_NOT_READY = "CHECKPOINT_DECLINED_TASK_NOT_READY"
    CHECKPOINT_DECLINED_TASK_CLOSING = "CHECKPOINT_DECLINED_TASK_CLOSING"
    CHECKPOINT_DECLINED_SUBSUMED = "CHECKPOINT_DECLINED_SUBSUMED"
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = "CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER"
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = "CHECKPOINT_DECLINED_INPUT_END_OF_STREAM"
    CHECKPOINT_DECLINED_ALIGNMENT_LIMIT_EXCEEDED = "CHECKPOINT_DECLINED_ALIGNMENT_LIMIT_EXCEEDED"
    CHECKPOINT_COORDINATOR_SHUTDOWN = "CHECKPOINT_COORDINATOR_SHUTDOWN"
    CHECKPOINT_COORDINATOR_SUSPEND = "CHECKPOINT_COORDINATOR_SUSPEND"
    JOB_FAILURE = "JOB_FAILURE"
    JOB_FAILOVER_REGION = "JOB_FAILOVER_REGION"
    TASK_FAILURE = "TASK_FAILURE"
    TASK_CHECKPOINT_FAILURE = "TASK_CHECKPOINT_FAILURE"
    UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE = "UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE"
    FINALIZE_CHECKPOINT_FAILURE = "FINALIZE_CHECKPOINT_FAILURE"
    TRIGGER_CHECKPOINT_FAILURE = "TRIGGER_CHECKPOINT_FAILURE"

    @property
    def is_pre_flight(self) -> bool:
        """True when the failure happens before the checkpoint reaches the job's tasks."""
        return self in _PRE_FLIGHT


_PRE_FLIGHT = frozenset(
    {
        CheckpointFailureReason.PERIODIC_SCHEDULER_SHUTDOWN,
        CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS,
        CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS,
        CheckpointFailureReason.NOT_ALL_REQUIRED_TASKS_RUNNING,
        CheckpointFailureReason.IO_EXCEPTION,
    }
)


class CheckpointTriggerError(CheckpointError):
    """A trigger was refused (too many pending checkpoints, minimum pause not over)."""

    def __init__(self, job_id: str, reason: CheckpointFailureReason, message: str) -> None:
        super().__init__(f"job {job_id}: {message} ({reason.value})")
        self.job_id = job_id
        self.reason = reason


class TaskAcknowledgeResult(str, enum.Enum):
    """What an acknowledgement did to a pending checkpoint (Flink's names)."""

    SUCCESS = "SUCCESS"
    DUPLICATE = "DUPLICATE"
    UNKNOWN = "UNKNOWN"


def format_subtasks(keys: list[SubtaskKey]) -> str:
    """Name subtasks as ``op[i]``, at most ten of them, then ``and N more``."""
    named = ", ".join(f"{op}[{i}]" for op, i in keys[:_MAX_NAMED_MISSING])
    extra = len(keys) - _MAX_NAMED_MISSING
    return f"{named} and {extra} more" if extra > 0 else named


def expected_subtasks(job_id: str, tasks: dict[str, int]) -> frozenset[SubtaskKey]:
    """Every ``(operator uid, i)`` with ``i`` below the operator's parallelism.

    Raises:
        ConfigurationError: when ``tasks`` is empty or a parallelism is not an integer >= 1.
    """
    if not tasks:
        raise ConfigurationError(f"job {job_id}: no tasks to checkpoint")
    for op, parallelism in tasks.items():
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ConfigurationError(
                f"job {job_id}: operator {op!r} has parallelism {parallelism!r}, must be >= 1"
            )
    return frozenset((op, i) for op, n in tasks.items() for i in range(n))


def _state_size(acks: dict[SubtaskKey, SnapshotCompleted]) -> int:
    return sum(ack.state_size for ack in acks.values())


def _checkpointed_size(acks: dict[SubtaskKey, SnapshotCompleted]) -> int:
    return sum(ack.checkpointed_size for ack in acks.values())


@dataclass
class PendingCheckpoint:
    """A triggered checkpoint that waits for the acknowledgement of every expected subtask."""

    checkpoint_id: int
    kind: CheckpointKind
    attempt: int
    trigger_timestamp: int
    trigger_monotonic_ms: float
    timeout_ms: int
    expected: frozenset[SubtaskKey]
    is_final: bool = False
    target_directory: str | None = None
    acks: dict[SubtaskKey, SnapshotCompleted] = field(default_factory=dict)

    @property
    def num_subtasks(self) -> int:
        return len(self.expected)

    @property
    def num_acknowledged(self) -> int:
        return len(self.acks)

    @property
    def is_fully_acknowledged(self) -> bool:
        return len(self.acks) == len(self.expected)

    @property
    def state_size(self) -> int:
        return _state_size(self.acks)

    @property
    def checkpointed_size(self) -> int:
        return _checkpointed_size(self.acks)

    @property
    def is_savepoint(self) -> bool:
        return self.kind is CheckpointKind.SAVEPOINT

    def deadline_monotonic_ms(self) -> float:
        """The monotonic time at which this checkpoint expires."""
        return self.trigger_monotonic_ms + self.timeout_ms

    def missing_subtasks(self) -> list[SubtaskKey]:
        """The expected subtasks that have not acknowledged yet, sorted."""
        return sorted(self.expected - self.acks.keys())

    def acknowledge_task(self, ack: SnapshotCompleted) -> TaskAcknowledgeResult:
        """Record one subtask's acknowledgement.

        Args:
            ack: the subtask's ``SnapshotCompleted`` for this checkpoint.

        Returns:
            ``SUCCESS`` when recorded, ``DUPLICATE`` when this subtask had already acknowledged
            (the first acknowledgement is kept), ``UNKNOWN`` when the subtask is not expected.
        """
        key = (ack.operator_id, ack.subtask)
        if key not in self.expected:
            return TaskAcknowledgeResult.UNKNOWN
        if key in self.acks:
            return TaskAcknowledgeResult.DUPLICATE
        self.acks[key] = ack
        return TaskAcknowledgeResult.SUCCESS

    def finalize(self, completion_timestamp: int, now_monotonic_ms: float) -> CompletedCheckpoint:
        """The completed checkpoint made of every acknowledgement.

        Args:
            completion_timestamp: wall-clock epoch milliseconds of the completion.
            now_monotonic_ms: the monotonic clock now, for the end-to-end duration.

        Raises:
            CheckpointError: when some expected subtask has not acknowledged.
        """
        if not self.is_fully_acknowledged:
            raise CheckpointError(
                f"checkpoint {self.checkpoint_id} cannot complete: missing "
                f"{format_subtasks(self.missing_subtasks())}"
            )
        return CompletedCheckpoint(
            checkpoint_id=self.checkpoint_id,
            kind=self.kind,
            attempt=self.attempt,
            trigger_timestamp=self.trigger_timestamp,
            completion_timestamp=completion_timestamp,
            end_to_end_duration_ms=max(0.0, now_monotonic_ms - self.trigger_monotonic_ms),
            is_final=self.is_final,
            acks=dict(self.acks),
        )

    def abort(
        self,
        reason: CheckpointFailureReason,
        message: str,
        failure_timestamp: int,
        declined_by: SubtaskKey | None = None,
    ) -> FailedCheckpoint:
        """The failed checkpoint, carrying the acknowledgements received so far."""
        return FailedCheckpoint(
            checkpoint_id=self.checkpoint_id,
            kind=self.kind,
            attempt=self.attempt,
            trigger_timestamp=self.trigger_timestamp,
            failure_timestamp=failure_timestamp,
            reason=reason,
            message=message,
            acks=dict(self.acks),
            is_final=self.is_final,
            declined_by=declined_by,
        )


@dataclass
class CompletedCheckpoint:
    """A checkpoint (or savepoint) that every expected subtask acknowledged.

    ``external_path`` is set by the host once it has written the checkpoint's ``_metadata``.
    """

    checkpoint_id: int
    kind: CheckpointKind
    attempt: int
    trigger_timestamp: int
    completion_timestamp: int
    end_to_end_duration_ms: float
    is_final: bool
    acks: dict[SubtaskKey, SnapshotCompleted]
    external_path: str | None = None

    @property
    def state_size(self) -> int:
        return _state_size(self.acks)

    @property
    def checkpointed_size(self) -> int:
        return _checkpointed_size(self.acks)

    @property
    def is_savepoint(self) -> bool:
        return self.kind is CheckpointKind.SAVEPOINT

    def to_failed(
        self, reason: CheckpointFailureReason, message: str, failure_timestamp: int
    ) -> FailedCheckpoint:
        """This checkpoint as a failed one (its finalization failed), with all its acks."""
        return FailedCheckpoint(
            checkpoint_id=self.checkpoint_id,
            kind=self.kind,
            attempt=self.attempt,
            trigger_timestamp=self.trigger_timestamp,
            failure_timestamp=failure_timestamp,
            reason=reason,
            message=message,
            acks=dict(self.acks),
            is_final=self.is_final,
        )

    def source_positions(self) -> dict[str, int]:
        """Every source split's position in this checkpoint, merged over all subtasks.

        Raises:
            CheckpointError: when two subtasks report different positions for one split.
        """
        merged: dict[str, int] = {}
        owner: dict[str, SubtaskKey] = {}
        for key in sorted(self.acks):
            for split, offset in self.acks[key].source_positions.items():
                if split in merged and merged[split] != offset:
                    first = owner[split]
                    raise CheckpointError(
                        f"checkpoint {self.checkpoint_id}: split {split!r} is at {merged[split]} "
                        f"in {first[0]}[{first[1]}] but at {offset} in {key[0]}[{key[1]}]"
                    )
                merged[split] = offset
                owner.setdefault(split, key)
        return dict(sorted(merged.items()))

    def sink_transactions(self) -> dict[SubtaskKey, list[SinkTransactionModel]]:
        """The pre-committed sink transactions of this checkpoint, by sink subtask."""
        return {
            key: list(self.acks[key].sink_transactions)
            for key in sorted(self.acks)
            if self.acks[key].sink_transactions
        }


@dataclass(frozen=True)
class FailedCheckpoint:
    """A checkpoint that was expired, declined or aborted.

    ``acks`` holds the acknowledgements received before the failure: the host deletes their
    state handles. ``declined_by`` names the subtask that declined, when one did.
    """

    checkpoint_id: int
    kind: CheckpointKind
    attempt: int
    trigger_timestamp: int
    failure_timestamp: int
    reason: CheckpointFailureReason
    message: str
    acks: dict[SubtaskKey, SnapshotCompleted] = field(default_factory=dict)
    is_final: bool = False
    declined_by: SubtaskKey | None = None

    @property
    def is_savepoint(self) -> bool:
        return self.kind is CheckpointKind.SAVEPOINT


@dataclass(frozen=True)
class AckResult:
    """What one acknowledgement caused.

    Attributes:
        completed: the checkpoint this acknowledgement completed, if it did.
        discarded: the checkpoint is no longer pending (aborted or expired): delete the
            acknowledgement's handles.
        duplicate: this subtask had already acknowledged this checkpoint; nothing changed.
    """

    completed: CompletedCheckpoint | None = None
    discarded: bool = False
    duplicate: bool = False


@dataclass(frozen=True)
class FailoverDecision:
    """The outcome of a failover or of a requested restore.

    Attributes:
        attempt: the new job attempt; messages of older attempts are refused from now on.
        restore_from: the checkpoint to restore, or None to start from the beginning. The host
            should pin it in the store until the restore is done.
        cause: why the job fails over.
        aborted: the pending checkpoints the failover aborted (delete their partial state).
    """

    attempt: int
    restore_from: CompletedCheckpoint | None
    cause: str
    aborted: list[FailedCheckpoint] = field(default_factory=list)


def checkpoint_metadata(job_id: str, cp: CompletedCheckpoint) -> dict[str, Any]:
    """The ``_metadata`` of a completed checkpoint: everything a restore from its path needs.

    The acknowledgements leave out their fields that are None (a handle's ``inline`` beside
    its ``path``, a non-keyed handle's key groups, ...): reading one back gives them their
    default, None, again. So the ``_metadata`` of a job's checkpoint holds no ``null``, and
    :func:`~sparkpoint.checkpointing.storage_base.encode_metadata` takes its fast path.
    """
    return {
        "format": "sparkpoint-checkpoint/1",
        "job_id": job_id,
        "checkpoint_id": cp.checkpoint_id,
        "kind": cp.kind.value,
        "attempt": cp.attempt,
        "is_final": cp.is_final,
        "trigger_timestamp": cp.trigger_timestamp,
        "completion_timestamp": cp.completion_timestamp,
        "acks": [a.model_dump(mode="json", exclude_none=True) for a in cp.acks.values()],
    }
