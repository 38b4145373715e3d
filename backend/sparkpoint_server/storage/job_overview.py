"""Flink's jobs overview (``GET /jobs/overview``): every job as Flink's ``JobDetails``.

Flink counts a job's tasks (one per subtask of each vertex) under each task's own execution
state. Sparkpoint does not track subtasks one by one: every subtask of every vertex takes part
in each epoch of the job's current attempt, so all of them are in the state that the job's
status implies (:data:`TASK_STATE`), and ``total`` is the sum of the vertices' parallelism.
``last-modification`` is the job's latest status transition (its start when none is recorded).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sparkpoint.protocol import JobStatus
from sparkpoint_server.storage.models import Job, JobStatusChange
from sparkpoint_server.storage.queries import NEWEST_FIRST, job_times

J = Job.__table__.c
T = JobStatusChange.__table__.c

#: Flink's execution states, as ``JobDetails`` names its task counts (lower case).
EXECUTION_STATES = (
    "created",
    "scheduled",
    "deploying",
    "running",
    "finished",
    "canceling",
    "canceled",
    "failed",
    "reconciling",
    "initializing",
)

#: The execution state of every subtask of a job in each status. Flink cancels the tasks of a
#: failing job and, while it restarts, holds them canceled until the next attempt starts; a
#: failed job's subtasks all count as failed, since which one failed first is not tracked.
TASK_STATE: dict[JobStatus, str] = {
    JobStatus.CREATED: "created",
    JobStatus.RUNNING: "running",
    JobStatus.FAILING: "canceling",
    JobStatus.RESTARTING: "canceled",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLING: "canceling",
    JobStatus.CANCELED: "canceled",
    JobStatus.FINISHED: "finished",
}


def jobs_overview(session: Session, now_ms: int) -> list[dict[str, Any]]:
    """Every job, newest first (the order of ``GET /jobs``), as Flink's ``JobDetails``:
    ``jid``, ``name``, ``state``, ``start-time``, ``end-time``, ``duration``,
    ``last-modification`` and ``tasks``."""
    last_transition = (
        select(func.max(T.timestamp))
        .where(T.job_id == J.job_id)
        .correlate(Job.__table__)
        .scalar_subquery()
    )
    rows = session.execute(
        select(
            J.job_id,
            J.name,
            J.status,
            J.start_time,
            J.end_time,
            J.graph,
            func.coalesce(last_transition, J.start_time).label("last_modification"),
        ).order_by(*NEWEST_FIRST)
    ).all()
    return [
        {
            "jid": row.job_id,
            "name": row.name,
            "state": row.status,
            **job_times(row.start_time, row.end_time, now_ms),
            "last-modification": row.last_modification,
            "tasks": task_counts(JobStatus(row.status), row.graph),
        }
        for row in rows
    ]


def task_counts(status: JobStatus, graph: dict[str, Any] | None) -> dict[str, int]:
    """Flink's ``tasks`` of a job in ``status``: how many subtasks are in each execution
    state, and ``total``: the sum of the parallelism of the vertices of ``graph``."""
    total = sum(v.get("parallelism") or 0 for v in (graph or {}).get("vertices") or [])
    counts = dict.fromkeys(EXECUTION_STATES, 0)
    counts[TASK_STATE[status]] = total
    return {**counts, "total": total}
