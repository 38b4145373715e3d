"""The wire protocol between jobs and the control plane: versioned events and commands.

Every message is an :class:`Envelope` (schema version, type, job id, job attempt, timestamp)
whose ``payload`` is validated against the pydantic model registered for its ``type``. Both
sides import this one module. Readers ignore unknown fields; an unknown type or an invalid
payload raises :class:`ProtocolError` (the control plane routes those to a dead-letter stream).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sparkpoint.errors import SparkpointError

SCHEMA_VERSION = 1
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20  # one limit for every message, 1 MiB by default


class ProtocolError(SparkpointError):
    """A message that cannot be decoded, has an unknown type, or an invalid payload."""


class JobStatus(str, enum.Enum):
    """Flink's job statuses, with the same names in every part of the product."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    RESTARTING = "RESTARTING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"


class CheckpointStatus(str, enum.Enum):
    """Flink's checkpoint statuses."""

    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class CheckpointKind(str, enum.Enum):
    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class CheckpointingMode(str, enum.Enum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, use_enum_values=False)


def spark_job_group(job_name: str, attempt: int, epoch: int) -> str:
    """The Spark job group that runs epoch ``epoch`` of job attempt ``attempt``: the name the
    driver gives Spark and the one the control plane shows beside a checkpoint's epoch."""
    return f"sparkpoint-{job_name}-a{attempt}-e{epoch}"


# ----------------------------------------------------------------------------- shared parts


class StateHandleModel(_Model):
    """Where a piece of snapshot state lives: a path (or inline bytes), its size and checksum."""

    path: str | None = None
    inline: str | None = None  # base64, for jobmanager (inline) checkpoint storage
    size: int = Field(ge=0)
    checksum: str  # "sha256:<hex>"
    key_group_start: int | None = None
    key_group_end: int | None = None  # inclusive


class VertexModel(_Model):
    id: str  # the uid of the chain head
    name: str  # the chained operators, "pv -> sink"
    parallelism: int = Field(ge=1)
    operators: list[str]
    max_parallelism: int | None = None


class SinkTransactionModel(_Model):
    transaction_id: str
    parts: list[str]
    records: int = 0
    bytes: int = 0


# ----------------------------------------------------------------------------- events


class JobRegistered(_Model):
    type: Literal["job_registered"] = "job_registered"
    job_name: str
    vertices: list[VertexModel]
    edges: list[tuple[str, str]]
    config: dict[str, Any]
    # A nonce per driver process: a registration with a new one is a restarted driver (the
    # control plane fails the job over), the same one again is a duplicate (ignored).
    incarnation: str | None = None


class JobStatusChanged(_Model):
    """A job status transition. RUNNING also says which Spark application runs the job's
    epochs (a restarted driver is a new application); the UI address is None when the Spark
    UI is off (``spark.ui.enabled=false``)."""

    type: Literal["job_status"] = "job_status"
    status: JobStatus
    previous: JobStatus | None = None
    cause: str | None = None
    spark_ui_url: str | None = None
    spark_application_id: str | None = None


class CheckpointTriggered(_Model):
    type: Literal["checkpoint_triggered"] = "checkpoint_triggered"
    checkpoint_id: int = Field(ge=1)
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    trigger_timestamp: int
    epoch: int
    is_final: bool = False


class BarrierInjected(_Model):
    type: Literal["barrier_injected"] = "barrier_injected"
    checkpoint_id: int = Field(ge=1)
    operator_id: str
    subtask: int = Field(ge=0)
    epoch: int
    split_id: str
    offset: int = Field(ge=0)
    timestamp: int


class BarrierReceived(_Model):
    type: Literal["barrier_received"] = "barrier_received"
    checkpoint_id: int = Field(ge=1)
    operator_id: str
    subtask: int = Field(ge=0)
    channel: int = Field(ge=0)
    timestamp: int


class AlignmentCompleted(_Model):
    type: Literal["alignment_completed"] = "alignment_completed"
    checkpoint_id: int = Field(ge=1)
    operator_id: str
    subtask: int = Field(ge=0)
    duration_ms: float = Field(ge=0)
    buffered_bytes: int = Field(ge=0)
    buffered_records: int = Field(ge=0)


class SnapshotCompleted(_Model):
    """A subtask's acknowledgement of a checkpoint, with its handles and timings."""

    type: Literal["snapshot_completed"] = "snapshot_completed"
    checkpoint_id: int = Field(ge=1)
    operator_id: str
    subtask: int = Field(ge=0)
    epoch: int
    ack_timestamp: int
    start_delay_ms: float = Field(ge=0)
    alignment_duration_ms: float = Field(ge=0)
    alignment_buffered_bytes: int = Field(ge=0)
    sync_duration_ms: float = Field(ge=0)
    async_duration_ms: float = Field(ge=0)
    state_size: int = Field(ge=0)
    checkpointed_size: int = Field(ge=0)
    handles: list[StateHandleModel] = []
    source_positions: dict[str, int] = {}
    sink_transactions: list[SinkTransactionModel] = []
    clock_flagged: bool = False  # a negative duration was clamped to 0


