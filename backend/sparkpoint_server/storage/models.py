"""The control plane's tables (SQLAlchemy 2). The schema changes only through ``migrations/``.

Timestamps are integers, milliseconds since the epoch (as in Flink's REST API); durations are
floats in milliseconds; sizes are integers in bytes. Status columns hold Flink's names: job
``CREATED .. FINISHED``, checkpoint ``IN_PROGRESS | COMPLETED | FAILED``, operation
``IN_PROGRESS | COMPLETED | FAILED``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Job(Base):
    """A job known to the control plane, with the coordination state a restart must recover."""

    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    incarnation: Mapped[str | None] = mapped_column(String(64))  # the driver process's nonce
    # The Spark application of the current driver, as its RUNNING reported it (None until then).
    spark_application_id: Mapped[str | None] = mapped_column(String(200))
    spark_ui_url: Mapped[str | None] = mapped_column(Text)  # None too when the UI is off
    # Its executors and their hosts, as the latest heartbeat listed them (None: not reported).
    spark_executors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    start_time: Mapped[int] = mapped_column(BigInteger)
    end_time: Mapped[int | None] = mapped_column(BigInteger)
    graph: Mapped[dict[str, Any]] = mapped_column(JSON)  # {"vertices": [...], "edges": [...]}
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # as registered: storage, dirs...
    checkpoint_config: Mapped[dict[str, Any]] = mapped_column(JSON)  # current, mutable part
    restart_strategy: Mapped[dict[str, Any]] = mapped_column(JSON)  # Flink keys
    next_checkpoint_id: Mapped[int] = mapped_column(Integer, default=1)
    continuous_failures: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    # A restart decided but not yet sent (restart-strategy delay): recovered after a restart.
    restart_due_at: Mapped[int | None] = mapped_column(BigInteger)
    restart_cause: Mapped[str | None] = mapped_column(Text)
    restart_checkpoint_id: Mapped[int | None] = mapped_column(Integer)
    # Where its current line of checkpoints starts (coordination.job.Origin): the checkpoint
    # its --from-checkpoint or its latest restore request named. None: the beginning.
    origin_checkpoint_id: Mapped[int | None] = mapped_column(Integer)
    origin_path: Mapped[str | None] = mapped_column(Text)
    origin_next_id: Mapped[int | None] = mapped_column(Integer)
    # The latest restore (Flink's ``latest.restored``).
    restored_checkpoint_id: Mapped[int | None] = mapped_column(Integer)
    restored_at: Mapped[int | None] = mapped_column(BigInteger)
    restored_path: Mapped[str | None] = mapped_column(Text)
    restored_is_savepoint: Mapped[bool] = mapped_column(Boolean, default=False)
    # How the latest restore went, from the first epoch after it (None until that epoch's
    # heartbeat): the slowest keyed subtask's state restore (ms), and when the job's first
    # record after the restore was processed (unix ms, the executors' clock).
    restored_state_ms: Mapped[float | None] = mapped_column(Float)
    restored_first_record: Mapped[int | None] = mapped_column(BigInteger)
    # The latest heartbeat.
    records: Mapped[int] = mapped_column(BigInteger, default=0)
    records_per_second: Mapped[float] = mapped_column(Float, default=0.0)
    source_lag: Mapped[int] = mapped_column(BigInteger, default=0)
    # The splits whose source did not answer (source_lag leaves them out, so the lag is
    # unknown while there are any); None: a driver that does not report them.
    unanswered_splits: Mapped[list[str] | None] = mapped_column(JSON)
    # The bound (ms) the driver's planner held the latest epoch within so that checkpoints
    # complete within their timeout; None: not held back (or a driver that does not say).
    epoch_bound_ms: Mapped[float | None] = mapped_column(Float)
    last_heartbeat: Mapped[int | None] = mapped_column(BigInteger)
    # The driver's liveness (Flink's heartbeat.timeout): the interval its registration
    # announced (None: a driver that sends no ``driver_heartbeat``, not watched) and when the
    # last one arrived (the control plane's clock).
    heartbeat_interval: Mapped[int | None] = mapped_column(Integer)
    # Its driver ends each attempt's first epoch with a heartbeat: periodic checkpoints of
    # an attempt wait for one (``JobRuntime.tasks_running``).
    first_epoch_heartbeat: Mapped[bool] = mapped_column(Boolean, default=False)
    last_driver_heartbeat: Mapped[int | None] = mapped_column(BigInteger)
    # The end-to-end guarantee the latest registration reported (``exactly_once``,
    # ``at_least_once``, ``at_most_once``) and why when it is weaker; None: a driver that
    # does not report one.
    guarantee_level: Mapped[str | None] = mapped_column(String(16))
    guarantee_reason: Mapped[str | None] = mapped_column(Text)


class Checkpoint(Base):
    """One checkpoint or savepoint of a job: Flink's checkpoint statistics, one row each."""

    __tablename__ = "checkpoints"

    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    checkpoint_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    # The epoch that carried the barrier (its sources' barrier_injected); None until then.
    epoch: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # checkpoint | savepoint
    is_final: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16))
    trigger_timestamp: Mapped[int] = mapped_column(BigInteger)
    latest_ack_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    completion_timestamp: Mapped[int | None] = mapped_column(BigInteger)  # or failure time
    end_to_end_duration: Mapped[float | None] = mapped_column(Float)
    state_size: Mapped[int] = mapped_column(BigInteger, default=0)
    checkpointed_size: Mapped[int] = mapped_column(BigInteger, default=0)
    alignment_buffered: Mapped[int] = mapped_column(BigInteger, default=0)
    num_subtasks: Mapped[int] = mapped_column(Integer)
    num_acknowledged_subtasks: Mapped[int] = mapped_column(Integer, default=0)
    external_path: Mapped[str | None] = mapped_column(Text)
    target_directory: Mapped[str | None] = mapped_column(Text)
    failure_reason: Mapped[str | None] = mapped_column(String(64))
    failure_message: Mapped[str | None] = mapped_column(Text)
    discarded: Mapped[bool] = mapped_column(Boolean, default=False)  # its state is deleted
    committed: Mapped[bool] = mapped_column(Boolean, default=False)  # sinks committed it
    # When the job's sinks committed its transactions (the job's last sink_committed of it).
    commit_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    request_id: Mapped[str | None] = mapped_column(String(36))

    __table_args__ = (
        Index("ix_checkpoints_job_status", "job_id", "status"),
        Index("ix_checkpoints_job_trigger", "job_id", "trigger_timestamp"),
    )


