"""The control plane's decisions about one job: trigger, complete, fail, restart, restore.

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
    CompletedCheckpoint,
    FailedCheckpoint,
    FailoverDecision,
    PendingCheckpoint,
)
from sparkpoint.errors import SparkpointError
from sparkpoint.runtime.recovery import checkpoint_metadata
from sparkpoint_server.coordination.job import RESTORE_PIN, UNCOMMITTED_PIN, JobRuntime
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.savepoints import write_savepoint

log = logging.getLogger(__name__)

OK, FAILED_STATUS = "COMPLETED", "FAILED"


def set_status(batch: Batch, rt: JobRuntime, status: p.JobStatus, cause: str | None) -> bool:
    """Move the job to ``status`` if Flink's state machine allows it; record the change."""
    if status == rt.status or not rt.can_become(status):
        return False
    previous, rt.status = rt.status, status
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
        pending = rt.coordinator.pending.get(cid)
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


def complete(batch: Batch, rt: JobRuntime, cp: CompletedCheckpoint, savepoint_dir: str) -> None:
    """DESIGN §1's completion order.

    Steps: (0) pin the checkpoint while its sinks have not committed (so that a completion
    later in the same batch cannot subsume it), (1) write ``_metadata`` (a savepoint: its
    self-contained copy in the target directory) on the I/O pool, while the batch goes on;
    :func:`finish_completions` then does (2) the checkpoint's row and its request's, (3) after
    the commit: the notification that makes the sinks commit, (4) deleting the state of what
    retention subsumed.
    """
    cid = cp.checkpoint_id
    # Step 0
    needs_commit = {key for key, ack in cp.acks.items() if ack.sink_transactions}
    if needs_commit:
        rt.uncommitted[cid] = needs_commit
        rt.coordinator.store.pin(cid, UNCOMMITTED_PIN)
    # Step 1
    target = rt.savepoint_targets.pop(cid, None) or savepoint_dir
    batch.completions.append((rt, cp, batch.io(_write_metadata, rt, cp, target)))


def _write_metadata(rt: JobRuntime, cp: CompletedCheckpoint, savepoint_target: str) -> str | None:
    if cp.is_savepoint:
        return write_savepoint(rt.job_id, cp, rt.storage, savepoint_target)
    return rt.storage.write_metadata(
        rt.job_id, cp.checkpoint_id, checkpoint_metadata(rt.job_id, cp)
    )


def finish_completions(batch: Batch) -> None:
    """Steps (2)-(4) of :func:`complete`, in completion order, once each ``_metadata`` is
    written; a completion whose ``_metadata`` failed fails as FINALIZE_CHECKPOINT_FAILURE."""
    completions, batch.completions = batch.completions, []
    for rt, cp, written in completions:
        cid = cp.checkpoint_id
        try:
            cp.external_path = written.result()
        except (OSError, SparkpointError) as err:
            rt.uncommitted.pop(cid, None)
            rt.coordinator.store.unpin(cid, UNCOMMITTED_PIN)
            failed = rt.coordinator.finalize_failed(cid, f"writing _metadata: {err}")
            handle_failed(batch, rt, [failed])
            continue
        if cp.is_savepoint:  # the state now lives in the savepoint's own directory
            batch.later(partial(rt.storage.discard, rt.job_id, cid))
        # Step 2
        batch.writer.checkpoint(
            rt.job_id,
            cid,
            status=OK,
            num_acknowledged_subtasks=len(cp.acks),
            latest_ack_timestamp=max(a.ack_timestamp for a in cp.acks.values()),
            completion_timestamp=cp.completion_timestamp,
            end_to_end_duration=cp.end_to_end_duration_ms,
            state_size=cp.state_size,
            checkpointed_size=cp.checkpointed_size,
            alignment_buffered=sum(a.alignment_buffered_bytes for a in cp.acks.values()),
            external_path=cp.external_path,
            committed=cid not in rt.uncommitted,
        )
        request_id = rt.operations.pop(cid, None)
        if request_id is not None:
            batch.writer.operation(
                request_id, status=OK, location=cp.external_path, updated_at=batch.now
            )
        # Step 3
        batch.command(rt.job_id, cp.attempt, p.NotifyCheckpointComplete(checkpoint_id=cid))
        if cid in rt.cancel_after:
            rt.cancel_after.discard(cid)
            cause = f"cancel-job after savepoint {cid}"
            set_status(batch, rt, p.JobStatus.CANCELLING, cause)
            batch.command(rt.job_id, rt.attempt, p.CancelJob(cause=cause))
        # Step 4
        discard_subsumed(batch, rt)


def discard_subsumed(
    batch: Batch,
    rt: JobRuntime,
    released: list[CompletedCheckpoint] | None = None,
    *,
    drain: bool = True,
) -> None:
    """Delete (after the commit) the state of what retention dropped (``drain``) or a pin
    released."""
    dropped = rt.coordinator.drain_subsumed() if drain else []
    for old in [*dropped, *(released or [])]:
        batch.writer.checkpoint(rt.job_id, old.checkpoint_id, discarded=True)
        batch.later(partial(rt.storage.discard, rt.job_id, old.checkpoint_id))


def unpin(batch: Batch, rt: JobRuntime, checkpoint_id: int, why: str, drain: bool = True) -> None:
    discard_subsumed(batch, rt, rt.coordinator.store.unpin(checkpoint_id, why), drain=drain)


