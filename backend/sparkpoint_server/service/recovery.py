"""Rebuilding a job's coordination state from the database (a control plane restart).

What the control plane decided is in the database before any command leaves, so a restart
rebuilds each unfinished job from its rows: configuration, attempt and next checkpoint id,
completed checkpoints (with the acknowledgements a restore needs), the failures counted since
the last completion, pending checkpoints with the acknowledgements received so far, pins,
pending requests, a decided restart and its due time, and the restart strategy's memory of
earlier failures.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import (
    CheckpointFailureReason,
    CompletedCheckpoint,
    FailedCheckpoint,
    PendingCheckpoint,
    expected_subtasks,
)
from sparkpoint.clock import Clock
from sparkpoint_server.coordination.heartbeat import (
    HEARTBEAT_TIMEOUT,
    DriverHeartbeatMonitor,
    lost_driver_key,
)
from sparkpoint_server.coordination.job import (
    RESTORE_PIN,
    TERMINAL,
    UNCOMMITTED_PIN,
    JobRuntime,
    Origin,
    build_runtime,
)
from sparkpoint_server.storage.models import (
    Checkpoint,
    CheckpointSubtask,
    Heartbeat,
    Job,
    JobException,
    JobStatusChange,
    Operation,
)

log = logging.getLogger(__name__)

Acks = dict[tuple[str, int], p.SnapshotCompleted]


def load_active_jobs(session: Session, clock: Clock, checkpoint_dir: str) -> list[JobRuntime]:
    """Every job that is not FINISHED, CANCELED or FAILED, rebuilt; and every ended job whose
    rows hold more regular checkpoints than it retains: retention kept those for a live job's
    origin, and the control plane decides again whether they go (else they would stay)."""
    terminal = [s.value for s in TERMINAL]
    rows = session.scalars(select(Job).where(Job.status.not_in(terminal))).all()
    jobs = [load_job(session, row, clock, checkpoint_dir) for row in rows]
    for row in _kept(session):
        try:
            jobs.append(load_job(session, row, clock, checkpoint_dir))
        except Exception:  # an old ended job that no longer loads: its files stay, as before
            log.exception(
                "job %s (ended) could not be rebuilt to dispose of what it kept", row.job_id
            )
    return jobs


def _kept(session: Session) -> list[Job]:
    """The ended jobs with more completed, not discarded, regular checkpoints than their
    ``retained``."""
    terminal = [s.value for s in TERMINAL]
    counts = session.execute(
        select(Checkpoint.job_id, func.count())
        .join(Job, Job.job_id == Checkpoint.job_id)
        .where(
            Job.status.in_(terminal),
            Checkpoint.status == "COMPLETED",
            Checkpoint.kind == "checkpoint",
            Checkpoint.discarded.is_(False),
        )
        .group_by(Checkpoint.job_id)
        .having(func.count() > 1)
    ).all()
    kept = []
    for job_id, n in counts:
        job = session.get(Job, job_id)
        if job is None:
            continue
        retained = (job.checkpoint_config or {}).get("retained", 1)
        if isinstance(retained, int) and n > retained:  # else load_job could not rebuild it
            kept.append(job)
    return kept


def load_job(session: Session, job: Job, clock: Clock, checkpoint_dir: str) -> JobRuntime:
    """One job's runtime from its rows (see the module docstring for what comes back)."""
    rt = build_runtime(
        job_id=job.job_id,
        name=job.name,
        graph=job.graph,
        config=job.config,
        checkpoint_config=job.checkpoint_config,
        restart_strategy=job.restart_strategy,
        status=p.JobStatus(job.status),
        incarnation=job.incarnation,
        attempt=job.attempt,
        next_checkpoint_id=job.next_checkpoint_id,
        clock=clock,
        default_checkpoint_dir=checkpoint_dir,
    )
    if job.origin_checkpoint_id is not None and job.origin_next_id is not None:
        rt.origin = Origin(job.origin_checkpoint_id, job.origin_path, job.origin_next_id)
    rows = session.scalars(
        select(Checkpoint)
        .where(Checkpoint.job_id == job.job_id, Checkpoint.discarded.is_(False))
        .order_by(Checkpoint.checkpoint_id)
    ).all()
    wanted = [r.checkpoint_id for r in rows if r.status != "FAILED"]
    acks = _acks(session, job.job_id, wanted)
    completed = [_completed(r, acks[r.checkpoint_id]) for r in rows if r.status == "COMPLETED"]
    last_ok = max((c.checkpoint_id for c in completed), default=0)
    failed_rows = session.scalars(
        select(Checkpoint)
        .where(
            Checkpoint.job_id == job.job_id,
            Checkpoint.status == "FAILED",
            Checkpoint.checkpoint_id > last_ok,
        )
        .order_by(Checkpoint.checkpoint_id)
    ).all()
    # This attempt's last final checkpoint, if it failed: the next one waits (a manual
    # checkpoint may have completed since, so it is looked up by attempt, not among failed_rows).
    last_final = session.scalars(
        select(Checkpoint)
        .where(
            Checkpoint.job_id == job.job_id,
            Checkpoint.attempt == job.attempt,
            Checkpoint.is_final.is_(True),
        )
        .order_by(Checkpoint.checkpoint_id.desc())
        .limit(1)
    ).first()
    failed_final = _failed(last_final) if last_final and last_final.status == "FAILED" else None
    expected = expected_subtasks(job.job_id, rt.tasks)
    pending = []
    for r in rows:
        if r.status != "IN_PROGRESS" or r.attempt != job.attempt:
            continue
        row_acks = dict(acks[r.checkpoint_id])
        if row_acks and len(row_acks) == len(expected):  # its completion was not recorded
            rt.held_acks.append((r.attempt, row_acks.pop(max(row_acks))))
        pending.append(_pending(r, row_acks, expected, rt))
    pins = [
        (r.checkpoint_id, UNCOMMITTED_PIN)
        for r in rows
        if r.status == "COMPLETED" and not r.committed
    ]
    if job.restart_checkpoint_id is not None and _restore_pending(session, job):
        pins.append((job.restart_checkpoint_id, RESTORE_PIN))
        rt.restore_pin = job.restart_checkpoint_id
    regular = [r.trigger_timestamp for r in rows if r.kind == "checkpoint"]
    finished = [r.completion_timestamp for r in rows if r.completion_timestamp is not None]
    rt.coordinator.recover(
        completed=completed,
        failed=[_failed(r) for r in failed_rows],
        pending=pending,
        pins=pins,
        last_trigger_timestamp=max(regular, default=None),
        last_finished_timestamp=max(finished, default=None),
        failed_final=failed_final,
    )
    for r in rows:
        if r.status == "COMPLETED" and not r.committed:
            rt.uncommitted[r.checkpoint_id] = {
                k for k, a in acks[r.checkpoint_id].items() if a.sink_transactions
            }
        if r.status == "IN_PROGRESS" and r.target_directory:
            rt.savepoint_targets[r.checkpoint_id] = r.target_directory
        if r.status == "IN_PROGRESS" and r.request_id:
            rt.operations[r.checkpoint_id] = r.request_id
        if r.status == "IN_PROGRESS" and r.is_final:
            rt.final_requested = True
    # A final checkpoint of this attempt failed and none is pending: the job asked for the
    # next (or will), which waits as it did before (service.final_checkpoint).
    if failed_final and not rt.final_requested and rt.status is p.JobStatus.RUNNING:
        rt.final_requested = rt.final_waiting = True
    rt.restart_due_at, rt.restart_cause = job.restart_due_at, job.restart_cause
    _watch_driver(session, job, rt, clock)
    _first_epoch(session, job, rt)
    _requests(session, rt)
    _replay_restart_strategy(session, rt)
    return rt


