"""The wire protocol between jobs and the control plane: versioned events and commands.

Every message is an :class:`Envelope` (schema version, type, job id, job attempt, timestamp)
whose ``payload`` is validated against the pydantic model registered for its ``type``. Both
sides import this one module. Readers ignore unknown fields; an unknown type or an invalid
payload raises :class:`ProtocolError` (the control plane routes those to a dead-letter stream).
Every number has bounds and every job id a pattern (``sparkpoint.limits``), and a message above
the size limit is refused when encoded and when decoded. ``sender``, ``seq`` and ``sig``
authenticate a message (``sparkpoint.signing``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from sparkpoint.errors import SparkpointError
from sparkpoint.limits import (
    MAX_DURATION_MS,
    MAX_INT,
    MAX_LONG,
    MAX_SUBTASKS,
    MAX_VERTICES,
    check_job_id,
)
from sparkpoint.protocol_liveness import DriverHeartbeat as DriverHeartbeat
from sparkpoint.protocol_liveness import Heartbeat as Heartbeat
from sparkpoint.protocol_types import (
    CheckpointId,
    Epoch,
    Index,
    Long,
    Name,
    Nonce,
    Parallelism,
    Size,
    Text,
)
from sparkpoint.protocol_types import (
    CheckpointingMode as CheckpointingMode,
)
from sparkpoint.protocol_types import (
    CheckpointKind as CheckpointKind,
)
from sparkpoint.protocol_types import (
    CheckpointStatus as CheckpointStatus,
)
from sparkpoint.protocol_types import (
    ExecutorModel as ExecutorModel,
)
from sparkpoint.protocol_types import (
    JobStatus as JobStatus,
)
from sparkpoint.protocol_types import (
    OperatorStateModel as OperatorStateModel,
)
from sparkpoint.protocol_types import (
    ProtocolModel as _Model,
)
from sparkpoint.protocol_types import (
    SharedFileModel as SharedFileModel,
)
from sparkpoint.protocol_types import (
    SinkTransactionModel as SinkTransactionModel,
)
from sparkpoint.protocol_types import (
    StateDescriptorModel as StateDescriptorModel,
)
from sparkpoint.protocol_types import (
    StateHandleModel as StateHandleModel,
)
from sparkpoint.protocol_types import (
    check_registration_config as _check_config,
)

SCHEMA_VERSION = 1
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20  # one limit for every message, 1 MiB by default


class ProtocolError(SparkpointError):
    """A message that cannot be decoded, has an unknown type, or an invalid payload."""


def spark_job_group(job_name: str, attempt: int, epoch: int) -> str:
    """The Spark job group that runs epoch ``epoch`` of job attempt ``attempt``: the name the
    driver gives Spark and the one the control plane shows beside a checkpoint's epoch."""
    return f"sparkpoint-{job_name}-a{attempt}-e{epoch}"


# ----------------------------------------------------------------------------- shared parts


class VertexModel(_Model):
    """One task of the graph; its parallelism is at most its max parallelism (Flink's rule)."""

    id: Name  # the uid of the chain head
    name: str  # the chained operators, "pv -> sink"
    parallelism: Parallelism
    operators: list[str]
    max_parallelism: Parallelism | None = None

    @model_validator(mode="after")
    def _within_max_parallelism(self) -> VertexModel:
        if self.max_parallelism is not None and self.parallelism > self.max_parallelism:
            raise ValueError(
                f"parallelism {self.parallelism} of {self.id} is above its max parallelism "
                f"{self.max_parallelism}"
            )
        return self


class GuaranteeModel(_Model):
    """A job's end-to-end delivery guarantee (``sparkpoint.guarantees``) and, unless it is
    plain exactly-once, why it is weaker or what it assumes."""

    level: Literal["exactly_once", "at_least_once", "at_most_once"]
    reason: Text | None = None


# ----------------------------------------------------------------------------- events


