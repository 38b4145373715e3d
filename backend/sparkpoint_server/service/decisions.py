"""The control plane's decisions about one job: trigger, complete, fail, restart (a new
attempt and its restore: :mod:`~sparkpoint_server.service.attempts`).

Each function takes the :class:`~sparkpoint_server.service.batch.Batch` it writes into and the
job's :class:`~sparkpoint_server.coordination.job.JobRuntime`; the pure coordinator and restart
strategy decide, these functions record the decision and queue its commands.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import (
    CheckpointFailureReason as Reason,
)
from sparkpoint.checkpointing.pending import (
    CheckpointTriggerError,
    CompletedCheckpoint,
    FailedCheckpoint,
    PendingCheckpoint,
)
from sparkpoint.checkpointing.restart import SUPPRESSED, format_duration
from sparkpoint_server.coordination.job import (
    ORIGIN_PIN,
    UNCOMMITTED_PIN,
    JobRuntime,
)
from sparkpoint_server.service import origins
from sparkpoint_server.service.batch import Batch

log = logging.getLogger(__name__)

OK, FAILED_STATUS = "COMPLETED", "FAILED"


def set_status(batch: Batch, rt: JobRuntime, status: p.JobStatus, cause: str | None) -> bool:
    """Move the job to ``status`` if Flink's state machine allows it; record the change."""
    if status == rt.status or not rt.can_become(status):
        return False
    previous, rt.status = rt.status, status
    if previous is p.JobStatus.RUNNING:
        fail_queued(batch, rt, f"the job became {status.value}" + (f" ({cause})" if cause else ""))
    log.info(
        "job %s attempt %d: %s -> %s%s",
        rt.job_id,
        rt.attempt,
        previous.value,
        status.value,
        f" ({cause})" if cause else "",
    )
    fields: dict[str, Any] = {"status": status.value, "updated_at": batch.now}
    if status in (p.JobStatus.FINISHED, p.JobStatus.CANCELED, p.JobStatus.FAILED):
        fields["end_time"] = batch.now
    elif status is p.JobStatus.RUNNING:
        fields["end_time"] = None
        rt.restart.on_running(batch.now)
        rt.coordinator.start_periodic_timer()
    batch.writer.job(rt.job_id, **fields)
    batch.writer.status_change(
        job_id=rt.job_id,
        attempt=rt.attempt,
        timestamp=batch.now,
        status=status.value,
        previous=previous.value,
        cause=cause,
    )
    batch.touched.add(rt.job_id)
    return True


def set_status_and_settle(
    batch: Batch, rt: JobRuntime, status: p.JobStatus, cause: str | None
) -> None:
    """:func:`set_status`; a job that is over also completes its cancel request and fails
    what is pending (nothing can complete any more)."""
    if not set_status(batch, rt, status, cause):
        return
    if status is p.JobStatus.CANCELED and rt.cancel_request is not None:
        batch.writer.operation(rt.cancel_request, status=OK, updated_at=batch.now)
        rt.cancel_request = None
    if not rt.active:
        aborted = rt.coordinator.abort_all(
            Reason.CHECKPOINT_COORDINATOR_SHUTDOWN, f"the job is {status.value}"
        )
        handle_failed(batch, rt, aborted)
        rt.stop_checkpoint = None
        drop_restart(batch, rt)  # a restart decided before the driver ended the job


# ----------------------------------------------------------------------------- triggering


def trigger(
    batch: Batch,
    rt: JobRuntime,
    kind: p.CheckpointKind = p.CheckpointKind.CHECKPOINT,
    *,
    periodic: bool = False,
    is_final: bool = False,
    target_directory: str | None = None,
    request_id: str | None = None,
    stop: bool = False,
) -> PendingCheckpoint:
    """Trigger a checkpoint (raises the coordinator's ``CheckpointTriggerError``)."""
    pending = rt.coordinator.trigger(
        kind, periodic=periodic, is_final=is_final, target_directory=target_directory
    )
    cid = pending.checkpoint_id
    batch.writer.new_checkpoint(
        rt.job_id,
        cid,
        attempt=pending.attempt,
        kind=kind.value,
        is_final=is_final,
        status="IN_PROGRESS",
        trigger_timestamp=pending.trigger_timestamp,
        num_subtasks=pending.num_subtasks,
        num_acknowledged_subtasks=0,
        target_directory=target_directory,
        request_id=request_id,
    )
    batch.writer.job(rt.job_id, next_checkpoint_id=rt.coordinator.next_checkpoint_id)
    if target_directory is not None:
        rt.savepoint_targets[cid] = target_directory
    if request_id is not None:
        rt.operations[cid] = request_id
        batch.writer.operation(request_id, checkpoint_id=cid, updated_at=batch.now)
    if stop:
        rt.stop_checkpoint = cid
    batch.command(rt.job_id, rt.attempt, trigger_command(pending, stop))
    return pending