def _acks(session: Session, job_id: str, checkpoint_ids: list[int]) -> dict[int, Acks]:
    out: dict[int, Acks] = defaultdict(dict)
    if not checkpoint_ids:
        return out
    stmt = select(CheckpointSubtask.checkpoint_id, CheckpointSubtask.ack).where(
        CheckpointSubtask.job_id == job_id,
        CheckpointSubtask.checkpoint_id.in_(checkpoint_ids),
        CheckpointSubtask.ack.is_not(None),
    )
    for cid, raw in session.execute(stmt):
        if raw is None:  # JSON null, written by versions before ``none_as_null``: no payload
            continue
        ack = p.SnapshotCompleted.model_validate(raw)
        out[cid][(ack.operator_id, ack.subtask)] = ack
    return out


def _completed(row: Checkpoint, acks: Acks) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=row.checkpoint_id,
        kind=p.CheckpointKind(row.kind),
        attempt=row.attempt,
        trigger_timestamp=row.trigger_timestamp,
        completion_timestamp=row.completion_timestamp or row.trigger_timestamp,
        end_to_end_duration_ms=row.end_to_end_duration or 0.0,
        is_final=row.is_final,
        acks=acks,
        external_path=row.external_path,
    )


def _failed(row: Checkpoint) -> FailedCheckpoint:
    reason = CheckpointFailureReason(row.failure_reason or "CHECKPOINT_EXPIRED")
    declined = reason in (
        CheckpointFailureReason.CHECKPOINT_DECLINED,
        CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
    )
    return FailedCheckpoint(
        checkpoint_id=row.checkpoint_id,
        kind=p.CheckpointKind(row.kind),
        attempt=row.attempt,
        trigger_timestamp=row.trigger_timestamp,
        failure_timestamp=row.completion_timestamp or row.trigger_timestamp,
        reason=reason,
        message=row.failure_message or "",
        is_final=row.is_final,
        declined_by=("?", 0) if declined else None,
    )