class JobRegistered(_Model):
    type: Literal["job_registered"] = "job_registered"
    job_name: Name
    vertices: list[VertexModel]
    edges: list[tuple[str, str]]
    config: Annotated[dict[str, Any], AfterValidator(_check_config)]
    # A nonce per driver process: a registration with a new one is a restarted driver (the
    # control plane fails the job over), the same one again is a duplicate (ignored).
    incarnation: Nonce | None = None
    # This driver sends ``driver_heartbeat`` every this many ms for as long as its process
    # lives; None: an older driver that sends none (the control plane does not watch it).
    heartbeat_interval_ms: int | None = Field(default=None, ge=1, le=MAX_DURATION_MS)
    # Why the previous driver process of this job ended, when ``sparkpoint run`` restarted it
    # (one line): the control plane records it as the cause of the failover.
    previous_failure: Text | None = None
    # What the job's sources and sinks guarantee end to end; None: an older driver that does
    # not say (the API shows it as unknown).
    guarantee: GuaranteeModel | None = None
    # This driver runs each attempt's first epoch as soon as the attempt starts (with no
    # record when the sources have none) and ends it with a ``heartbeat``: until then the
    # control plane triggers no periodic checkpoint of the attempt, whose barrier would wait
    # out Spark's start-up (Flink triggers once all tasks run). False: an older driver.
    first_epoch_heartbeat: bool = False

    @model_validator(mode="after")
    def _bounded_graph(self) -> JobRegistered:
        if len(self.vertices) > MAX_VERTICES:
            raise ValueError(
                f"the job graph has {len(self.vertices)} vertices; at most {MAX_VERTICES}"
            )
        subtasks = sum(v.parallelism for v in self.vertices)
        if subtasks > MAX_SUBTASKS:
            raise ValueError(
                f"the job graph has {subtasks} subtasks (the sum of its vertices' parallelism); "
                f"at most {MAX_SUBTASKS}"
            )
        return self


class JobStatusChanged(_Model):
    """A job status transition. RUNNING also says which Spark application runs the job's
    epochs (a restarted driver is a new application); the UI address is None when the Spark
    UI is off (``spark.ui.enabled=false``)."""

    type: Literal["job_status"] = "job_status"
    status: JobStatus
    previous: JobStatus | None = None
    cause: Text | None = None
    spark_ui_url: str | None = None
    spark_application_id: Name | None = None


class CheckpointTriggered(_Model):
    type: Literal["checkpoint_triggered"] = "checkpoint_triggered"
    checkpoint_id: CheckpointId
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    trigger_timestamp: Long
    epoch: Epoch
    is_final: bool = False


class BarrierInjected(_Model):
    type: Literal["barrier_injected"] = "barrier_injected"
    checkpoint_id: CheckpointId
    operator_id: Name
    subtask: Index
    epoch: Epoch
    split_id: str
    offset: Size
    timestamp: Long


class BarrierReceived(_Model):
    type: Literal["barrier_received"] = "barrier_received"
    checkpoint_id: CheckpointId
    operator_id: Name
    subtask: Index
    channel: Index
    timestamp: Long


class AlignmentCompleted(_Model):
    type: Literal["alignment_completed"] = "alignment_completed"
    checkpoint_id: CheckpointId
    operator_id: Name
    subtask: Index
    duration_ms: float = Field(ge=0)
    buffered_bytes: Size
    buffered_records: Size


class SnapshotCompleted(_Model):
    """A subtask's acknowledgement of a checkpoint, with its handles and timings."""

    type: Literal["snapshot_completed"] = "snapshot_completed"
    checkpoint_id: CheckpointId
    operator_id: Name
    subtask: Index
    epoch: Epoch
    ack_timestamp: Long
    start_delay_ms: float = Field(ge=0)
    alignment_duration_ms: float = Field(ge=0)
    alignment_buffered_bytes: Size
    sync_duration_ms: float = Field(ge=0)
    async_duration_ms: float = Field(ge=0)
    state_size: Size
    checkpointed_size: Size
    handles: list[StateHandleModel] = []
    source_positions: dict[str, Long] = {}
    sink_transactions: list[SinkTransactionModel] = []
    operator_state: list[OperatorStateModel] = []
    clock_flagged: bool = False  # a negative duration was clamped to 0
    # What the barrier events of this subtask say, so that a connected driver sends the
    # acknowledgement alone (``barrier_injected``, ``barrier_received`` and
    # ``alignment_completed`` of a subtask that acknowledged in the same epoch stay out of the
    # control plane's stream): when the subtask injected (a source) or first received the
    # barrier (wall ms), and how many records its alignment held back. None from older jobs.
    barrier_timestamp: Long | None = None
    alignment_buffered_records: Size | None = None