#: At most this many manual checkpoint requests wait for a free slot (Flink's default
#: ``maxQueuedRequests`` is 1000; a person at the dashboard never needs more than a few).
MAX_QUEUED_CHECKPOINTS = 100


def queue_checkpoint(batch: Batch, rt: JobRuntime, request_id: str, refused: str) -> None:
    """Queue a manual checkpoint request that ``max_concurrent`` refused, or that came
    before the attempt's first epoch ended (``refused`` says why): it is triggered, ahead of
    periodic checkpoints, once a slot is free and the attempt's tasks run.

    Raises:
        CheckpointTriggerError: when :data:`MAX_QUEUED_CHECKPOINTS` requests wait already.
    """
    if len(rt.queued_checkpoints) >= MAX_QUEUED_CHECKPOINTS:
        raise CheckpointTriggerError(
            rt.job_id,
            Reason.TOO_MANY_CHECKPOINT_REQUESTS,
            f"{refused}; {len(rt.queued_checkpoints)} manual checkpoint requests wait already "
            f"(at most {MAX_QUEUED_CHECKPOINTS} are queued)",
        )
    rt.queued_checkpoints.append(request_id)
    log.info("job %s: checkpoint request %s queued: %s", rt.job_id, request_id, refused)


def trigger_queued(batch: Batch, rt: JobRuntime) -> bool:
    """Trigger the oldest queued manual checkpoint request if a slot is free and the
    attempt's tasks run."""
    if not rt.queued_checkpoints or rt.status is not p.JobStatus.RUNNING:
        return False
    if not rt.tasks_running:
        return False
    if rt.coordinator.pending_count >= rt.coordinator.config.max_concurrent:
        return False
    request_id = rt.queued_checkpoints.pop(0)
    trigger(batch, rt, request_id=request_id)
    return True


def fail_queued(batch: Batch, rt: JobRuntime, why: str) -> None:
    """The queued manual requests fail: the job left RUNNING before their turn came."""
    for request_id in rt.queued_checkpoints:
        cause = f"checkpoint request {request_id} was queued and not triggered: {why}"
        batch.writer.operation(
            request_id, status=FAILED_STATUS, failure_cause=cause, updated_at=batch.now
        )
    rt.queued_checkpoints.clear()


def resend_trigger(batch: Batch, rt: JobRuntime, pending: PendingCheckpoint) -> None:
    batch.command(rt.job_id, rt.attempt, trigger_command(pending))


def trigger_command(
    pending: PendingCheckpoint, stop: bool = False
) -> p.TriggerCheckpoint | p.StopWithSavepoint:
    """The command that triggers a pending checkpoint (again)."""
    if stop:
        return p.StopWithSavepoint(
            checkpoint_id=pending.checkpoint_id,
            trigger_timestamp=pending.trigger_timestamp,
            target_directory=pending.target_directory,
        )
    return p.TriggerCheckpoint(
        checkpoint_id=pending.checkpoint_id,
        kind=pending.kind,
        trigger_timestamp=pending.trigger_timestamp,
        target_directory=pending.target_directory,
        is_final=pending.is_final,
    )


# ----------------------------------------------------------------------------- acknowledgements


def acknowledged(batch: Batch, rt: JobRuntime, ack: p.SnapshotCompleted) -> None:
    """A new acknowledgement of a pending checkpoint: its row is updated once per batch."""
    batch.acknowledged.setdefault((rt.job_id, ack.checkpoint_id), (rt, ack.ack_timestamp))
    latest = max(batch.acknowledged[(rt.job_id, ack.checkpoint_id)][1], ack.ack_timestamp)
    batch.acknowledged[(rt.job_id, ack.checkpoint_id)] = (rt, latest)


def record_acknowledged(batch: Batch) -> None:
    """The rows of the checkpoints acknowledged in this batch that are still pending: counts,
    sizes and the latest acknowledgement, summed once per checkpoint (not once per ack)."""
    for (job_id, cid), (rt, latest) in batch.acknowledged.items():
        pending = rt.coordinator.pending_checkpoint(cid)
        if pending is None:
            continue  # it completed or failed in this batch: that wrote its row
        acks = pending.acks.values()
        batch.writer.checkpoint(
            job_id,
            cid,
            num_acknowledged_subtasks=len(pending.acks),
            latest_ack_timestamp=latest,
            state_size=sum(a.state_size for a in acks),
            checkpointed_size=sum(a.checkpointed_size for a in acks),
            alignment_buffered=sum(a.alignment_buffered_bytes for a in acks),
        )
    batch.acknowledged.clear()


