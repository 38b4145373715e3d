"""What a failover restores: the newest retained checkpoint whose state files verify.

A retained checkpoint with a missing or altered file (a lost shared file of incremental
state) would fail every restore of it, so a failover skips it, as the standalone authority
does (``InProcessAuthority._failover``), and says which it skipped and why: in a warning, and
in the job's exception history (``UNRESTORABLE_CHECKPOINT``, its action naming the checkpoint
restored instead). When no retained checkpoint verifies, the job fails with a cause naming
the files, rather than start from the beginning and produce again what they committed.

The files are checked outside the coordination lock, bounded by the storage timeout (see
:mod:`~sparkpoint_server.service.storage_io`), newest first until one verifies:

- a due restart (a timer): the tick that finds it due starts the check on a thread of its
  own (:class:`FailoverCheck`); the check's end ticks again, and that tick restarts the job
  from what the check found;
- a restarted driver's registration: the ingest checks before it takes the lock, as it reads
  a new job's ``--from-checkpoint``.

A checkpoint the check did not reach (one that completed after the check started) is
restored without a check, as before checks existed; so is every checkpoint when the storage
did not answer (the restored driver verifies them again and fails over if they are damaged).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.errors import SparkpointError
from sparkpoint.runtime.recovery import newest_restorable
from sparkpoint.transport import ReceivedMessage
from sparkpoint_server.coordination.job import JobRuntime
from sparkpoint_server.errors import StorageUnavailableError
from sparkpoint_server.service import attempts, origins, storage_io
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.recovery import load_job
from sparkpoint_server.storage.models import Job

if TYPE_CHECKING:
    from sparkpoint_server.service.control_plane import ControlPlane

log = logging.getLogger(__name__)

#: Checkpoint id -> why it cannot be restored (None: its files verified).
Verdicts = dict[int, str | None]
UNRESTORABLE = "UNRESTORABLE_CHECKPOINT"


def target_name(rt: JobRuntime) -> str:
    """Under the lock: what a failover restores now (unless its files fail the check)."""
    kept = origins.candidates(rt)
    if kept:
        return f"{kept[0].kind.value} {kept[0].checkpoint_id}"
    if rt.origin is not None and rt.origin.path is not None:
        return f"checkpoint {rt.origin.checkpoint_id} at {rt.origin.path}"
    return "the beginning"


def verify(checkpoints: Iterable[CompletedCheckpoint], storage: CheckpointStorage) -> Verdicts:
    """Storage I/O (outside the lock): check the checkpoints' files newest first, until one
    verifies (:func:`~sparkpoint.runtime.recovery.newest_restorable`, whose wording the
    verdicts keep). An error other than a missing, altered or misplaced file ends the check:
    the checkpoints it did not reach are restored without one."""
    verdicts: Verdicts = {}
    for cp in checkpoints:
        try:
            chosen, skipped = newest_restorable([cp], storage)
        except Exception as err:  # any protocol may raise anything: unknown, not damaged
            failure = f"{type(err).__name__}: {err}"
            log.warning("checking checkpoint %d failed: %s", cp.checkpoint_id, failure)
            break
        verdicts[cp.checkpoint_id] = None if chosen is not None else skipped[0]
        if chosen is not None:
            break
    return verdicts


def check_registrations(
    plane: ControlPlane, messages: list[ReceivedMessage]
) -> dict[str, Verdicts]:
    """Before the ingest takes the lock: the verdicts on the checkpoints that a failover of
    each job whose driver registers again may restore, bounded by the storage timeout (none
    for a job whose storage did not answer)."""
    verdicts: dict[str, Verdicts] = {}
    for m in messages:
        job_id = m.envelope.job_id
        if not isinstance(m.payload, p.JobRegistered) or job_id in verdicts:
            continue
        rt = _registered_job(plane, job_id)
        if rt is None or rt.incarnation == m.payload.incarnation:
            continue  # a new job, or a duplicate registration: no failover
        with plane.lock:
            checkpoints = origins.candidates(rt)
        what = f"job {job_id}: checking the retained checkpoints' files"
        try:
            verdicts[job_id] = storage_io.call(
                what, plane.storage_timeout_s, verify, checkpoints, rt.storage
            )
        except StorageUnavailableError as err:
            log.warning("%s; a failover restores the latest checkpoint unchecked", err)
    return verdicts


def _registered_job(plane: ControlPlane, job_id: str) -> JobRuntime | None:
    """The job's runtime, or, for a job that ended, the one its next unit loads again."""
    with plane.lock:
        rt = plane.jobs.get(job_id)
    if rt is not None:
        return rt
    with plane.sessions() as session:
        row = session.get(Job, job_id)
        if row is None:
            return None
        try:
            return load_job(session, row, plane.clock, plane.checkpoint_dir)
        except SparkpointError as err:  # the unit that loads it again says why
            log.warning("job %s: cannot check its checkpoints: %s", job_id, err)
            return None