def sink_committed(batch: Batch, rt: JobRuntime, ev: p.SinkCommitted) -> None:
    waiting = rt.uncommitted.get(ev.checkpoint_id)
    if waiting is None:
        return
    waiting.discard((ev.operator_id, ev.subtask))
    if waiting:
        return
    del rt.uncommitted[ev.checkpoint_id]
    batch.writer.checkpoint(rt.job_id, ev.checkpoint_id, committed=True)
    # Not draining: completions of this batch may still be writing their _metadata.
    unpin(batch, rt, ev.checkpoint_id, UNCOMMITTED_PIN, drain=False)


# ----------------------------------------------------------------------------- failures


def handle_failed(batch: Batch, rt: JobRuntime, failed: list[FailedCheckpoint]) -> None:
    """Failed checkpoints: their rows, their requests, an abort to the job, their state gone."""
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
) -> None:
    """A failure of the running attempt: record it, ask the restart strategy, act.

    Steps: (1) record the failure once (``dedupe``), (2) the restart strategy decides,
    (3a) restart: RESTARTING, the restart is due after the delay (a timer, in the database),
    (3b) no restart: FAILING, abort pending checkpoints, tell the job, FAILED.
    """
    key = f"{rt.job_id}:{dedupe}"
    if batch.writer.exception_exists(key):
        return
    # Step 2
    decision = rt.restart.on_failure(batch.now)
    action = (
        f"restart in {decision.delay_ms} ms ({decision.message})"
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
    set_status(batch, rt, p.JobStatus.FAILING, cause)
    handle_failed(
        batch, rt, rt.coordinator.abort_all(Reason.JOB_FAILOVER_REGION, f"job failed: {cause}")
    )
    batch.command(rt.job_id, rt.attempt, p.CancelJob(status=p.JobStatus.FAILED, cause=cause))
    set_status(batch, rt, p.JobStatus.FAILED, f"{cause} ({decision.message})")


def restart_now(batch: Batch, rt: JobRuntime) -> None:
    """A due restart: the next attempt restores the latest completed checkpoint."""
    cause = rt.restart_cause or "restart"
    rt.restart_due_at, rt.restart_cause = None, None
    decision = rt.coordinator.failover(cause)
    batch.writer.job(rt.job_id, restart_due_at=None, restart_cause=None)
    start_attempt(batch, rt, decision, request_id=None)


def start_attempt(
    batch: Batch, rt: JobRuntime, decision: FailoverDecision, request_id: str | None
) -> None:
    """Record a new attempt and send the job the checkpoint it starts from."""
    cp_name = (
        f"checkpoint {decision.restore_from.checkpoint_id}"
        if decision.restore_from is not None
        else "the beginning"
    )
    log.info("job %s: attempt %d starts from %s", rt.job_id, decision.attempt, cp_name)
    handle_failed(batch, rt, decision.aborted)
    rt.final_requested = False
    rt.stop_checkpoint = None
    # The restore re-commits the restored checkpoint's transactions and aborts the others.
    for old in list(rt.uncommitted):
        unpin(batch, rt, old, UNCOMMITTED_PIN)
    rt.uncommitted.clear()
    cp = decision.restore_from
    if cp is not None and rt.coordinator.store.get(cp.checkpoint_id) is not None:
        rt.coordinator.store.pin(cp.checkpoint_id, RESTORE_PIN)
        rt.restore_pin = cp.checkpoint_id
    discard_subsumed(batch, rt)
    if request_id is not None:
        rt.restore_request = (decision.attempt, request_id)
        batch.writer.operation(request_id, attempt=decision.attempt, updated_at=batch.now)
    restarts = rt.attempt - 1
    batch.writer.job(
        rt.job_id,
        attempt=decision.attempt,
        restarts=restarts,
        restart_checkpoint_id=cp.checkpoint_id if cp else None,
        updated_at=batch.now,
    )
    rt.start_command = restore_command(rt, cp, decision.attempt, request_id)
    batch.command(rt.job_id, decision.attempt, rt.start_command)


def restore_command(
    rt: JobRuntime, cp: CompletedCheckpoint | None, attempt: int, request_id: str | None
) -> p.RestoreJob:
    if cp is None:
        return p.RestoreJob(new_attempt=attempt, request_id=request_id)
    inline = any(h.inline is not None for a in cp.acks.values() for h in a.handles)
    return p.RestoreJob(
        new_attempt=attempt,
        checkpoint_id=cp.checkpoint_id,
        external_path=cp.external_path,
        savepoint_path=cp.external_path if cp.is_savepoint else None,
        acks=list(cp.acks.values()) if inline or cp.external_path is None else None,
        request_id=request_id,
    )


def job_restored(batch: Batch, rt: JobRuntime, attempt: int, ev: p.JobRestored) -> None:
    """The job restarted as ``attempt``: the restore request completes, its pin goes."""
    if rt.restore_pin is not None:
        unpin(batch, rt, rt.restore_pin, RESTORE_PIN)
    rt.restore_pin = None
    is_savepoint = bool(ev.external_path and "/savepoint-" in ev.external_path)
    batch.writer.job(
        rt.job_id,
        restored_checkpoint_id=ev.checkpoint_id,
        restored_at=batch.now,
        restored_path=ev.external_path,
        restored_is_savepoint=is_savepoint,
    )
    if rt.restore_request is not None and rt.restore_request[0] == attempt:
        batch.writer.operation(
            rt.restore_request[1],
            status=OK,
            checkpoint_id=ev.checkpoint_id,
            location=ev.external_path,
            updated_at=batch.now,
        )
        rt.restore_request = None