def fail_completion(
    batch: Batch, rt: JobRuntime, cp: CompletedCheckpoint, message: str, *, discard: bool = True
) -> None:
    """Take back a completion whose ``_metadata`` was not (or may not yet be) written: it
    fails as FINALIZE_CHECKPOINT_FAILURE with ``message``; ``discard``: delete its state now
    (else when its write ends)."""
    cid = cp.checkpoint_id
    rt.uncommitted.pop(cid, None)
    rt.coordinator.store.unpin(cid, UNCOMMITTED_PIN)
    if rt.coordinator.store.get(cid) is not None:
        failed = rt.coordinator.finalize_failed(cid, message)
    else:  # a later completion already subsumed it
        message = f"checkpoint {cid} of job {rt.job_id} failed to finalize: {message}"
        failed = cp.to_failed(Reason.FINALIZE_CHECKPOINT_FAILURE, message, batch.now)
    handle_failed(batch, rt, [failed], discard=discard)


def take_back_completions(batch: Batch, rt: JobRuntime, why: str) -> None:
    """Before a failover or a restore decides what to restore: the completions still being
    written fail (their ``_metadata`` may never be written), so only written ones restore."""
    for cid in sorted(rt.finalizing):
        entry = rt.finalizing[cid]
        if not entry.taken_back:
            entry.taken_back = True
            message = f"{why} before its _metadata was written"
            fail_completion(batch, rt, entry.checkpoint, message, discard=False)


def discard_subsumed(
    batch: Batch,
    rt: JobRuntime,
    released: list[CompletedCheckpoint] | None = None,
    *,
    drain: bool = True,
) -> None:
    """Delete (after the commit) the state of what retention dropped (``drain``) or a pin
    released."""
    # A completion still being written may be taken back, with what it subsumed: not yet.
    writing = any(not entry.taken_back for entry in rt.finalizing.values())
    dropped = rt.coordinator.drain_subsumed() if drain and not writing else []
    for old in [*dropped, *(released or [])]:
        relying = origins.relied_on(batch.jobs.values(), old, batch.starting)
        if relying is not None:
            what = f"job {rt.job_id}: checkpoint {old.checkpoint_id} kept past retention"
            log.info("%s: %s would restore it by its path", what, relying)
            rt.coordinator.store.keep(old, ORIGIN_PIN)
            continue
        batch.writer.checkpoint(rt.job_id, old.checkpoint_id, discarded=True)
        batch.later(partial(rt.storage.discard, rt.job_id, old.checkpoint_id))


def unpin(batch: Batch, rt: JobRuntime, checkpoint_id: int, why: str, drain: bool = True) -> None:
    discard_subsumed(batch, rt, rt.coordinator.store.unpin(checkpoint_id, why), drain=drain)


def sink_committed(batch: Batch, rt: JobRuntime, ev: p.SinkCommitted, timestamp: int) -> None:
    """A sink subtask committed its transaction of a completed checkpoint (at ``timestamp``,
    the job's clock); the last one makes the checkpoint committed at that time."""
    waiting = rt.uncommitted.get(ev.checkpoint_id)
    if waiting is None:
        return
    waiting.discard((ev.operator_id, ev.subtask))
    if waiting:
        return
    del rt.uncommitted[ev.checkpoint_id]
    batch.writer.checkpoint(rt.job_id, ev.checkpoint_id, committed=True, commit_timestamp=timestamp)
    # Not draining: completions of this batch may still be writing their _metadata.
    unpin(batch, rt, ev.checkpoint_id, UNCOMMITTED_PIN, drain=False)


# ----------------------------------------------------------------------------- failures


