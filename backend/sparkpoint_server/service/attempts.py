"""A job's new attempt: recorded, and sent the checkpoint it restores (whatever decided it: a
failover, a restore request, an ended job run again); then its restore, reported back.

As :mod:`~sparkpoint_server.service.decisions`, each function takes the batch it writes into
and the job's runtime.
"""

from __future__ import annotations

import logging

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import FailoverDecision
from sparkpoint_server.coordination.job import RESTORE_PIN, UNCOMMITTED_PIN, JobRuntime, Origin
from sparkpoint_server.service import origins
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.decisions import (
    OK,
    discard_subsumed,
    drop_restart,
    handle_failed,
    unpin,
)

log = logging.getLogger(__name__)


def start_attempt(
    batch: Batch,
    rt: JobRuntime,
    decision: FailoverDecision,
    request_id: str | None,
    *,
    new_line: bool = False,
) -> None:
    """Record a new attempt and send the job the checkpoint it starts from. A restore request
    (``request_id``) or a ``new_line`` (an ended job run again from a checkpoint) makes that
    checkpoint the job's origin."""
    cp = decision.restore_from
    if (request_id is not None or new_line) and cp is not None:
        rt.origin = Origin(cp.checkpoint_id, cp.external_path, rt.coordinator.next_checkpoint_id)
        batch.writer.job(rt.job_id, **origins.columns(rt.origin))
    if cp is not None:
        cp_name = f"checkpoint {cp.checkpoint_id}"
    elif rt.origin is not None:
        cp_name = f"checkpoint {rt.origin.checkpoint_id} at {rt.origin.path} (its origin)"
    else:
        cp_name = "the beginning"
    log.info("job %s: attempt %d starts from %s", rt.job_id, decision.attempt, cp_name)
    drop_restart(batch, rt)  # this start supersedes a restart still due
    handle_failed(batch, rt, decision.aborted)
    rt.final_requested = rt.final_waiting = False
    rt.stop_checkpoint = None
    # The restore re-commits the restored checkpoint's transactions and aborts the others.
    for old in list(rt.uncommitted):
        unpin(batch, rt, old, UNCOMMITTED_PIN)
    rt.uncommitted.clear()
    pinned = None
    if cp is not None and origins.held(rt, cp.checkpoint_id, cp.external_path) is not None:
        rt.coordinator.store.pin(cp.checkpoint_id, RESTORE_PIN)
        rt.restore_pin = pinned = cp.checkpoint_id
    discard_subsumed(batch, rt)
    if request_id is not None:
        rt.restore_request = (decision.attempt, request_id)
        batch.writer.operation(request_id, attempt=decision.attempt, updated_at=batch.now)
    restarts = rt.attempt - 1
    batch.writer.job(
        rt.job_id,
        attempt=decision.attempt,
        restarts=restarts,
        restart_checkpoint_id=pinned,  # restored by path (not the store's): nothing pinned
        updated_at=batch.now,
    )
    rt.start_command = origins.restore_command(rt, cp, decision.attempt, request_id, decision.cause)
    batch.command(rt.job_id, decision.attempt, rt.start_command)


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
        restored_state_ms=None,  # until the first epoch of the restored attempt reports them
        restored_first_record=None,
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
