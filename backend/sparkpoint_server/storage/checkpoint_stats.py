"""Checkpoint statistics read from the database, in the shapes of Flink's REST API.

The read side of Flink's ``CheckpointStatsTracker``: counts, percentile summaries, the latest
checkpoints, the history, and the per-operator and per-subtask details of one checkpoint.
Every function takes an open :class:`~sqlalchemy.orm.Session`, runs a few Core selects (no ORM
objects: ``GET /jobs/{id}/checkpoints`` must stay fast with 10,000 checkpoints stored) and
returns plain JSON-ready dicts. The percentile summary comes from
:mod:`sparkpoint_server.storage.checkpoint_summary`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, bindparam, exists, func, select
from sqlalchemy.orm import Session

from sparkpoint.protocol import spark_job_group
from sparkpoint_server.errors import CheckpointNotFoundError, JobNotFoundError
from sparkpoint_server.storage.checkpoint_summary import CheckpointSummaries, min_max_avg
from sparkpoint_server.storage.failover_target import failover_target, origin_of
from sparkpoint_server.storage.models import Checkpoint, CheckpointSubtask, Heartbeat, Job

C = Checkpoint.__table__.c
S = CheckpointSubtask.__table__.c
J = Job.__table__.c
H = Heartbeat.__table__.c

if TYPE_CHECKING:
    from typing_extensions import Unpack

    AnyRow = Row[Unpack[tuple[Any, ...]]]  # a row of any columns
COMPLETED, IN_PROGRESS, FAILED = "COMPLETED", "IN_PROGRESS", "FAILED"

#: The columns of one history entry, in the order :func:`_entry` reads them.
_ENTRY_COLUMNS = (
    C.checkpoint_id,
    C.status,
    C.kind,
    C.attempt,
    C.is_final,
    C.trigger_timestamp,
    C.latest_ack_timestamp,
    C.completion_timestamp,
    C.end_to_end_duration,
    C.state_size,
    C.checkpointed_size,
    C.alignment_buffered,
    C.num_subtasks,
    C.num_acknowledged_subtasks,
    C.external_path,
    C.failure_message,
    C.failure_reason,
    C.discarded,
    C.epoch,
    C.committed,
    C.commit_timestamp,
)


def _of_job(column: Any, status: str | None = None) -> Any:
    """A scalar subquery of ``column`` over the job's checkpoints (of one status)."""
    where = [C.job_id == bindparam("job_id")]
    if status is not None:
        where.append(C.status == status)
    return select(column).where(*where).scalar_subquery()


# Built once: only the parameters change from one request to the next.
_JOB_STATEMENT = select(
    J.name,
    J.restarts,
    J.restored_checkpoint_id,
    J.restored_at,
    J.restored_is_savepoint,
    J.restored_path,
    J.restored_state_ms,
    J.restored_first_record,
    # Whether an epoch of the current attempt (every restore starts one) has reported.
    exists().where(H.job_id == J.job_id, H.attempt == J.attempt).label("attempt_reported"),
).where(J.job_id == bindparam("job_id"))
_COUNTS_STATEMENT = select(
    _of_job(func.count(), COMPLETED).label("completed"),
    _of_job(func.count(), FAILED).label("failed"),
    _of_job(func.count(), IN_PROGRESS).label("in_progress"),
    _of_job(func.max(C.checkpoint_id), COMPLETED).label("newest_completed"),
    _of_job(func.max(C.checkpoint_id), FAILED).label("newest_failed"),
)
_HISTORY_STATEMENT = (
    select(*_ENTRY_COLUMNS)
    .where(C.job_id == bindparam("job_id"))
    .order_by(C.checkpoint_id.desc())
    .limit(bindparam("limit"))
)
_ENTRIES_STATEMENT = select(*_ENTRY_COLUMNS).where(
    C.job_id == bindparam("job_id"), C.checkpoint_id.in_(bindparam("ids", expanding=True))
)