@dataclass
class FailoverCheck:
    """The check of a due restart's checkpoints, running outside the lock.

    Attributes:
        due_at: the ``restart_due_at`` of the restart it was started for.
        attempt: the job attempt that restart ends.
        future: the verdicts (a StorageUnavailableError when the storage did not answer).
        settled: the tick after the check's end ran (what ``ControlPlane.wait_idle`` waits
            for).
    """

    due_at: int
    attempt: int
    future: Future[Verdicts]
    settled: bool = False

    @classmethod
    def start(cls, rt: JobRuntime, timeout_s: float) -> FailoverCheck:
        """Under the lock: start checking the checkpoints of ``rt``'s due restart."""
        assert rt.restart_due_at is not None
        what = f"job {rt.job_id}: checking the retained checkpoints' files"
        future = storage_io.start(what, timeout_s, verify, origins.candidates(rt), rt.storage)
        return cls(rt.restart_due_at, rt.attempt, future)

    def verdicts(self) -> Verdicts:
        try:
            return self.future.result()
        except StorageUnavailableError as err:
            log.warning("%s; the failover restores the latest checkpoint unchecked", err)
            return {}


# ----------------------------------------------------------------------------- decisions


def restart_now(batch: Batch, rt: JobRuntime, verdicts: Verdicts) -> None:
    """A due restart: the next attempt restores the newest retained checkpoint that verifies."""
    fail_over(batch, rt, rt.restart_cause or "restart", verdicts)


def fail_over(batch: Batch, rt: JobRuntime, cause: str, verdicts: Verdicts) -> None:
    """Start the next attempt from the newest retained checkpoint whose files verified.

    Steps: (1) completions whose ``_metadata`` is still being written fail (only written
    checkpoints restore), (2) the newest retained checkpoint the check did not refuse, and
    why each newer one was skipped, (3a) none skipped: the coordinator's failover to the
    latest, (3b) some skipped: record which and why, restore the one found, (3c) none left:
    the job fails, naming the files.
    """
    # Step 1
    d.take_back_completions(batch, rt, f"the job failed over ({cause})")
    # Step 2
    chosen, skipped = _choose(rt, verdicts)
    # Step 3a
    if not skipped:
        attempts.start_attempt(
            batch, rt, rt.coordinator.failover_to(chosen, cause), request_id=None
        )
        return
    for why in skipped:
        log.warning("job %s: %s", rt.job_id, why)
    origin = rt.origin  # restored by its path when the store does not hold it
    by_path = (
        origin is not None
        and origin.path is not None
        and origins.held(rt, origin.checkpoint_id, origin.path) is None
    )
    # Step 3c
    if chosen is None and not by_path:
        action = "no restart: no retained checkpoint can be restored"
        _record(batch, rt, f"{rt.attempt}:none", skipped, action)
        d.fail_for_good(batch, rt, f"{cause}; no checkpoint can be restored: {'; '.join(skipped)}")
        return
    # Step 3b: the one found, or the origin by its path (checked by the driver that reads it)
    if chosen is not None:
        decision = rt.coordinator.restore_from(chosen, cause)
        restored, since = f"{chosen.kind.value} {chosen.checkpoint_id}", chosen.checkpoint_id
    else:
        assert origin is not None
        decision = rt.coordinator.failover_to(None, cause)
        restored = f"checkpoint {origin.checkpoint_id} at {origin.path} (its origin)"
        since = origin.checkpoint_id
    action = (
        f"restored {restored} instead of the latest (output committed since {since} is "
        "produced again)"
    )
    log.warning("job %s: %s: %s", rt.job_id, action, "; ".join(skipped))
    _record(batch, rt, str(decision.attempt), skipped, action)
    attempts.start_attempt(batch, rt, decision, request_id=None)


def _choose(rt: JobRuntime, verdicts: Verdicts) -> tuple[CompletedCheckpoint | None, list[str]]:
    """The newest candidate without a refusal, and the refusals of newer ones."""
    skipped: list[str] = []
    for cp in origins.candidates(rt):
        why = verdicts.get(cp.checkpoint_id)
        if why is None:
            return cp, skipped
        skipped.append(why)
    return None, skipped


def _record(batch: Batch, rt: JobRuntime, key: str, skipped: list[str], action: str) -> None:
    batch.writer.exception(
        f"{rt.job_id}:restore:{key}",
        job_id=rt.job_id,
        attempt=rt.attempt,
        timestamp=batch.now,
        kind=UNRESTORABLE,
        cause="; ".join(skipped),
        action=action,
    )