class CheckpointSubtask(Base):
    """One subtask's part of a checkpoint: barrier, alignment, snapshot, acknowledgement."""

    __tablename__ = "checkpoint_subtasks"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    operator_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    subtask: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    barrier_timestamp: Mapped[int | None] = mapped_column(BigInteger)  # first barrier seen
    alignment_duration: Mapped[float | None] = mapped_column(Float)
    alignment_buffered: Mapped[int | None] = mapped_column(BigInteger)
    alignment_buffered_records: Mapped[int | None] = mapped_column(BigInteger)
    ack_timestamp: Mapped[int | None] = mapped_column(BigInteger)
    start_delay: Mapped[float | None] = mapped_column(Float)
    sync_duration: Mapped[float | None] = mapped_column(Float)
    async_duration: Mapped[float | None] = mapped_column(Float)
    state_size: Mapped[int | None] = mapped_column(BigInteger)
    checkpointed_size: Mapped[int | None] = mapped_column(BigInteger)
    end_to_end_duration: Mapped[float | None] = mapped_column(Float)
    clock_flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    declined_reason: Mapped[str | None] = mapped_column(Text)
    # The SnapshotCompleted payload. ``none_as_null``: a row written before its acknowledgement
    # (by a barrier event) holds SQL NULL, which the upsert's COALESCE then fills; JSON ``null``
    # would be kept over the acknowledgement.
    ack: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))

    # No foreign key to ``checkpoints``: rows are upserted in batches by the ingest and only
    # for checkpoints the coordinator knows; the primary key already leads with the checkpoint.


