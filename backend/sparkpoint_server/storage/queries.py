"""Read-side queries of the REST API: jobs, throughput, failures, requests, metrics.

Each function takes an open :class:`~sqlalchemy.orm.Session`, runs Core selects and returns
plain JSON-ready dicts in the shapes of Flink's REST API (field names included). Checkpoint
statistics live in :mod:`sparkpoint_server.storage.checkpoint_stats`, a job's checkpointing
configuration and restart strategy in :mod:`sparkpoint_server.storage.job_settings`. Nothing
here writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from sparkpoint.protocol import JobStatus
from sparkpoint_server.errors import CheckpointNotFoundError, JobNotFoundError, RequestNotFoundError
from sparkpoint_server.storage.models import (
    Checkpoint,
    Heartbeat,
    Job,
    JobException,
    JobStatusChange,
    Operation,
)

C = Checkpoint.__table__.c
J = Job.__table__.c
H = Heartbeat.__table__.c
E = JobException.__table__.c
T = JobStatusChange.__table__.c
O = Operation.__table__.c  # noqa: E741 - the operations table, as C/J/H/E/T
# A second reference to the checkpoints table, for "the newest checkpoint of each job". Built
# once: an alias copies every column of the table, and building it per request left a few
# thousand objects in reference cycles for the garbage collector on every GET /jobs.
NEWEST = Checkpoint.__table__.alias("newest").c

COMPLETED = "COMPLETED"
#: The order of every job listing: the newest start first, then by id (a stable page).
NEWEST_FIRST = (J.start_time.desc(), J.job_id)
STATUS_HISTORY_LIMIT = 1000  # the newest transitions a job's detail lists


def ping(session: Session) -> None:
    """Run ``SELECT 1``; raises the driver's error when the database is unreachable."""
    session.execute(text("SELECT 1")).scalar_one()


def require_job(session: Session, job_id: str) -> None:
    """Raise :class:`JobNotFoundError` unless the job is known."""
    if session.execute(select(J.job_id).where(J.job_id == job_id)).first() is None:
        raise JobNotFoundError(job_id)


# ----------------------------------------------------------------------------- jobs


def list_jobs(
    session: Session, now_ms: int, *, limit: int | None = None, offset: int = 0
) -> tuple[list[dict[str, Any]], int]:
    """A page of the jobs (``limit`` after ``offset``; None: all), newest first, each with its
    newest finished (completed or failed) checkpoint (``last-checkpoint``: its outcome and
    when it finished) or ``None``; and how many jobs there are in all."""
    total = session.execute(select(func.count()).select_from(Job.__table__)).scalar_one()
    newest_id = (
        select(func.max(NEWEST.checkpoint_id))
        .where((NEWEST.job_id == J.job_id) & (NEWEST.status != "IN_PROGRESS"))
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
            J.attempt,
            J.restarts,
            J.records_per_second,
            J.guarantee_level,
            J.guarantee_reason,
            C.checkpoint_id,
            C.status.label("checkpoint_status"),
            C.trigger_timestamp,
            C.completion_timestamp,
        )
        .select_from(Job.__table__)
        .outerjoin(Checkpoint, (C.job_id == J.job_id) & (C.checkpoint_id == newest_id))
        .order_by(*NEWEST_FIRST)
        .limit(limit)
        .offset(offset)
    ).all()
    page = [
        {
            "id": row.job_id,
            "name": row.name,
            "status": row.status,
            **job_times(row.start_time, row.end_time, now_ms),
            "attempt": row.attempt,
            "restarts": row.restarts,
            "last-checkpoint": None
            if row.checkpoint_id is None
            else {
                "id": row.checkpoint_id,
                "status": row.checkpoint_status,
                "timestamp": row.completion_timestamp or row.trigger_timestamp,
            },
            "records-per-second": row.records_per_second,
            "guarantee": _guarantee(row.guarantee_level, row.guarantee_reason),
        }
        for row in rows
    ]
    return page, total