def handle_failed(
    batch: Batch, rt: JobRuntime, failed: list[FailedCheckpoint], *, discard: bool = True
) -> None:
    """Failed checkpoints: their rows, their requests, an abort to the job, their state gone
    (``discard``; else later, by whoever still writes it)."""
    for f in failed:
        log.warning("checkpoint failed (%s): %s", f.reason.value, f.message)
        batch.writer.checkpoint(
            rt.job_id,
            f.checkpoint_id,
            status=FAILED_STATUS,
            completion_timestamp=f.failure_timestamp,
            failure_reason=f.reason.value,
            failure_message=f.message,
            num_acknowledged_subtasks=len(f.acks),
            discarded=True,
        )
        request_id = rt.operations.pop(f.checkpoint_id, None)
        if request_id is not None:
            batch.writer.operation(
                request_id, status=FAILED_STATUS, failure_cause=f.message, updated_at=batch.now
            )
        if rt.stop_checkpoint == f.checkpoint_id:
            rt.stop_checkpoint = None
        rt.cancel_after.discard(f.checkpoint_id)
        batch.command(
            rt.job_id,
            f.attempt,
            p.NotifyCheckpointAborted(
                checkpoint_id=f.checkpoint_id, reason=f"{f.reason.value}: {f.message}"
            ),
        )
        if discard:
            batch.later(partial(rt.storage.discard, rt.job_id, f.checkpoint_id))
    if rt.coordinator.must_fail_job and rt.status is p.JobStatus.RUNNING:
        cause = rt.coordinator.must_fail_cause or "checkpoint failures"
        job_failed(batch, rt, cause, kind="CHECKPOINT_FAILURE", dedupe=f"cpfail:{rt.attempt}")


def job_failed(
    batch: Batch,
    rt: JobRuntime,
    cause: str,
    *,
    kind: str,
    dedupe: str,
    epoch: int | None = None,
    operator_id: str | None = None,
    subtask: int | None = None,
    region: str | None = None,
    recoverable: bool = True,
) -> None:
    """A failure of the running attempt: record it, ask the restart strategy, act.
    ``region``: the failover region that the job restarts alone (its name and vertices),
    which the recorded decision names; None: the whole job. ``recoverable`` False: no
    restart can fix it (a task's configuration error), the strategy is not asked.

    Steps: (1) record the failure once (``dedupe``), (2) the restart strategy decides,
    (3a) restart: RESTARTING, the restart is due after the delay (a timer, in the database),
    (3b) no restart: FAILING, abort pending checkpoints, tell the job, FAILED.
    """
    key = f"{rt.job_id}:{dedupe}"
    if batch.writer.exception_exists(key):
        return
    # Step 2
    decision = rt.restart.on_failure(batch.now) if recoverable else SUPPRESSED
    scope = f"restart region {region}" if region is not None else "restart"
    action = (
        f"{scope} in {format_duration(decision.delay_ms)} ({decision.message})"
        if decision.restart
        else f"no restart: {decision.message}"
    )
    # Step 1
    log.warning("job %s attempt %d failed: %s; %s", rt.job_id, rt.attempt, cause, action)
    batch.writer.exception(
        key,
        job_id=rt.job_id,
        attempt=rt.attempt,
        timestamp=batch.now,
        kind=kind,
        cause=cause,
        epoch=epoch,
        operator_id=operator_id,
        subtask=subtask,
        action=action,
    )
    if decision.restart:
        # Step 3a
        set_status(batch, rt, p.JobStatus.RESTARTING, cause)
        rt.restart_due_at = batch.now + decision.delay_ms
        rt.restart_cause = cause
        batch.writer.job(rt.job_id, restart_due_at=rt.restart_due_at, restart_cause=cause)
        return
    # Step 3b
    fail_for_good(batch, rt, cause, f"{cause} ({decision.message})")


def fail_for_good(batch: Batch, rt: JobRuntime, cause: str, final: str | None = None) -> None:
    """The job ends FAILED without a restart: FAILING, pending checkpoints aborted, FAILED
    (``final``, else ``cause``), and the driver told so (``final``: its console says why the
    restart strategy gave up)."""
    drop_restart(batch, rt)
    set_status(batch, rt, p.JobStatus.FAILING, cause)
    handle_failed(
        batch, rt, rt.coordinator.abort_all(Reason.JOB_FAILOVER_REGION, f"job failed: {cause}")
    )
    told = final or cause
    batch.command(rt.job_id, rt.attempt, p.CancelJob(status=p.JobStatus.FAILED, cause=told))
    set_status(batch, rt, p.JobStatus.FAILED, told)


def drop_restart(batch: Batch, rt: JobRuntime) -> None:
    """Forget a decided restart that is still due (the job ended, or another start wins), and
    the check of its checkpoints' files."""
    rt.failover_check = None
    if rt.restart_due_at is not None or rt.restart_cause is not None:
        rt.restart_due_at, rt.restart_cause = None, None
        batch.writer.job(rt.job_id, restart_due_at=None, restart_cause=None)