class JobStatusChange(Base):
    """A job status transition with its cause, in order."""

    __tablename__ = "job_status_history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.job_id", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    timestamp: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    previous: Mapped[str | None] = mapped_column(String(16))
    cause: Mapped[str | None] = mapped_column(Text)


class JobException(Base):
    """A failure (and what the restart strategy decided about it), Flink's exception history."""

    __tablename__ = "job_exceptions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.job_id", ondelete="CASCADE"), index=True
    )
    dedupe_key: Mapped[str] = mapped_column(String(200), unique=True)  # idempotency
    attempt: Mapped[int] = mapped_column(Integer)
    timestamp: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))  # TASK_FAILURE | CHECKPOINT_FAILURE | ...
    cause: Mapped[str] = mapped_column(Text)
    epoch: Mapped[int | None] = mapped_column(Integer)
    operator_id: Mapped[str | None] = mapped_column(String(200))
    subtask: Mapped[int | None] = mapped_column(Integer)
    action: Mapped[str | None] = mapped_column(Text)  # "restart in 1 s" | "no restart: ..."


class Operation(Base):
    """An asynchronous request (checkpoint, savepoint, restore, stop, cancel) and its outcome."""

    __tablename__ = "operations"

    request_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    job_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("jobs.job_id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16))  # checkpoint|savepoint|restore|stop|cancel
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    checkpoint_id: Mapped[int | None] = mapped_column(Integer)
    attempt: Mapped[int | None] = mapped_column(Integer)  # restore: the attempt it starts
    location: Mapped[str | None] = mapped_column(Text)
    failure_cause: Mapped[str | None] = mapped_column(Text)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)


class Heartbeat(Base):
    """Throughput and lag of one accepted epoch (the job overview's time series)."""

    __tablename__ = "heartbeats"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    timestamp: Mapped[int] = mapped_column(BigInteger, index=True)
    records: Mapped[int] = mapped_column(BigInteger)
    duration_ms: Mapped[float] = mapped_column(Float)
    records_per_second: Mapped[float] = mapped_column(Float)
    source_lag: Mapped[int] = mapped_column(BigInteger)
    unanswered_splits: Mapped[list[str] | None] = mapped_column(JSON)  # as Job's


class EventSender(Base):
    """The last event applied from one sender of a job (a driver process or its heartbeat
    thread, ``sparkpoint.signing``): a copy of an older event is refused as a replay, also
    after a restart of the control plane."""

    __tablename__ = "event_senders"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    sender: Mapped[str] = mapped_column(String(64), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    # The stream entry that carried it ("<ms>-<n>"): the same entry read again after a crash
    # is a redelivery (already applied), a later entry with an old seq a replay.
    last_entry_id: Mapped[str] = mapped_column(String(48))


class ApiToken(Base):
    """An API token of a role (``viewer``, ``operator``, ``admin``), stored as the SHA-256 of its
    secret: the secret itself is shown once, when the token is created, and never stored."""

    __tablename__ = "api_tokens"

    token_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    role: Mapped[str] = mapped_column(String(16))
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    created_by: Mapped[str] = mapped_column(String(200))  # "<name> (<token id>)" of the creator
    expires_at: Mapped[int | None] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)
    revoked_by: Mapped[str | None] = mapped_column(String(200))


class AuditEntry(Base):
    """One mutating call of the REST API, allowed or refused: who, what, when, the outcome."""

    __tablename__ = "audit_log"

    entry_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    timestamp: Mapped[int] = mapped_column(BigInteger)
    token_id: Mapped[str | None] = mapped_column(String(32))  # None: no or an unknown token
    token_name: Mapped[str] = mapped_column(String(100))  # or "anonymous", "invalid token"
    role: Mapped[str | None] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(500))
    job_id: Mapped[str | None] = mapped_column(String(64), index=True)
    request_body: Mapped[str | None] = mapped_column(Text)  # a bounded summary, secrets redacted
    status_code: Mapped[int] = mapped_column(Integer)
    request_id: Mapped[str | None] = mapped_column(String(36))  # the operation's, if one started