def job_details(session: Session, job_id: str, now_ms: int) -> dict[str, Any]:
    """A job as Flink's ``GET /jobs/:jobid`` shows it, with Sparkpoint's throughput and history.

    ``timestamps`` maps each of Flink's eight statuses to the first time the job entered it
    (0: never); ``status-history`` lists the newest :data:`STATUS_HISTORY_LIMIT` transitions,
    oldest first. ``spark`` names the Spark application of the job's current driver (its UI
    address and application id, None until the driver reported RUNNING; the UI address also
    when the Spark UI is off).

    Raises:
        JobNotFoundError: the job is unknown.
    """
    job = session.execute(select(Job.__table__).where(J.job_id == job_id)).first()
    if job is None:
        raise JobNotFoundError(job_id)
    first_entered = dict(
        session.execute(
            select(T.status, func.min(T.timestamp)).where(T.job_id == job_id).group_by(T.status)
        ).all()
    )
    transitions = session.execute(
        select(T.timestamp, T.status, T.previous, T.cause, T.attempt)
        .where(T.job_id == job_id)
        .order_by(T.timestamp.desc(), T.id.desc())
        .limit(STATUS_HISTORY_LIMIT)
    ).all()
    # Records read since the job started, over every attempt (a replay after a restore counts
    # again, as Flink's numRecordsIn does): the sum of the per-epoch heartbeats.
    records = int(  # PostgreSQL's SUM of a bigint is a numeric
        session.execute(
            select(func.coalesce(func.sum(H.records), 0)).where(H.job_id == job_id)
        ).scalar_one()
    )
    graph = job.graph or {}
    max_parallelism = (job.config or {}).get("max_parallelism")
    return {
        "jid": job.job_id,
        "name": job.name,
        "state": job.status,
        **job_times(job.start_time, job.end_time, now_ms),
        "now": now_ms,
        "attempt": job.attempt,
        "restarts": job.restarts,
        "vertices": [
            {
                "id": v["id"],
                "name": v.get("name", v["id"]),
                "parallelism": v.get("parallelism"),
                "maxParallelism": v.get("max_parallelism") or max_parallelism,
                "operators": v.get("operators", []),
            }
            for v in graph.get("vertices") or []
        ],
        "edges": [{"source": src, "target": dst} for src, dst in graph.get("edges") or []],
        "timestamps": {s.value: first_entered.get(s.value, 0) for s in JobStatus},
        "status-history": [
            {
                "timestamp": t.timestamp,
                "status": t.status,
                "previous": t.previous,
                "cause": t.cause,
                "attempt": t.attempt,
            }
            for t in reversed(transitions)
        ],
        "throughput": {
            "records": records,
            "records-per-second": job.records_per_second,
            **_lag(job.source_lag, job.unanswered_splits),
            "epoch-bound": job.epoch_bound_ms,
            "last-heartbeat": job.last_heartbeat,
        },
        "config": job.config,
        "spark": {
            "ui-url": job.spark_ui_url,
            "application-id": job.spark_application_id,
            "executors": _executors(job.spark_executors),
        },
        # The driver's liveness (null: a driver that sends no heartbeats, not watched).
        "driver": {
            "heartbeat-interval": job.heartbeat_interval,
            "last-heartbeat": job.last_driver_heartbeat,
            "first-epoch-ended": _first_epoch_ended(session, job),
        },
        "guarantee": _guarantee(job.guarantee_level, job.guarantee_reason),
    }


def _first_epoch_ended(session: Session, job: Any) -> bool | None:
    """Whether the current attempt's first epoch ended: its periodic checkpoints wait for it
    (``JobRuntime.tasks_running``). None: a driver that does not say it reports that epoch."""
    if not job.first_epoch_heartbeat:
        return None
    ended = select(H.epoch).where(H.job_id == job.job_id, H.attempt == job.attempt).limit(1)
    return session.execute(ended).first() is not None