class CheckpointDeclined(_Model):
    type: Literal["checkpoint_declined"] = "checkpoint_declined"
    checkpoint_id: CheckpointId
    operator_id: Name
    subtask: Index
    reason: Text
    #: The snapshot was taken but its asynchronous part (writing it to the checkpoint
    #: storage) failed: Flink's ``CHECKPOINT_ASYNC_EXCEPTION``, not a refusal of the subtask.
    asynchronous: bool = False


class CheckpointCompleted(_Model):
    type: Literal["checkpoint_completed"] = "checkpoint_completed"
    checkpoint_id: CheckpointId
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    external_path: str | None
    trigger_timestamp: Long
    completion_timestamp: Long
    end_to_end_duration_ms: float = Field(ge=0)
    state_size: Size


class CheckpointAborted(_Model):
    type: Literal["checkpoint_aborted"] = "checkpoint_aborted"
    checkpoint_id: CheckpointId
    reason: Text


class SinkPreCommitted(_Model):
    type: Literal["sink_pre_committed"] = "sink_pre_committed"
    checkpoint_id: CheckpointId
    operator_id: Name
    subtask: Index
    transaction: SinkTransactionModel


class SinkCommitted(_Model):
    type: Literal["sink_committed"] = "sink_committed"
    checkpoint_id: CheckpointId
    operator_id: Name
    subtask: Index
    transaction_id: str
    parts: Size


class TaskFailed(_Model):
    type: Literal["task_failed"] = "task_failed"
    epoch: Epoch
    cause: Text
    operator_id: Name | None = None
    subtask: Index | None = None
    region: Name | None = None  # the failover region restarted; None: the whole job
    region_vertices: list[Name] | None = None  # its vertices
    # False: a restart would replay the failure unchanged (a task's configuration error); the
    # job fails without asking its restart strategy (Flink's SuppressRestartsException).
    recoverable: bool = True


class JobRestored(_Model):
    type: Literal["job_restored"] = "job_restored"
    checkpoint_id: CheckpointId | None  # None: restarted from the beginning (no checkpoint yet)
    external_path: str | None = None
    committed_transactions: Size = 0
    aborted_parts: Size = 0


class EndOfInput(_Model):
    """The sources are exhausted: the job asks the authority for its final checkpoint."""

    type: Literal["end_of_input"] = "end_of_input"
    epoch: Epoch


EventPayload = (
    JobRegistered
    | JobStatusChanged
    | CheckpointTriggered
    | BarrierInjected
    | BarrierReceived
    | AlignmentCompleted
    | SnapshotCompleted
    | CheckpointDeclined
    | CheckpointCompleted
    | CheckpointAborted
    | SinkPreCommitted
    | SinkCommitted
    | TaskFailed
    | JobRestored
    | EndOfInput
    | Heartbeat
    | DriverHeartbeat
)

# ----------------------------------------------------------------------------- commands


class TriggerCheckpoint(_Model):
    type: Literal["trigger_checkpoint"] = "trigger_checkpoint"
    checkpoint_id: CheckpointId
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    trigger_timestamp: Long
    target_directory: str | None = None
    is_final: bool = False


class NotifyCheckpointComplete(_Model):
    type: Literal["checkpoint_complete"] = "checkpoint_complete"
    checkpoint_id: CheckpointId


class NotifyCheckpointAborted(_Model):
    type: Literal["checkpoint_abort"] = "checkpoint_abort"
    checkpoint_id: CheckpointId
    reason: Text


class RestoreJob(_Model):
    """Start the given attempt from a checkpoint (``external_path`` is its ``_metadata``'s
    directory; with inline storage the acknowledgements travel in ``acks``), or from the
    beginning when both are None. The first command a connected driver obeys. ``cause``: why
    the job restarts (the failure, or a user's request), which the driver's console shows."""

    type: Literal["restore"] = "restore"
    checkpoint_id: CheckpointId | None = None
    savepoint_path: str | None = None
    external_path: str | None = None
    acks: list[SnapshotCompleted] | None = None
    new_attempt: int = Field(ge=1, le=MAX_INT)
    request_id: str | None = None
    cause: Text | None = None


class CancelJob(_Model):
    """Stop the job: ``CANCELED`` on a user's request, ``FAILED`` when the restart strategy
    allows no more restarts, or the status the job had ended with when a restarted driver
    registers after its end (``cause`` says why)."""

    type: Literal["cancel"] = "cancel"
    status: JobStatus = JobStatus.CANCELED
    cause: Text | None = None