# ----------------------------------------------------------------------------- GET checkpoints


def checkpoint_statistics(
    session: Session, job_id: str, limit: int, summaries: CheckpointSummaries | None = None
) -> dict[str, Any]:
    """Flink's checkpointing statistics of a job: ``counts``, ``summary``, ``latest``, ``history``.

    ``counts.restored`` is the number of times the job started a new attempt from a checkpoint
    (``jobs.restarts``: every failover, driver restart and restore request starts one).

    Steps: (1) the job, (2) the counts per status and the newest completed and failed ids
    (one statement, each part an index range), (3) the summary of the completed checkpoints
    (:class:`CheckpointSummaries` re-reads only what changed), (4) the history page (the
    primary key, backwards) plus the latest entries that are not on it.

    Args:
        session: an open session.
        job_id: the job.
        limit: how many history entries, newest first.
        summaries: the app's cache of summaries; without one, every completed row is read.

    Raises:
        JobNotFoundError: the job is unknown.
    """
    # Step 1
    params = {"job_id": job_id}
    job = session.execute(_JOB_STATEMENT, params).first()
    if job is None:
        raise JobNotFoundError(job_id)
    # Step 2
    counts = session.execute(_COUNTS_STATEMENT, params).one()
    # Step 3
    completed = (summaries or CheckpointSummaries(max_jobs=1)).get(
        session, job_id, counts.completed, counts.newest_completed
    )
    latest_completed, latest_savepoint = completed.latest_checkpoint, completed.latest_savepoint
    latest_failed = counts.newest_failed
    # Step 4
    history_rows = session.execute(_HISTORY_STATEMENT, {**params, "limit": limit}).all()
    by_id = {row[0]: row for row in history_rows}
    missing = {latest_completed, latest_savepoint, latest_failed} - set(by_id) - {None}
    if missing:
        rows = session.execute(_ENTRIES_STATEMENT, {**params, "ids": sorted(missing)}).all()
        by_id.update((row[0], row) for row in rows)

    def entry_of(checkpoint_id: int | None) -> dict[str, Any] | None:
        return None if checkpoint_id is None else _entry(by_id[checkpoint_id], job.name)

    failed = None
    if latest_failed is not None:
        row = by_id[latest_failed]
        failed = {
            **_entry(row, job.name),
            "failure_timestamp": row.completion_timestamp,
            "failure_message": row.failure_message,
        }
    restored = None
    if job.restored_at is not None:
        restored = {
            "id": job.restored_checkpoint_id,
            "restore_timestamp": job.restored_at,
            "is_savepoint": bool(job.restored_is_savepoint),
            "external_path": job.restored_path,
            # Beyond Flink's fields: how the restore went (None until the restored attempt's
            # first epoch ends): the slowest subtask's state restore and the first record.
            "state_restore_duration": job.restored_state_ms,
            "first_record_timestamp": job.restored_first_record,
            # Whether that first epoch has ended: then null timings mean it restored no keyed
            # state (a job without any, a restore from the beginning).
            "epoch_reported": bool(job.attempt_reported),
        }
    return {
        "counts": {
            "restored": job.restarts,
            "total": counts.completed + counts.failed + counts.in_progress,
            "in_progress": counts.in_progress,
            "completed": counts.completed,
            "failed": counts.failed,
        },
        "summary": completed.summary,
        "latest": {
            "completed": entry_of(latest_completed),
            "savepoint": entry_of(latest_savepoint),
            "failed": failed,
            "restored": restored,
            "failover": failover_target(session, job_id),
            "origin_of": origin_of(session, job_id),
        },
        "history": [_entry(row, job.name) for row in history_rows],
    }