def job_times(start: int, end: int | None, now_ms: int) -> dict[str, int]:
    """A job's ``start-time``, ``end-time`` (-1 while it has not ended, as in Flink) and
    ``duration`` (until ``now_ms`` while it has not ended; never negative)."""
    return {
        "start-time": start,
        "end-time": -1 if end is None else end,
        "duration": max(0, (now_ms if end is None else end) - start),
    }


def _guarantee(level: str | None, reason: str | None) -> dict[str, Any] | None:
    """A job's end-to-end guarantee as the API shows it; None when its driver reported none."""
    return None if level is None else {"level": level, "reason": reason}


def _lag(source_lag: int | None, unanswered: list[str] | None) -> dict[str, Any]:
    """A heartbeat's ``source-lag`` (null while a split's source did not answer: the driver
    could not count its records) and those ``unanswered-splits``."""
    unanswered = unanswered or []
    return {
        "source-lag": None if unanswered else source_lag,
        "unanswered-splits": unanswered,
    }


def throughput(session: Session, job_id: str, limit: int) -> list[dict[str, Any]]:
    """The job's last ``limit`` heartbeats (one per accepted epoch), oldest first.

    Raises:
        JobNotFoundError: the job is unknown.
    """
    require_job(session, job_id)
    rows = session.execute(
        select(
            H.timestamp,
            H.attempt,
            H.epoch,
            H.records,
            H.records_per_second,
            H.source_lag,
            H.unanswered_splits,
            H.duration_ms,
        )
        .where(H.job_id == job_id)
        .order_by(H.attempt.desc(), H.epoch.desc())
        .limit(limit)
    ).all()
    return [
        {
            "timestamp": r.timestamp,
            "attempt": r.attempt,
            "epoch": r.epoch,
            "records": r.records,
            "records-per-second": r.records_per_second,
            **_lag(r.source_lag, r.unanswered_splits),
            "duration": r.duration_ms,
        }
        for r in reversed(rows)
    ]


def exception_history(session: Session, job_id: str, limit: int) -> dict[str, Any]:
    """Flink's ``exceptionHistory``: the newest ``limit`` failures and whether more exist.

    Raises:
        JobNotFoundError: the job is unknown.
    """
    require_job(session, job_id)
    rows = session.execute(
        select(E.kind, E.cause, E.timestamp, E.operator_id, E.subtask, E.attempt, E.epoch, E.action)
        .where(E.job_id == job_id)
        .order_by(E.timestamp.desc(), E.id.desc())
        .limit(limit + 1)
    ).all()
    return {
        "entries": [
            {
                "exceptionName": r.kind,
                "stacktrace": r.cause,
                "timestamp": r.timestamp,
                "taskName": _task_name(r.operator_id, r.subtask),
                "attempt": r.attempt,
                "epoch": r.epoch,
                "action": r.action,
            }
            for r in rows[:limit]
        ],
        "truncated": len(rows) > limit,
    }


# ----------------------------------------------------------------------------- requests


_FAILURE_CLASS = {
    "checkpoint": "CheckpointFailure",
    "savepoint": "CheckpointFailure",
    "stop": "CheckpointFailure",
    "restore": "RestoreFailure",
    "cancel": "CancelFailure",
}


def operation_status(session: Session, job_id: str, kind: str, request_id: str) -> dict[str, Any]:
    """Flink's asynchronous-operation result of a request (``status.id`` and ``operation``).

    A failed request is ``COMPLETED`` with an ``operation.failure-cause``, as in Flink, and
    ``"failed": true``.

    Raises:
        RequestNotFoundError: no request of that id and kind belongs to the job.
    """
    op = session.execute(
        select(O.status, O.location, O.checkpoint_id, O.failure_cause).where(
            O.request_id == request_id, O.job_id == job_id, O.kind == kind
        )
    ).first()
    if op is None:
        raise RequestNotFoundError(f"{kind} request {request_id} of job {job_id} not found")
    if op.status == "IN_PROGRESS":
        return {"status": {"id": "IN_PROGRESS"}, "operation": None, "failed": False}
    if op.status == "FAILED":
        cause = {"class": _FAILURE_CLASS.get(kind, "Failure"), "stack-trace": op.failure_cause}
        return {"status": {"id": COMPLETED}, "operation": {"failure-cause": cause}, "failed": True}
    return {
        "status": {"id": COMPLETED},
        "operation": {"location": op.location, "checkpointId": op.checkpoint_id},
        "failed": False,
    }


