"""Completing a checkpoint: its ``_metadata`` written outside the lock, then recorded.

DESIGN §1's completion order, split where the storage I/O happens: :func:`complete` decides
(under the coordination lock), the control plane writes once that unit committed (outside it,
bounded in time), and :func:`finish_completion` records the outcome in a unit of its own.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from functools import partial

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint_server.coordination.job import UNCOMMITTED_PIN, Finalizing, JobRuntime
from sparkpoint_server.errors import StorageUnavailableError
from sparkpoint_server.service import storage_io
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.decisions import (
    OK,
    discard_subsumed,
    fail_completion,
    handle_failed,
    set_status,
)
from sparkpoint_server.service.savepoints import completion_writer

log = logging.getLogger(__name__)


def complete(batch: Batch, rt: JobRuntime, cp: CompletedCheckpoint, savepoint_dir: str) -> None:
    """DESIGN §1's completion order.

    Steps: (0) pin the checkpoint while its sinks have not committed (so that a later
    completion cannot subsume it), (1) once this unit committed, write ``_metadata`` (a
    savepoint: its self-contained copy in the target directory) outside the coordination
    lock, bounded in time (see :mod:`~sparkpoint_server.service.storage_io`); when it is
    written, :func:`finish_completion` does, in a unit of its own, (2) the checkpoint's row and
    its request's, (3) after the commit: the notification that makes the sinks commit, (4)
    deleting the state of what retention subsumed.
    """
    cid = cp.checkpoint_id
    # Step 0
    needs_commit = {key for key, ack in cp.acks.items() if ack.sink_transactions}
    if needs_commit:
        rt.uncommitted[cid] = needs_commit
        rt.coordinator.store.pin(cid, UNCOMMITTED_PIN)
    # Step 1
    target = rt.savepoint_targets.pop(cid, None) or savepoint_dir
    rt.finalizing[cid] = Finalizing(cp, target)
    batch.completions.append((rt, cid))
    batch.writer.checkpoint(
        rt.job_id,
        cid,
        num_acknowledged_subtasks=len(cp.acks),
        latest_ack_timestamp=max(a.ack_timestamp for a in cp.acks.values()),
    )


def complete_and_subsume(
    batch: Batch, rt: JobRuntime, cp: CompletedCheckpoint, savepoint_dir: str
) -> None:
    """Every subtask acknowledged ``cp``: :func:`complete` it, and fail the pending
    checkpoints its completion subsumed."""
    complete(batch, rt, cp, savepoint_dir)
    handle_failed(batch, rt, rt.coordinator.drain_failed())


def start_write(rt: JobRuntime, cid: int, timeout_s: float) -> Future[object] | None:
    """Start step 1 of :func:`complete` (once its unit committed): write the ``_metadata`` on
    a thread of its own, bounded by ``timeout_s``. Returns its future, None when it started
    before or the completion was finished meanwhile.

    A write that cannot even start (its metadata cannot be built, no thread) ends at once as a
    failed write: the completion fails with that cause, as one whose write failed does, and
    the job's later completions, which wait for it, go on.
    """
    entry = rt.finalizing.get(cid)
    if entry is None or entry.written is not None:
        return None
    cp = entry.checkpoint
    what = (  # the failure message names the job and the checkpoint already
        f"writing savepoint {cid} to {entry.savepoint_target}"
        if cp.is_savepoint
        else f"writing _metadata of checkpoint {cid}"
    )
    try:
        write = completion_writer(rt.job_id, cp, rt.storage, entry.savepoint_target)
        entry.written = storage_io.start(what, timeout_s, write)
    except Exception as err:
        log.exception("job %s: %s could not start", rt.job_id, what)
        failure = StorageUnavailableError(f"{what}: {type(err).__name__}: {err}")
        failure.__cause__ = err
        entry.written = Future()
        entry.written.set_exception(failure)
    return entry.written


def ready_completions(rt: JobRuntime) -> list[int]:
    """The completions whose write ended and that may finish now, in id order: a completion
    waits for the earlier ones of its job (a write taken back waits for nobody)."""
    ready = []
    for cid in sorted(rt.finalizing):
        entry = rt.finalizing[cid]
        if entry.done:
            ready.append(cid)
        elif not entry.taken_back:
            break
    return ready


def finish_completion(batch: Batch, rt: JobRuntime, cid: int) -> None:
    """Steps (2)-(4) of :func:`complete` once the write ended; a completion whose write failed
    (whatever the storage raised, or its timeout) fails alone as FINALIZE_CHECKPOINT_FAILURE
    with that cause."""
    entry = rt.finalizing.pop(cid)
    cp = entry.checkpoint
    if entry.taken_back:  # it failed already; what the write left goes
        batch.later(partial(rt.storage.discard, rt.job_id, cid))
        return
    try:
        cp.external_path, relocated = entry.written.result()
    except Exception as err:
        fail_completion(batch, rt, cp, str(err))
        return
    if relocated is not None:  # a savepoint: its state now lives in its own directory
        cp.acks.clear()
        cp.acks.update(relocated)
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
