"""Writes of the control plane: one :class:`BatchWriter` per database transaction.

The ingest applies a whole batch of events in one transaction. Row-per-event work is collected
and written at :meth:`BatchWriter.flush` with one multi-row statement per table: subtask rows
are upserts that keep what an earlier event already set (``COALESCE``), heartbeats and
exceptions are inserts that ignore a duplicate key. This is what makes a redelivered event
change nothing and keeps the ingest at tens of thousands of events per second.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from sparkpoint_server.storage.models import (
    Checkpoint,
    CheckpointSubtask,
    Heartbeat,
    Job,
    JobException,
    JobStatusChange,
    Operation,
)

SUBTASK_FIELDS = (
    "attempt",
    "barrier_timestamp",
    "alignment_duration",
    "alignment_buffered",
    "alignment_buffered_records",
    "ack_timestamp",
    "start_delay",
    "sync_duration",
    "async_duration",
    "state_size",
    "checkpointed_size",
    "end_to_end_duration",
    "clock_flagged",
    "declined_reason",
    "ack",
)
SubtaskKey = tuple[str, int, str, int]  # job, checkpoint, operator, subtask


def _insert(session: Session, table: Any) -> Any:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


class BatchWriter:
    """Collects the row changes of one batch and writes them in a few statements."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._reset()

    def _reset(self) -> None:
        self._subtasks: dict[SubtaskKey, dict[str, Any]] = {}
        self._heartbeats: dict[tuple[str, int, int], dict[str, Any]] = {}
        self._exceptions: dict[str, dict[str, Any]] = {}
        self._checkpoints: dict[tuple[str, int], dict[str, Any]] = {}
        self._new_checkpoints: dict[tuple[str, int], dict[str, Any]] = {}
        self._jobs: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ collected rows

    def subtask(self, key: SubtaskKey, **fields: Any) -> None:
        """Set fields of a subtask row; the first value written for a field wins."""
        row = self._subtasks.setdefault(key, {})
        for name, value in fields.items():
            if value is not None and row.get(name) is None:
                row[name] = value

    def heartbeat(self, job_id: str, attempt: int, epoch: int, **fields: Any) -> None:
        self._heartbeats.setdefault((job_id, attempt, epoch), fields)

    def exception(self, dedupe_key: str, **fields: Any) -> bool:
        """Record a failure once per ``dedupe_key``; False when this batch already has it."""
        if dedupe_key in self._exceptions:
            return False
        self._exceptions[dedupe_key] = fields
        return True

    def new_checkpoint(self, job_id: str, checkpoint_id: int, **fields: Any) -> None:
        self._new_checkpoints[(job_id, checkpoint_id)] = fields

    def checkpoint(self, job_id: str, checkpoint_id: int, **fields: Any) -> None:
        """Update a checkpoint row (created in this batch or before); later values win."""
        key = (job_id, checkpoint_id)
        if key in self._new_checkpoints:
            self._new_checkpoints[key].update(fields)
        else:
            self._checkpoints.setdefault(key, {}).update(fields)

    # ------------------------------------------------------------------ immediate writes

    def job(self, job_id: str, **fields: Any) -> None:
        """Update a job row at flush; later values win."""
        self._jobs.setdefault(job_id, {}).update(fields)

    def insert_job(self, **fields: Any) -> None:
        self.session.execute(_insert(self.session, Job).values(**fields))
        self.session.flush()

    def status_change(self, **fields: Any) -> None:
        self.session.execute(_insert(self.session, JobStatusChange).values(**fields))

    def operation(self, request_id: str, **fields: Any) -> None:
        self.session.execute(
            update(Operation).where(Operation.request_id == request_id).values(**fields)
        )

    def insert_operation(self, **fields: Any) -> None:
        self.session.execute(_insert(self.session, Operation).values(**fields))

    def exception_exists(self, dedupe_key: str) -> bool:
        if dedupe_key in self._exceptions:
            return True
        stmt = select(func.count()).where(JobException.dedupe_key == dedupe_key)
        return bool(self.session.execute(stmt).scalar_one())

    # ------------------------------------------------------------------ flush

    def flush(self) -> None:
        """Write everything collected; the caller commits."""
        s = self.session
        for job_id, fields in self._jobs.items():
            s.execute(update(Job).where(Job.job_id == job_id).values(**fields))
        if self._new_checkpoints:
            rows = [
                {"job_id": j, "checkpoint_id": c, **f}
                for (j, c), f in self._new_checkpoints.items()
            ]
            s.execute(_insert(s, Checkpoint).on_conflict_do_nothing(), rows)
        for (job_id, cid), fields in self._checkpoints.items():
            s.execute(
                update(Checkpoint)
                .where(Checkpoint.job_id == job_id, Checkpoint.checkpoint_id == cid)
                .values(**fields)
            )
        if self._subtasks:
            self._flush_subtasks()
        if self._heartbeats:
            rows = [
                {"job_id": j, "attempt": a, "epoch": e, **f}
                for (j, a, e), f in self._heartbeats.items()
            ]
            s.execute(_insert(s, Heartbeat).on_conflict_do_nothing(), rows)
        if self._exceptions:
            rows = [{"dedupe_key": k, **f} for k, f in self._exceptions.items()]
            s.execute(_insert(s, JobException).on_conflict_do_nothing(), rows)
        self._reset()

    def _flush_subtasks(self) -> None:
        s = self.session
        rows = []
        for (job_id, cid, op, sub), fields in self._subtasks.items():
            row = {name: fields.get(name) for name in SUBTASK_FIELDS}
            row["clock_flagged"] = bool(row["clock_flagged"])
            rows.append(
                {"job_id": job_id, "checkpoint_id": cid, "operator_id": op, "subtask": sub, **row}
            )
        stmt = _insert(s, CheckpointSubtask)
        table = CheckpointSubtask.__table__
        keep_first = {
            name: func.coalesce(table.c[name], stmt.excluded[name])
            for name in SUBTASK_FIELDS
            if name not in ("clock_flagged", "attempt")
        }
        keep_first["clock_flagged"] = table.c.clock_flagged | stmt.excluded.clock_flagged
        stmt = stmt.on_conflict_do_update(
            index_elements=["job_id", "checkpoint_id", "operator_id", "subtask"],
            set_=keep_first,
        )
        s.execute(stmt, rows)
