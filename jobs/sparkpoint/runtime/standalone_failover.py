"""What a standalone job does when an epoch fails: the in-process authority's failover.

Flink's ``DefaultScheduler`` for one driver: the failure is reported, the restart strategy
decides (a failure no restart can fix fails the job at once), the latest completed checkpoint
whose state files verify is chosen, and the job, or the failed subtask's region, restores it.
A restore that fails is one more failure. The connected driver leaves all of this to the
control plane (``sparkpoint_server.service.decisions``).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import FailoverDecision
from sparkpoint.checkpointing.restart import SUPPRESSED
from sparkpoint.errors import CorruptSnapshotError, SparkpointError
from sparkpoint.job_graph import Region
from sparkpoint.runtime.failover import restore_error, task_failed
from sparkpoint.runtime.recovery import newest_restorable, verify_restore_point

if TYPE_CHECKING:
    from sparkpoint.runtime.authority import InProcessAuthority

log = logging.getLogger(__name__)


class JobFailedError(SparkpointError):
    """The job failed and its restart strategy allows no more restarts."""


class StandaloneFailover:
    """The failures of one standalone job, decided and recovered in the driver."""

    def __init__(self, authority: InProcessAuthority) -> None:
        self.authority = authority

    def fail_for_good(self, cause: str, epoch: int, failed: tuple[str, int] | None) -> None:
        """A failure that no restart can fix (a task's configuration error): reported, and the
        job fails without asking its restart strategy (Flink's SuppressRestartsException)."""
        job = self.authority.job
        job.publish(task_failed(epoch, cause, failed, None, recoverable=False))
        job.set_status(p.JobStatus.FAILING, cause)
        raise JobFailedError(f"job {job.job_id} failed: {cause} ({SUPPRESSED.message})")

    def on_failure(self, cause: str, epoch: int, failed: tuple[str, int] | None = None) -> None:
        """Steps: (1) report (naming the subtask that raised it, when known), (2) ask the
        restart strategy, (3) fail over, (4) restore. A restore that fails (a sink's database
        away while its transactions are committed again) is one more failure, from step 1, as
        the control plane decides it for a connected job (Flink: a task that fails to restore
        its state fails again, and the restart strategy decides)."""
        a, job = self.authority, self.authority.job
        while True:
            # Steps 1 and 2
            if not self._restart_decided(cause, epoch, failed, None):
                return  # run() cancels; a later restore starts from the latest checkpoint
            # Step 3: the latest completed checkpoint whose state files verify.
            failover, note = self._failover(cause)
            job.attempt = failover.attempt
            a.handle_failed(failover.aborted)
            # Step 4: that checkpoint, else the one the job started from.
            point, storage = a.restore_point(failover.restore_from)
            error = restore_error(partial(job.restore, point, storage))
            if error is None:
                job.set_status(p.JobStatus.RUNNING, note)
                return
            cause = f"restore of attempt {job.attempt} failed: {error}"
            epoch, failed = job.epoch, None

    def on_region_failure(
        self, cause: str, epoch: int, region: Region, failed: tuple[str, int]
    ) -> None:
        """As :meth:`on_failure`, restoring only ``region`` (Flink's region failover): the
        restart strategy counts it as a restart, pending checkpoints are aborted (each covers
        every vertex), the other regions keep their working state and attempt. A restore of
        the region that fails restarts the whole job."""
        a, job = self.authority, self.authority.job
        # Steps 1 and 2
        if not self._restart_decided(cause, epoch, failed, region):
            return
        # Step 3
        failover, note = self._failover(cause)
        previous, job.attempt = job.attempt, failover.attempt
        a.handle_failed(failover.aborted)
        # Step 4
        point, storage = a.restore_point(failover.restore_from)
        error = restore_error(partial(job.restore_region, region, point, storage, previous, epoch))
        if error is not None:
            self.on_failure(f"restore of region {region.name} failed: {error}", job.epoch)
            return
        restarted = f"region {region.name} ({', '.join(region.vertices)}) restarted"
        job.set_status(p.JobStatus.RUNNING, f"{note}; {restarted}" if note else restarted)

    def _restart_decided(
        self, cause: str, epoch: int, failed: tuple[str, int] | None, region: Region | None
    ) -> bool:
        """Report a failure and ask the restart strategy; wait its delay. False: the job was
        canceled meanwhile.

        Raises:
            JobFailedError: the strategy allows no more restarts (FAILING).
        """
        a, job = self.authority, self.authority.job
        job.publish(task_failed(epoch, cause, failed, region))
        decision = a.restart.on_failure(job.clock.now_ms())
        if not decision.restart:
            job.set_status(p.JobStatus.FAILING, cause)
            raise JobFailedError(f"job {job.job_id} failed: {cause} ({decision.message})")
        job.set_status(p.JobStatus.RESTARTING, cause)
        a.wait_unless_canceled(decision.delay_ms)
        return not a.cancel_requested

    def _failover(self, cause: str) -> tuple[FailoverDecision, str | None]:
        """The coordinator's failover to its latest checkpoint, or, when that one's state
        files are corrupt or missing, to the newest that verifies (and a note saying which
        were skipped and why: the job's RUNNING cause and a log line).

        Raises:
            JobFailedError: no retained checkpoint verifies (restoring the beginning instead
                would produce the output they committed again), or none is retained and the
                ``--from-checkpoint`` one does not verify.
        """
        a, job = self.authority, self.authority.job
        chosen, skipped = newest_restorable(a.coordinator.store.all(), a.storage)
        if not skipped and chosen is None and a.initial_point is not None:
            try:  # no checkpoint yet: the one the job started from, if it can be restored
                verify_restore_point(a.initial_point, a.initial_storage or a.storage)
            except CorruptSnapshotError as err:
                skipped.append(str(err))
        if not skipped:
            return a.coordinator.failover(cause), None
        for why in skipped:
            log.warning("job %s: %s", job.job_id, why)
        if chosen is None:
            job.set_status(p.JobStatus.FAILING, cause)
            raise JobFailedError(
                f"job {job.job_id} failed: {cause}; no checkpoint can be restored: "
                f"{'; '.join(skipped)}"
            )
        note = (
            f"restored {chosen.kind.value} {chosen.checkpoint_id} instead of the latest: "
            f"{'; '.join(skipped)} (output committed since {chosen.checkpoint_id} is produced "
            "again)"
        )
        log.warning("job %s: %s", job.job_id, note)
        return a.coordinator.restore_from(chosen, cause), note
