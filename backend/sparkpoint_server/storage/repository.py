"""Writes of the control plane: one :class:`BatchWriter` per database transaction.

The ingest applies a whole batch of events in one transaction. Row-per-event work is collected
and written at :meth:`BatchWriter.flush` with one multi-row statement per table: subtask rows
are upserts that keep what an earlier event already set (``COALESCE``), heartbeats and
exceptions are inserts that ignore a duplicate key. This is what makes a redelivered event
change nothing and keeps the ingest at tens of thousands of events per second.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from typing import Any

import orjson
from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
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


JOBS: Table = Job.__table__  # type: ignore[assignment]
CHECKPOINTS: Table = Checkpoint.__table__  # type: ignore[assignment]
SUBTASKS: Table = CheckpointSubtask.__table__  # type: ignore[assignment]
HEARTBEATS: Table = Heartbeat.__table__  # type: ignore[assignment]
EXCEPTIONS: Table = JobException.__table__  # type: ignore[assignment]
STATUS_HISTORY: Table = JobStatusChange.__table__  # type: ignore[assignment]
OPERATIONS: Table = Operation.__table__  # type: ignore[assignment]


def _dialect_insert(dialect: str, table: Table) -> Any:
    """The dialect's INSERT (for ON CONFLICT) on a Core table: no ORM bulk machinery."""
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


# The statements of a flush are built once per dialect (or set of columns) and reused: they are
# immutable, and building them (``excluded``, a bound parameter per column) cost a millisecond
# per flush, a tenth of the ingest with small batches.


@cache
def _update_statement(table: Table, cols: tuple[str, ...], keys: tuple[str, ...]) -> Any:
    stmt = table.update().values({c: bindparam(c) for c in cols})
    for k in keys:
        stmt = stmt.where(table.c[k] == bindparam(f"k_{k}"))
    return stmt


@cache
def _insert_ignoring_duplicates(dialect: str, table: Table) -> Any:
    return _dialect_insert(dialect, table).on_conflict_do_nothing()


@cache
def _subtask_upsert(dialect: str) -> Any:
    """INSERT of subtask rows that keeps, on conflict, what an earlier event already set."""
    stmt = _dialect_insert(dialect, SUBTASKS)
    table = SUBTASKS
    keep_first = {
        name: func.coalesce(table.c[name], stmt.excluded[name])
        for name in SUBTASK_FIELDS
        if name not in ("clock_flagged", "attempt")
    }
    keep_first["clock_flagged"] = table.c.clock_flagged | stmt.excluded.clock_flagged
    return stmt.on_conflict_do_update(
        index_elements=["job_id", "checkpoint_id", "operator_id", "subtask"],
        set_=keep_first,
    )


@cache
def _compiled_subtask_upsert(dialect: Dialect) -> tuple[str, tuple[str, ...] | None]:
    """The upsert's SQL in the driver's parameter style and, for a positional style, the order
    of its parameters (None: by name)."""
    compiled = _subtask_upsert(dialect.name).compile(dialect=dialect)
    order = compiled.positiontup
    return compiled.string, tuple(order) if order is not None else None


def _upsert_subtasks(conn: Connection, rows: dict[SubtaskKey, dict[str, Any]]) -> None:
    """The subtask upsert as one executemany through the driver: the statement compiled once,
    the rows given as the driver takes them. Through SQLAlchemy's execution the rows' bound
    parameters were processed one by one, a third of a flush's time on SQLite; this also
    serializes ``ack`` (JSON) here, with orjson, as the engine's serializer does."""
    sql, order = _compiled_subtask_upsert(conn.dialect)
    params: list[Any] = []
    for (job_id, cid, op, sub), fields in rows.items():
        row = {name: fields.get(name) for name in SUBTASK_FIELDS}
        row["clock_flagged"] = bool(row["clock_flagged"])
        if row["ack"] is not None:
            row["ack"] = orjson.dumps(row["ack"]).decode()
        row.update(job_id=job_id, checkpoint_id=cid, operator_id=op, subtask=sub)
        params.append(tuple(row[name] for name in order) if order is not None else row)
    conn.exec_driver_sql(sql, params)


def _update_many(
    session: Session, table: Table, keys: tuple[str, ...], rows: list[dict[str, Any]]
) -> None:
    """UPDATE rows by primary key, one executemany per set of columns."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        cols = tuple(sorted(k for k in row if k not in keys))
        groups[cols].append(
            {**{k: v for k, v in row.items() if k not in keys}, **{f"k_{k}": row[k] for k in keys}}
        )
    for cols, params in groups.items():
        if not cols:
            continue
        session.connection().execute(_update_statement(table, cols, keys), params)


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
        self._operations: dict[str, dict[str, Any]] = {}

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
        self.session.connection().execute(JOBS.insert().values(**fields))

    def status_change(self, **fields: Any) -> None:
        self.session.connection().execute(STATUS_HISTORY.insert().values(**fields))

    def operation(self, request_id: str, **fields: Any) -> None:
        """Update an operation row at flush; later values win."""
        self._operations.setdefault(request_id, {}).update(fields)

    def insert_operation(self, **fields: Any) -> None:
        self.session.connection().execute(OPERATIONS.insert().values(**fields))

    def exception_exists(self, dedupe_key: str) -> bool:
        if dedupe_key in self._exceptions:
            return True
        stmt = select(func.count()).where(JobException.dedupe_key == dedupe_key)
        return bool(self.session.execute(stmt).scalar_one())

    # ------------------------------------------------------------------ flush

    def flush(self) -> None:
        """Write everything collected; the caller commits."""
        s = self.session
        conn = s.connection()
        dialect = s.get_bind().dialect.name
        if self._jobs:
            rows = [{"job_id": j, **f} for j, f in self._jobs.items()]
            _update_many(s, JOBS, ("job_id",), rows)
        if self._new_checkpoints:
            rows = [
                {"job_id": j, "checkpoint_id": c, **f}
                for (j, c), f in self._new_checkpoints.items()
            ]
            conn.execute(_insert_ignoring_duplicates(dialect, CHECKPOINTS), _complete_rows(rows))
        if self._checkpoints:
            rows = [
                {"job_id": j, "checkpoint_id": c, **f} for (j, c), f in self._checkpoints.items()
            ]
            _update_many(s, CHECKPOINTS, ("job_id", "checkpoint_id"), rows)
        if self._operations:
            rows = [{"request_id": r, **f} for r, f in self._operations.items()]
            _update_many(s, OPERATIONS, ("request_id",), rows)
        if self._subtasks:
            _upsert_subtasks(conn, self._subtasks)
        if self._heartbeats:
            rows = [
                {"job_id": j, "attempt": a, "epoch": e, **f}
                for (j, a, e), f in self._heartbeats.items()
            ]
            conn.execute(_insert_ignoring_duplicates(dialect, HEARTBEATS), rows)
        if self._exceptions:
            rows = [{"dedupe_key": k, **f} for k, f in self._exceptions.items()]
            conn.execute(_insert_ignoring_duplicates(dialect, EXCEPTIONS), _complete_rows(rows))
        self._reset()


def _complete_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row with the same keys (an executemany needs them), None where one lacks it."""
    keys = {k for row in rows for k in row}
    return [{k: row.get(k) for k in keys} for row in rows]