def _entry(row: AnyRow, job_name: str) -> dict[str, Any]:
    """One history entry (Flink's ``CheckpointStatistics``) from a row of ``_ENTRY_COLUMNS``,
    plus Sparkpoint's ``epoch`` that carried the barrier and its ``spark-job-group`` (both
    None until a source injected the barrier), and whether (``committed``) and when
    (``commit_timestamp``) the job's sinks committed a completed checkpoint's output."""
    (
        checkpoint_id,
        status,
        kind,
        attempt,
        is_final,
        trigger_timestamp,
        latest_ack_timestamp,
        completion_timestamp,
        end_to_end_duration,
        state_size,
        checkpointed_size,
        alignment_buffered,
        num_subtasks,
        num_acknowledged_subtasks,
        external_path,
        failure_message,
        failure_reason,
        discarded,
        epoch,
        committed,
        commit_timestamp,
    ) = row
    is_savepoint = kind == "savepoint"
    return {
        "id": checkpoint_id,
        "status": status,
        "is_savepoint": is_savepoint,
        "checkpoint_type": "SAVEPOINT" if is_savepoint else "CHECKPOINT",
        "attempt": attempt,
        "is_final": bool(is_final),
        "trigger_timestamp": trigger_timestamp,
        "latest_ack_timestamp": latest_ack_timestamp,
        "end_to_end_duration": end_to_end_duration,
        "state_size": state_size,
        "checkpointed_size": checkpointed_size,
        "alignment_buffered": alignment_buffered,
        "num_subtasks": num_subtasks,
        "num_acknowledged_subtasks": num_acknowledged_subtasks,
        "external_path": external_path,
        "failure_message": failure_message,
        "failure_reason": failure_reason,
        # Flink's FailedCheckpointStatistics field: when it failed (null unless FAILED).
        "failure_timestamp": completion_timestamp if status == FAILED else None,
        "discarded": bool(discarded),
        "epoch": epoch,
        "spark-job-group": None if epoch is None else spark_job_group(job_name, attempt, epoch),
        "committed": status == COMPLETED and bool(committed),
        "commit_timestamp": commit_timestamp,
    }


# ----------------------------------------------------------------------------- one checkpoint


def checkpoint_details(session: Session, job_id: str, checkpoint_id: int) -> dict[str, Any]:
    """One checkpoint's history entry plus ``tasks``: its statistics per operator (vertex).

    Raises:
        JobNotFoundError: the job is unknown.
        CheckpointNotFoundError: the job has no such checkpoint.
    """
    job_name, vertices, row = _job_vertices_and_checkpoint(session, job_id, checkpoint_id)
    aggregates = {
        agg.operator_id: _TaskAggregate(
            acknowledged=agg.acknowledged,
            latest_ack=agg.latest_ack,
            state_size=int(agg.state_size or 0),
            checkpointed_size=int(agg.checkpointed_size or 0),
            end_to_end_duration=agg.end_to_end_duration,
            alignment_buffered=int(agg.alignment_buffered or 0),
            subtasks=agg.max_subtask + 1,
        )
        for agg in session.execute(
            select(
                S.operator_id,
                func.count(S.ack_timestamp).label("acknowledged"),
                func.max(S.ack_timestamp).label("latest_ack"),
                func.sum(S.state_size).label("state_size"),
                func.sum(S.checkpointed_size).label("checkpointed_size"),
                func.max(S.end_to_end_duration).label("end_to_end_duration"),
                func.sum(S.alignment_buffered).label("alignment_buffered"),
                func.max(S.subtask).label("max_subtask"),
            )
            .where(S.job_id == job_id, S.checkpoint_id == checkpoint_id)
            .group_by(S.operator_id)
        ).all()
    }
    operators = {v["id"]: v for v in vertices}
    for operator_id, agg in aggregates.items():  # operators no longer in the graph
        operators.setdefault(operator_id, _unknown_vertex(operator_id, agg.subtasks))
    tasks = {
        operator_id: _task_entry(vertex, row.status, aggregates.get(operator_id))
        for operator_id, vertex in operators.items()
    }
    return {**_entry(row, job_name), "tasks": tasks}