class CheckpointDeclined(_Model):
    type: Literal["checkpoint_declined"] = "checkpoint_declined"
    checkpoint_id: int = Field(ge=1)
    operator_id: str
    subtask: int = Field(ge=0)
    reason: str


class CheckpointCompleted(_Model):
    type: Literal["checkpoint_completed"] = "checkpoint_completed"
    checkpoint_id: int = Field(ge=1)
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    external_path: str | None
    trigger_timestamp: int
    completion_timestamp: int
    end_to_end_duration_ms: float = Field(ge=0)
    state_size: int = Field(ge=0)


class CheckpointAborted(_Model):
    type: Literal["checkpoint_aborted"] = "checkpoint_aborted"
    checkpoint_id: int = Field(ge=1)
    reason: str


class SinkPreCommitted(_Model):
    type: Literal["sink_pre_committed"] = "sink_pre_committed"
    checkpoint_id: int = Field(ge=1)
    operator_id: str
    subtask: int = Field(ge=0)
    transaction: SinkTransactionModel


class SinkCommitted(_Model):
    type: Literal["sink_committed"] = "sink_committed"
    checkpoint_id: int = Field(ge=1)
    operator_id: str
    subtask: int = Field(ge=0)
    transaction_id: str
    parts: int = Field(ge=0)


class TaskFailed(_Model):
    type: Literal["task_failed"] = "task_failed"
    epoch: int
    cause: str
    operator_id: str | None = None
    subtask: int | None = None


class JobRestored(_Model):
    type: Literal["job_restored"] = "job_restored"
    checkpoint_id: int | None  # None: restarted from the beginning (no checkpoint yet)
    external_path: str | None = None
    committed_transactions: int = 0
    aborted_parts: int = 0


class EndOfInput(_Model):
    """The sources are exhausted: the job asks the authority for its final checkpoint."""

    type: Literal["end_of_input"] = "end_of_input"
    epoch: int


class Heartbeat(_Model):
    type: Literal["heartbeat"] = "heartbeat"
    epoch: int
    records: int = Field(ge=0)
    duration_ms: float = Field(ge=0)
    records_per_second: float = Field(ge=0)
    source_lag: int = Field(ge=0)
    host_time: int


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
)

# ----------------------------------------------------------------------------- commands


class TriggerCheckpoint(_Model):
    type: Literal["trigger_checkpoint"] = "trigger_checkpoint"
    checkpoint_id: int = Field(ge=1)
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    trigger_timestamp: int
    target_directory: str | None = None
    is_final: bool = False


class NotifyCheckpointComplete(_Model):
    type: Literal["checkpoint_complete"] = "checkpoint_complete"
    checkpoint_id: int = Field(ge=1)


class NotifyCheckpointAborted(_Model):
    type: Literal["checkpoint_abort"] = "checkpoint_abort"
    checkpoint_id: int = Field(ge=1)
    reason: str


class RestoreJob(_Model):
    """Start the given attempt from a checkpoint (``external_path`` is its ``_metadata``'s
    directory; with inline storage the acknowledgements travel in ``acks``), or from the
    beginning when both are None. The first command a connected driver obeys."""

    type: Literal["restore"] = "restore"
    checkpoint_id: int | None = None
    savepoint_path: str | None = None
    external_path: str | None = None
    acks: list[SnapshotCompleted] | None = None
    new_attempt: int = Field(ge=1)
    request_id: str | None = None


class CancelJob(_Model):
    """Stop the job: ``CANCELED`` on a user's request, ``FAILED`` when the restart strategy
    allows no more restarts (``cause`` says why)."""

    type: Literal["cancel"] = "cancel"
    status: JobStatus = JobStatus.CANCELED
    cause: str | None = None


class StopWithSavepoint(_Model):
    """Trigger savepoint ``checkpoint_id``; once it completed and its sinks committed, the job
    stops as ``FINISHED``."""

    type: Literal["stop_with_savepoint"] = "stop_with_savepoint"
    checkpoint_id: int = Field(ge=1)
    trigger_timestamp: int
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
    job_id: str
    attempt: int = Field(ge=0)
    timestamp: int
    payload: dict[str, Any]

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


def decode(raw: bytes | str | dict[str, Any]) -> tuple[Envelope, _Model]:
    """Parse and validate a message; raises :class:`ProtocolError`, never anything else."""
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
    return f"{where}: {first['msg']}"