def completed_checkpoints_after(session: Session, job_id: str, checkpoint_id: int) -> list[int]:
    """The ids of the job's completed checkpoints and savepoints newer than ``checkpoint_id``.

    Raises:
        CheckpointNotFoundError: the job has no checkpoint ``checkpoint_id``.
    """
    known = session.execute(
        select(C.checkpoint_id).where(C.job_id == job_id, C.checkpoint_id == checkpoint_id)
    ).first()
    if known is None:
        raise CheckpointNotFoundError(f"checkpoint {checkpoint_id} of job {job_id} not found")
    return list(
        session.execute(
            select(C.checkpoint_id)
            .where(C.job_id == job_id, C.status == COMPLETED, C.checkpoint_id > checkpoint_id)
            .order_by(C.checkpoint_id)
        ).scalars()
    )


def checkpoint_at_path(session: Session, job_id: str, path: str) -> int | None:
    """The id of the job's checkpoint or savepoint stored at ``path``, if it is one."""
    stripped = path.rstrip("/")
    candidates = (stripped, stripped + "/", stripped + "/_metadata")
    return session.execute(
        select(func.max(C.checkpoint_id)).where(C.job_id == job_id, C.external_path.in_(candidates))
    ).scalar_one_or_none()


# ----------------------------------------------------------------------------- metrics


@dataclass
class MetricsSnapshot:
    """The database's part of ``/metrics``, one query per family."""

    checkpoints: list[tuple[str, str, int]] = field(default_factory=list)  # job, status, n
    last_completed: list[tuple[str, float | None, int]] = field(default_factory=list)
    jobs: list[tuple[str, str, int]] = field(default_factory=list)  # job, status, restarts


def metrics_snapshot(session: Session) -> MetricsSnapshot:
    """Checkpoint counts per job and status, each job's latest completed checkpoint, jobs."""
    checkpoints = session.execute(
        select(C.job_id, C.status, func.count())
        .group_by(C.job_id, C.status)
        .order_by(C.job_id, C.status)
    ).all()
    newest_completed = (
        select(func.max(NEWEST.checkpoint_id))
        .where(NEWEST.job_id == J.job_id, NEWEST.status == COMPLETED)
        .correlate(Job.__table__)
        .scalar_subquery()
    )
    last_completed = session.execute(
        select(J.job_id, C.end_to_end_duration, C.state_size)
        .select_from(Job.__table__)
        .join(Checkpoint, (C.job_id == J.job_id) & (C.checkpoint_id == newest_completed))
        .order_by(J.job_id)
    ).all()
    jobs = session.execute(select(J.job_id, J.status, J.restarts).order_by(J.job_id)).all()
    return MetricsSnapshot(
        checkpoints=[(r[0], r[1], r[2]) for r in checkpoints],
        last_completed=[(r[0], r[1], r[2]) for r in last_completed],
        jobs=[(r[0], r[1], r[2]) for r in jobs],
    )


# ----------------------------------------------------------------------------- shared


def _task_name(operator_id: str | None, subtask: int | None) -> str | None:
    if operator_id is None:
        return None
    return operator_id if subtask is None else f"{operator_id}[{subtask}]"


def _executors(rows: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The executors as the API shows them (null: the driver does not report them)."""
    if rows is None:
        return None
    return [
        {
            "id": r.get("executor_id"),
            "host": r.get("host"),
            "cores": r.get("cores"),
            "active": r.get("active"),
            "remove-reason": r.get("remove_reason"),
        }
        for r in rows
    ]