def _pending(row: Checkpoint, acks: Acks, expected: Any, rt: JobRuntime) -> PendingCheckpoint:
    return PendingCheckpoint(
        checkpoint_id=row.checkpoint_id,
        kind=p.CheckpointKind(row.kind),
        attempt=row.attempt,
        trigger_timestamp=row.trigger_timestamp,
        trigger_monotonic_ms=rt.coordinator.monotonic_of(row.trigger_timestamp),
        timeout_ms=rt.coordinator.config.timeout_ms,
        expected=expected,
        is_final=row.is_final,
        target_directory=row.target_directory,
        acks=dict(acks),
    )


def _restore_pending(session: Session, job: Job) -> bool:
    stmt = select(Operation.request_id).where(
        Operation.job_id == job.job_id,
        Operation.kind == "restore",
        Operation.status == "IN_PROGRESS",
    )
    return session.execute(stmt).first() is not None


def _requests(session: Session, rt: JobRuntime) -> None:
    ops = session.scalars(
        select(Operation).where(Operation.job_id == rt.job_id, Operation.status == "IN_PROGRESS")
    ).all()
    pending = rt.coordinator.pending
    for op in sorted(ops, key=lambda o: o.created_at):
        if op.kind == "checkpoint" and op.checkpoint_id is None:
            rt.queued_checkpoints.append(op.request_id)  # a queued manual request
        if op.kind == "restore" and op.attempt is not None:
            rt.restore_request = (op.attempt, op.request_id)
        elif op.kind == "cancel":
            rt.cancel_request = op.request_id
        elif op.kind == "stop" and op.checkpoint_id in pending:
            rt.stop_checkpoint = op.checkpoint_id
        elif op.kind == "savepoint" and op.params.get("cancel-job") and op.checkpoint_id:
            rt.cancel_after.add(op.checkpoint_id)


def _watch_driver(session: Session, job: Job, rt: JobRuntime, clock: Clock) -> None:
    """Watch the job's driver again, giving it a full heartbeat timeout from now (this
    control plane may have been down), unless its silence failed the job over and it has
    not been heard from since."""
    if job.heartbeat_interval is None or job.incarnation is None or not rt.active:
        return
    prefix = f"{job.job_id}:{lost_driver_key(job.incarnation)}"
    stmt = select(func.max(JobException.timestamp)).where(
        JobException.dedupe_key.startswith(prefix)
    )
    lost_at = session.execute(stmt).scalar_one()
    if lost_at is not None and (job.last_driver_heartbeat or 0) <= lost_at:
        rt.driver_lost = True
        return
    rt.heartbeat = DriverHeartbeatMonitor(
        job_id=job.job_id,
        incarnation=job.incarnation,
        since_monotonic_ms=clock.monotonic_ms(),
        last_at=job.last_driver_heartbeat,
        watching_since=clock.now_ms(),
    )


def _first_epoch(session: Session, job: Job, rt: JobRuntime) -> None:
    """Whether the attempt's first epoch ended (its periodic checkpoints wait for it): the
    latest epoch of the attempt is known again, from its heartbeat's row."""
    rt.first_epoch_heartbeat = bool(job.first_epoch_heartbeat)
    latest = session.execute(
        select(Heartbeat.epoch, Heartbeat.timestamp)
        .where(Heartbeat.job_id == job.job_id, Heartbeat.attempt == job.attempt)
        .order_by(Heartbeat.epoch.desc())
        .limit(1)
    ).first()
    if latest is not None:
        rt.epoch_ends.ended(job.attempt, latest.epoch, latest.timestamp)


def _replay_restart_strategy(session: Session, rt: JobRuntime) -> None:
    """The restart strategy remembers earlier failures (failure-rate's window, exponential
    backoff): replay the recorded failures and RUNNING transitions in order."""
    moments: list[tuple[int, int, str]] = []
    for ts in session.scalars(
        select(JobException.timestamp).where(
            JobException.job_id == rt.job_id,
            JobException.kind.in_(["TASK_FAILURE", "CHECKPOINT_FAILURE", HEARTBEAT_TIMEOUT]),
        )
    ):
        moments.append((ts, 1, "failure"))
    for ts in session.scalars(
        select(JobStatusChange.timestamp).where(
            JobStatusChange.job_id == rt.job_id, JobStatusChange.status == "RUNNING"
        )
    ):
        moments.append((ts, 0, "running"))
    for ts, _, what in sorted(moments):
        if what == "failure":
            rt.restart.on_failure(ts)
        else:
            rt.restart.on_running(ts)
