"""The REST API's answers as the OpenAPI document shows them: bodies and error statuses.

The routes build their answers as plain dicts (``storage/queries.py``); these models only
document them (``responses=`` of each route), so that a client, ``/docs`` and schemathesis
know every field, its type and whether it may be null. Nested objects that the queries shape
field by field (a job's vertices, a checkpoint's tasks) are documented by their route's
description; an operator's subtasks and their state handles have models of their own
(:class:`SubtaskEntry`). :func:`errors` documents the error statuses a route answers, each
with Flink's body ``{"errors": [...]}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sparkpoint.protocol import JobStatus

_ANSWER = ConfigDict(extra="allow", populate_by_name=True)

CheckpointStatus = Literal["IN_PROGRESS", "COMPLETED", "FAILED"]


class Errors(BaseModel):
    """Flink's error answer: one message per problem, naming the field or what failed."""

    errors: list[str] = Field(
        examples=[["checkpoint_id: Input should be greater than or equal to 1"]]
    )


#: Why each error status is answered; ``errors()`` documents them with the :class:`Errors` body.
ERROR_STATUSES: dict[int, str] = {
    400: 'Invalid input: one `"<field>: <what is wrong>"` per problem: a body, query or path '
    "parameter of the wrong type, out of its bounds, unknown or missing, or a combination of "
    "fields that is not allowed; also what only the server can check: a directory outside "
    "the storage roots (`SPARKPOINT_STORAGE_ROOTS`), a restart-strategy option that does not "
    "parse, a checkpoint configuration the coordinator refuses, a savepoint whose state does "
    "not fit the job. FastAPI's 422 is never answered for invalid input.",
    401: "The bearer token is missing, unknown, revoked or expired (`WWW-Authenticate: Bearer`).",
    403: "The bearer token is valid but its role is below the one the operation needs (the "
    "message names it).",
    404: "The job, checkpoint, operator or request is unknown, or the route does not exist.",
    409: "The job's status does not allow the request now (for example: it is not RUNNING, or "
    "a checkpoint to restore is still being written).",
    422: "The checkpoint or savepoint to restore exists, but its files fail their checksums or "
    "cannot be read as a checkpoint.",
    503: "The coordination service is not running in this process, its engine (the process "
    "that coordinates, beside the API's) died and is being started again, checkpoint storage "
    "did not answer within `SPARKPOINT_STORAGE_TIMEOUT`, or the control plane's database is "
    "unavailable (no connection, a full disk; `Retry-After` says when to try again).",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entries of a route that answers ``statuses`` with :class:`Errors`."""
    return {s: {"model": Errors, "description": ERROR_STATUSES[s]} for s in statuses}


def answer(model: Any, status: int = 200, description: str = "") -> dict[int | str, Any]:
    """The ``responses=`` entry of a route's successful answer: a model (or ``list[model]``)."""
    return {status: {"model": model, "description": description or model.__doc__ or ""}}


# ----------------------------------------------------------------------------- requests


class RequestAccepted(BaseModel):
    """The request is recorded; poll its status with `request-id`."""

    model_config = _ANSWER

    request_id: str = Field(alias="request-id")


class RestoreAccepted(RequestAccepted):
    """The restore is recorded; `warning` says what output will be produced again (or null)."""

    warning: str | None


class OperationState(BaseModel):
    id: Literal["IN_PROGRESS", "COMPLETED"]


class OperationStatus(BaseModel):
    """Flink's asynchronous-operation result: `operation` is null while IN_PROGRESS; then it
    has `location` and `checkpointId`, or, if the request failed, `failure-cause` (`class`,
    `stack-trace`) and `failed` is true."""

    model_config = _ANSWER

    status: OperationState
    operation: dict[str, Any] | None
    failed: bool


# ----------------------------------------------------------------------------- health


class IngestProgress(BaseModel):
    """How far the control plane has read the events its jobs send."""

    model_config = _ANSWER
    read_through: int | None = Field(
        alias="read-through",
        description="Every event that entered the events stream before this time (epoch ms) "
        "is applied; checkpoint deadlines and heartbeat timeouts wait for it. null: no read "
        "since the control plane started.",
    )
    behind_ms: int | None = Field(
        alias="behind-ms",
        description="Milliseconds since `read-through`: about the blocking read's 100 ms "
        "while the ingest keeps up, growing while it is behind. null with `read-through`.",
    )


class Health(BaseModel):
    """The control plane answers and its database answers `SELECT 1`."""

    status: Literal["ok"]
    ingest: IngestProgress | None = Field(
        default=None, description="Absent when the ingest's progress is not known."
    )


class Unhealthy(BaseModel):
    """The database does not answer; `errors` names the database error."""

    status: Literal["unavailable"]
    errors: list[str]


# ----------------------------------------------------------------------------- jobs


class LastCheckpoint(BaseModel):
    id: int
    status: CheckpointStatus
    timestamp: int | None


class Guarantee(BaseModel):
    """The job's end-to-end delivery guarantee, derived by its driver from its sources and
    sinks: a source that cannot be read again from a checkpoint makes it at-most-once, a sink
    without transactions (write-ahead log, plain writes) at-least-once, the ``at_least_once``
    checkpointing mode too; a resettable source into two-phase-commit or idempotent sinks is
    exactly-once."""

    level: Literal["exactly_once", "at_least_once", "at_most_once"]
    reason: str | None = Field(
        description="Why it is weaker than exactly-once (or what exactly-once relies on), "
        "naming the source or sink uids; null for exactly-once without caveat.",
        examples=[
            "sink 'audit' writes at once without replay protection: records replayed "
            "after a restore are written again"
        ],
    )


class JobOverview(BaseModel):
    model_config = _ANSWER

    id: str
    name: str
    status: JobStatus
    start_time: int = Field(alias="start-time")
    end_time: int = Field(alias="end-time", description="-1 while the job has not ended")
    duration: int
    attempt: int
    restarts: int
    last_checkpoint: LastCheckpoint | None = Field(alias="last-checkpoint")
    records_per_second: float | None = Field(alias="records-per-second")
    guarantee: Guarantee | None = Field(
        description="Its end-to-end guarantee; null when its driver did not report one."
    )


class JobList(BaseModel):
    """A page of the jobs, newest first, and how many there are in all."""

    jobs: list[JobOverview]
    total: int


class TaskCounts(BaseModel):
    """Flink's `tasks` of a job: how many of its subtasks are in each execution state (all in
    the one its job's status implies, as the route says), and `total`."""

    created: int
    scheduled: int
    deploying: int
    running: int
    finished: int
    canceling: int
    canceled: int
    failed: int
    reconciling: int
    initializing: int
    total: int = Field(description="The sum of the parallelism of the job's vertices")


class JobsOverviewEntry(BaseModel):
    """Flink's `JobDetails` of one job."""

    model_config = _ANSWER

    jid: str
    name: str
    state: JobStatus
    start_time: int = Field(alias="start-time")
    end_time: int = Field(alias="end-time", description="-1 while the job has not ended")
    duration: int = Field(description="ms since the start, until the end once it has ended")
    last_modification: int = Field(
        alias="last-modification",
        description="When the job's status last changed (its start if it never did)",
    )
    tasks: TaskCounts


class JobsOverview(BaseModel):
    """Flink's `MultipleJobsDetails`: every job, newest first."""

    jobs: list[JobsOverviewEntry]


class JobDetails(BaseModel):
    """Flink's job detail plus the status history, throughput, configuration and Spark."""

    model_config = _ANSWER

    jid: str
    name: str
    state: JobStatus
    start_time: int = Field(alias="start-time")
    end_time: int = Field(alias="end-time", description="-1 while the job has not ended")
    duration: int
    now: int
    attempt: int
    restarts: int
    vertices: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    timestamps: dict[str, int]
    status_history: list[dict[str, Any]] = Field(alias="status-history")
    throughput: dict[str, Any]
    config: dict[str, Any] | None
    spark: dict[str, Any]
    driver: dict[str, Any]
    guarantee: Guarantee | None = Field(
        description="Its end-to-end guarantee; null when its driver did not report one."
    )


class ThroughputSample(BaseModel):
    model_config = _ANSWER

    timestamp: int
    attempt: int
    epoch: int
    records: int | None
    records_per_second: float | None = Field(alias="records-per-second")
    source_lag: float | None = Field(
        alias="source-lag",
        description="Records the sources held and the job had not read; null while a split's "
        "source did not answer (its records cannot be counted)",
    )
    unanswered_splits: list[str] = Field(
        alias="unanswered-splits",
        description="The splits whose source (e.g. a Redis that is down) did not answer when "
        "the lag was counted",
    )
    duration: float | None


class ExceptionHistory(BaseModel):
    """Flink's `exceptionHistory`: `entries` newest first, `truncated` when older ones exist."""

    model_config = _ANSWER

    exception_history: dict[str, Any] = Field(alias="exceptionHistory")


# ----------------------------------------------------------------------------- checkpoints


class CheckpointStatistics(BaseModel):
    """Flink's checkpointing statistics."""

    counts: dict[str, int]
    summary: dict[str, Any]
    latest: dict[str, Any]
    history: list[dict[str, Any]]


class CheckpointDetails(BaseModel):
    """One checkpoint's history entry plus `tasks`: per operator, its acknowledgements."""

    model_config = _ANSWER

    id: int
    status: CheckpointStatus
    num_subtasks: int
    num_acknowledged_subtasks: int
    tasks: dict[str, Any]


class SharedFileEntry(BaseModel):
    """A file of the job's `shared/` directory that a native snapshot references."""

    path: str
    size: int


class StateHandleEntry(BaseModel):
    """Where a subtask's snapshot state lives (never its inline bytes)."""

    model_config = _ANSWER

    path: str | None = Field(description="null: the state is inline in the metadata")
    size: int
    checksum: str
    key_group_start: int | None
    key_group_end: int | None
    inline: bool
    format: str | None = Field(
        description="`rocksdb-native-v1` (a native, incremental snapshot: `path` is its "
        "manifest), `hashmap-columns-v1` (a hashmap checkpoint: its tables' columns), "
        "`sparkpoint-keyed-state-v1` (canonical: savepoints), or null (legacy key groups)"
    )
    shared_files: int = Field(
        description="How many files of the job's `shared/` directory the snapshot references "
        "(uploaded by this checkpoint or reused from an earlier one); 0 unless native"
    )
    shared_size: int = Field(description="The bytes of those shared files")
    shared: list[SharedFileEntry]


class SubtaskEntry(BaseModel):
    """Flink's `SubtaskCheckpointStatistics` of one subtask, with Sparkpoint's extras."""

    model_config = _ANSWER

    index: int
    status: Literal["completed", "pending_or_failed"]
    ack_timestamp: int | None
    end_to_end_duration: float | None
    state_size: int | None
    checkpointed_size: int | None
    checkpoint: dict[str, float | None] = Field(description="`sync` and `async` durations")
    alignment: dict[str, float | None] = Field(
        description="`buffered` bytes, `duration`; `processed` and `persisted` are 0"
    )
    start_delay: float | None
    unaligned_checkpoint: bool
    aborted: bool
    barrier_timestamp: int | None
    clock_flagged: bool
    declined_reason: str | None
    handles: list[StateHandleEntry]


class OperatorDetails(BaseModel):
    """One operator of one checkpoint: its task entry, a `summary` and `subtasks`."""

    model_config = _ANSWER

    id: str
    status: str
    num_subtasks: int
    num_acknowledged_subtasks: int
    summary: dict[str, Any]
    subtasks: list[SubtaskEntry]


class CheckpointConfigAnswer(BaseModel):
    """The checkpointing configuration; `changeable` lists what PATCH accepts."""

    model_config = _ANSWER

    mode: str
    interval: int
    timeout: int
    min_pause: int
    max_concurrent: int
    tolerable_failed_checkpoints: int
    retained: int
    state_backend: str | None
    incremental: bool = Field(
        False,
        description="Flink's execution.checkpointing.incremental: checkpoints upload "
        "only the state files the previous one did not (rocksdb)",
    )
    checkpoint_storage: str | None
    checkpoint_dir: str | None
    changeable: list[str]


class RestartStrategyAnswer(BaseModel):
    """The restart strategy's Flink options (`restart-strategy.*`) and a `description`."""

    model_config = ConfigDict(extra="allow")

    description: str