def subtask_details(
    session: Session, job_id: str, checkpoint_id: int, operator_id: str
) -> dict[str, Any]:
    """One operator's part of a checkpoint: its task entry, ``summary`` and ``subtasks``.

    Every subtask index of the operator's parallelism is listed; one without a row (its
    barrier has not arrived) is ``pending_or_failed``.

    Raises:
        JobNotFoundError: the job is unknown.
        CheckpointNotFoundError: the job has no such checkpoint, or the operator is unknown
            (the message lists the job's operators).
    """
    _, vertices, checkpoint = _job_vertices_and_checkpoint(session, job_id, checkpoint_id)
    rows = session.execute(
        select(
            S.subtask,
            S.ack_timestamp,
            S.end_to_end_duration,
            S.state_size,
            S.checkpointed_size,
            S.sync_duration,
            S.async_duration,
            S.alignment_buffered,
            S.alignment_duration,
            S.start_delay,
            S.barrier_timestamp,
            S.clock_flagged,
            S.declined_reason,
            S.ack,
        )
        .where(S.job_id == job_id, S.checkpoint_id == checkpoint_id, S.operator_id == operator_id)
        .order_by(S.subtask)
    ).all()
    vertex = next((v for v in vertices if v["id"] == operator_id), None)
    if vertex is None:
        if not rows:
            known = ", ".join(v["id"] for v in vertices) or "none"
            raise CheckpointNotFoundError(
                f"operator {operator_id} not found in job {job_id} "
                f"(checkpoint {checkpoint_id}); its operators: {known}"
            )
        vertex = _unknown_vertex(operator_id, rows[-1].subtask + 1)
    acked = [r for r in rows if r.ack_timestamp is not None]
    aggregate = _TaskAggregate(
        acknowledged=len(acked),
        latest_ack=max((r.ack_timestamp for r in acked), default=None),
        state_size=sum(r.state_size or 0 for r in rows),
        checkpointed_size=sum(r.checkpointed_size or 0 for r in rows),
        end_to_end_duration=max(
            (r.end_to_end_duration for r in rows if r.end_to_end_duration is not None),
            default=None,
        ),
        alignment_buffered=sum(r.alignment_buffered or 0 for r in rows),
        subtasks=len(rows),
    )
    by_index = {r.subtask: r for r in rows}
    parallelism = max([int(vertex.get("parallelism") or 0), *(i + 1 for i in by_index)])
    aborted = checkpoint.status == FAILED
    return {
        **_task_entry(vertex, checkpoint.status, aggregate),
        "summary": {
            "state_size": min_max_avg(r.state_size for r in acked),
            "checkpointed_size": min_max_avg(r.checkpointed_size for r in acked),
            "end_to_end_duration": min_max_avg(r.end_to_end_duration for r in acked),
            "checkpoint_duration": {
                "sync": min_max_avg(r.sync_duration for r in acked),
                "async": min_max_avg(r.async_duration for r in acked),
            },
            "alignment": {
                "buffered": min_max_avg(r.alignment_buffered for r in acked),
                "duration": min_max_avg(r.alignment_duration for r in acked),
            },
            "start_delay": min_max_avg(r.start_delay for r in acked),
        },
        "subtasks": [
            _subtask_entry(index, by_index.get(index), aborted) for index in range(parallelism)
        ],
    }


@dataclass(frozen=True)
class _TaskAggregate:
    """What one operator's subtask rows of a checkpoint add up to."""

    acknowledged: int
    latest_ack: int | None
    state_size: int
    checkpointed_size: int
    end_to_end_duration: float | None  # the slowest subtask's
    alignment_buffered: int
    subtasks: int  # rows seen (an upper bound of the parallelism when the graph lacks it)