class StopWithSavepoint(_Model):
    """Trigger savepoint ``checkpoint_id``; once it completed and its sinks committed, the job
    stops as ``FINISHED``."""

    type: Literal["stop_with_savepoint"] = "stop_with_savepoint"
    checkpoint_id: CheckpointId
    trigger_timestamp: Long
    target_directory: str | None = None


class ConfigurationChanged(_Model):
    type: Literal["configuration_changed"] = "configuration_changed"
    changes: dict[str, Any]


CommandPayload = (
    TriggerCheckpoint
    | NotifyCheckpointComplete
    | NotifyCheckpointAborted
    | RestoreJob
    | CancelJob
    | StopWithSavepoint
    | ConfigurationChanged
)

PAYLOAD_TYPES: dict[str, type[_Model]] = {
    cls.model_fields["type"].default: cls
    for cls in (*EventPayload.__args__, *CommandPayload.__args__)
}


# ----------------------------------------------------------------------------- envelope


class Envelope(_Model):
    """One message on a stream."""

    v: int = SCHEMA_VERSION
    type: str
    job_id: Annotated[str, AfterValidator(check_job_id)]
    attempt: int = Field(ge=0, le=MAX_INT)
    timestamp: Long
    payload: dict[str, Any]
    # Authentication (``sparkpoint.signing``): the writing process, its sequence number and the
    # HMAC-SHA256 of the rest with the job's key. None only in unsigned (older, test) messages.
    sender: Nonce | None = None
    seq: int | None = Field(default=None, ge=1, le=MAX_LONG)
    sig: str | None = Field(default=None, max_length=64)

    def decoded(self) -> _Model:
        """The payload validated against the model of this message's type."""
        model = PAYLOAD_TYPES.get(self.type)
        if model is None:
            raise ProtocolError(f"unknown message type {self.type!r} (job {self.job_id})")
        try:
            return model.model_validate({**self.payload, "type": self.type})
        except ValidationError as err:
            raise ProtocolError(
                f"invalid {self.type} payload for job {self.job_id}: {_first_error(err)}"
            ) from err


def envelope(job_id: str, attempt: int, timestamp: int, payload: _Model) -> Envelope:
    """Wrap a payload model into an envelope."""
    data = payload.model_dump(mode="json")
    kind = data.pop("type")
    return Envelope(type=kind, job_id=job_id, attempt=attempt, timestamp=timestamp, payload=data)


def encode(message: Envelope, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> bytes:
    """Serialize a message, refusing one above the size limit."""
    raw = message.model_dump_json().encode()
    if len(raw) > max_bytes:
        raise ProtocolError(
            f"{message.type} message of job {message.job_id} is {len(raw)} bytes, "
            f"above the {max_bytes}-byte limit"
        )
    return raw


def decode(
    raw: bytes | str | dict[str, Any], max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> tuple[Envelope, _Model]:
    """Parse and validate a message; raises :class:`ProtocolError`, never anything else.

    An encoded message above ``max_bytes`` is refused before it is parsed: a writer that
    bypassed :func:`encode` cannot make the reader apply (or hold) more than the limit.
    """
    if not isinstance(raw, dict):
        size = len(raw.encode()) if isinstance(raw, str) else len(raw)
        if size > max_bytes:
            raise ProtocolError(f"message of {size} bytes is above the {max_bytes}-byte limit")
    try:
        if isinstance(raw, dict):
            env = Envelope.model_validate(raw)
        else:  # pydantic-core parses and validates in one pass
            env = Envelope.model_validate_json(raw)
    except (ValueError, TypeError) as err:
        detail = _first_error(err) if isinstance(err, ValidationError) else str(err)
        if isinstance(err, ValidationError) and err.errors()[0]["type"] == "json_invalid":
            detail = f"invalid JSON ({err.errors()[0]['msg'].removeprefix('Invalid JSON: ')})"
        raise ProtocolError(f"malformed message: {detail}") from err
    if env.v > SCHEMA_VERSION:
        raise ProtocolError(f"schema version {env.v} is newer than {SCHEMA_VERSION}")
    return env, env.decoded()


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "message"
    return f"{where}: {first['msg'].removeprefix('Value error, ')}"