def _job_vertices_and_checkpoint(
    session: Session, job_id: str, checkpoint_id: int
) -> tuple[str, list[dict[str, Any]], AnyRow]:
    """The job's name and vertices and the checkpoint's entry row."""
    job = session.execute(select(J.name, J.graph).where(J.job_id == job_id)).first()
    if job is None:
        raise JobNotFoundError(job_id)
    row = session.execute(
        select(*_ENTRY_COLUMNS).where(C.job_id == job_id, C.checkpoint_id == checkpoint_id)
    ).first()
    if row is None:
        raise CheckpointNotFoundError(f"checkpoint {checkpoint_id} of job {job_id} not found")
    return job.name, list((job.graph or {}).get("vertices") or []), row


def _unknown_vertex(operator_id: str, parallelism: int) -> dict[str, Any]:
    return {"id": operator_id, "name": operator_id, "parallelism": parallelism}


def _task_entry(
    vertex: dict[str, Any], checkpoint_status: str, agg: _TaskAggregate | None
) -> dict[str, Any]:
    """Flink's ``TaskCheckpointStatistics`` of one vertex from its subtasks' aggregate."""
    parallelism = int(vertex.get("parallelism") or 0)
    agg = agg or _TaskAggregate(0, None, 0, 0, None, 0, 0)
    return {
        "id": vertex["id"],
        "name": vertex.get("name", vertex["id"]),
        "status": COMPLETED if agg.acknowledged >= parallelism > 0 else checkpoint_status,
        "latest_ack_timestamp": agg.latest_ack,
        "state_size": agg.state_size,
        "checkpointed_size": agg.checkpointed_size,
        "end_to_end_duration": agg.end_to_end_duration,
        "alignment_buffered": agg.alignment_buffered,
        "num_subtasks": parallelism,
        "num_acknowledged_subtasks": agg.acknowledged,
    }


def _subtask_entry(index: int, row: AnyRow | None, aborted: bool) -> dict[str, Any]:
    """Flink's ``SubtaskCheckpointStatistics`` of one subtask, with Sparkpoint's extras."""
    acked = row is not None and row.ack_timestamp is not None
    ack: dict[str, Any] = (row.ack if row is not None else None) or {}
    return {
        "index": index,
        "status": "completed" if acked else "pending_or_failed",
        "ack_timestamp": row.ack_timestamp if row is not None else None,
        "end_to_end_duration": row.end_to_end_duration if row is not None else None,
        "state_size": row.state_size if row is not None else None,
        "checkpointed_size": row.checkpointed_size if row is not None else None,
        "checkpoint": {
            "sync": row.sync_duration if row is not None else None,
            "async": row.async_duration if row is not None else None,
        },
        "alignment": {
            "buffered": row.alignment_buffered if row is not None else None,
            "processed": 0,
            "persisted": 0,
            "duration": row.alignment_duration if row is not None else None,
        },
        "start_delay": row.start_delay if row is not None else None,
        "unaligned_checkpoint": False,
        "aborted": aborted,
        "barrier_timestamp": row.barrier_timestamp if row is not None else None,
        "clock_flagged": bool(row.clock_flagged) if row is not None else False,
        "declined_reason": row.declined_reason if row is not None else None,
        "handles": [_handle(h) for h in ack.get("handles") or []],
    }


def _handle(handle: dict[str, Any]) -> dict[str, Any]:
    """A state handle as stored in the acknowledgement, without its inline bytes: its format
    and, for a native (incremental) snapshot, the files of the job's ``shared/`` directory it
    references (how many, their bytes, each path and size)."""
    shared = [f for f in handle.get("shared") or [] if isinstance(f, dict)]
    return {
        "path": handle.get("path"),
        "size": handle.get("size"),
        "checksum": handle.get("checksum"),
        "key_group_start": handle.get("key_group_start"),
        "key_group_end": handle.get("key_group_end"),
        "inline": handle.get("inline") is not None,
        "format": handle.get("format"),
        "shared_files": len(shared),
        "shared_size": sum(int(f.get("size") or 0) for f in shared),
        "shared": [{"path": f.get("path"), "size": f.get("size")} for f in shared],
    }
