"""Who decides about checkpoints and restarts: the authority interface and the in-process one.

DESIGN §1: one authority assigns checkpoint ids and trigger timestamps, completes checkpoints,
applies the failure policy and the restart strategy, and names the checkpoint that every
(re)start restores. :class:`InProcessAuthority` is that authority inside the driver
(``--standalone``): a :class:`~sparkpoint.checkpointing.coordinator.CheckpointCoordinator`
and a restart strategy. The control plane's stand-in is
:class:`~sparkpoint.runtime.connected.ControlPlaneAuthority`. Either drives a
:class:`~sparkpoint.runtime.execution.JobExecution`, which does the job's side.
"""

from __future__ import annotations

import abc
import logging
import os
import signal
import time
from functools import partial

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.coordinator import CheckpointCoordinator
from sparkpoint.checkpointing.expiry import EpochEnds
from sparkpoint.checkpointing.pending import (
    CheckpointFailureReason,
    CompletedCheckpoint,
    FailedCheckpoint,
)
from sparkpoint.checkpointing.restart import RestartStrategy
from sparkpoint.checkpointing.savepoints import write_savepoint
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.errors import (
    CorruptSnapshotError,
    InjectedFailure,
    SparkpointError,
)
from sparkpoint.protocol_types import CheckpointKind
from sparkpoint.runtime.epochs import EpochRunner
from sparkpoint.runtime.execution import JobExecution
from sparkpoint.runtime.failover import failover_region, restore_error
from sparkpoint.runtime.planner import holds_records
from sparkpoint.runtime.recovery import (
    RestorePoint,
    check_restore_point,
    checkpoint_metadata,
    restore_point_from_metadata,
    storage_for_checkpoint_path,
)
from sparkpoint.runtime.registration import job_guarantee, registration
from sparkpoint.runtime.spark import EpochFailedError
from sparkpoint.runtime.standalone_failover import JobFailedError as JobFailedError  # re-export
from sparkpoint.runtime.standalone_failover import StandaloneFailover

log = logging.getLogger(__name__)

#: How long a standalone job waits for a record before it looks at its signals and timers
#: again (an idle source).
IDLE_POLL_MS = 100


class JobCanceledError(SparkpointError):
    """A signal (SIGTERM, SIGINT) canceled the job: it stopped at an epoch boundary."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class Authority(abc.ABC):
    """Drives a job: which barrier each epoch carries, completions, failovers, its end.

    A cancel (the driver got SIGTERM or SIGINT) arrives through :meth:`request_cancel`, from a
    signal handler: an authority checks :attr:`cancel_requested` between epochs (and while it
    waits to restart) and then ends the job CANCELED without starting another epoch.
    """

    _cancel_requested = False
    #: ``EpochListener.acks_carry_barrier_events``: a standalone job publishes every event.
    acks_carry_barrier_events = False

    @abc.abstractmethod
    def prepare(self) -> None:
        """Before Spark starts: what can fail fast (a wrong checkpoint path, no answer)."""

    @abc.abstractmethod
    def run(self, runner: EpochRunner) -> None:
        """Run epochs until the job ends with FINISHED or CANCELED set.

        Raises:
            JobFailedError: the job failed for good.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def request_cancel(self) -> None:
        """Ask the job to stop at the next epoch boundary (safe inside a signal handler)."""
        self._cancel_requested = True

    @property
    def cancel_requested(self) -> bool:
        """Whether :meth:`request_cancel` was called."""
        return self._cancel_requested

    def wait_unless_canceled(self, delay_ms: float) -> None:
        """Sleep ``delay_ms`` (a restart delay), returning early once a cancel is requested."""
        deadline = time.monotonic() + delay_ms / 1000
        while not self._cancel_requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))


class InProcessAuthority(Authority):
    """``--standalone``: the coordinator and the restart strategy run inside the driver."""

    def __init__(
        self,
        job: JobExecution,
        restart: RestartStrategy,
        storage: CheckpointStorage,
    ) -> None:
        self.job = job
        self.options = job.options
        self.restart = restart
        self.storage = storage
        self.coordinator = CheckpointCoordinator(
            job.job_id, job.graph.tasks(), job.options.checkpoint, job.clock
        )
        self._stopping = False  # a signal asked for a stop with savepoint
        self._epoch_ends = EpochEnds()  # tells why a checkpoint expired
        self.initial_point: RestorePoint | None = None  # --from-checkpoint, the fallback
        self.initial_storage: CheckpointStorage | None = None
        self.finished = False
        self.failover = StandaloneFailover(self)

    def prepare(self) -> None:
        """Read ``--from-checkpoint`` before Spark starts, so that a wrong path fails at once.
        It is read where it is, whatever storage the job checkpoints to (Flink's ``-s``): a
        savepoint restores into a job whose checkpoints stay in memory."""
        if self.options.from_checkpoint:
            self.initial_storage = storage_for_checkpoint_path(self.options.from_checkpoint)
            point = restore_point_from_metadata(self.initial_storage, self.options.from_checkpoint)
            self.initial_point = check_restore_point(
                point,
                self.job.graph,
                allow_non_restored_state=self.options.allow_non_restored_state,
            )

    def run(self, runner: EpochRunner) -> None:
        """Steps: (1) register, (2) remove checkpoints without ``_metadata``, (3) continue the
        ids and attempts found in checkpoint storage and restore ``--from-checkpoint``, (4)
        epochs until the final checkpoint committed or a cancel, (5) FINISHED or CANCELED."""
        job = self.job
        job.attempt = self.coordinator.attempt
        # Step 1
        job.publish(registration(job, self.restart))
        # A guarantee weaker than exactly-once is a warning: shown on stderr without logging set up.
        guarantee = job_guarantee(job)
        weak = guarantee.level != "exactly_once"
        log.log(
            logging.WARNING if weak else logging.INFO,
            "job %s: end-to-end %s",
            job.job_id,
            guarantee.describe(),
        )
        # Step 2
        removed = self.storage.cleanup_incomplete(job.job_id)
        for cid in removed:
            job.publish(p.CheckpointAborted(checkpoint_id=cid, reason="no _metadata: removed"))
        # Step 3: ids and attempts only increase, also past what an earlier driver of this job
        # left in storage (restoring chk-3 while chk-10 exists must not write chk-4 again, nor
        # reuse an attempt that names committed sink parts).
        point = self.initial_point
        last_id, last_attempt = self._last_in_storage(removed)
        if point is not None:
            last_id = max(last_id, point.checkpoint_id)
            last_attempt = max(last_attempt, point.attempt)
        if last_id > 0 or last_attempt > 0:
            self.coordinator = CheckpointCoordinator(
                job.job_id,
                job.graph.tasks(),
                self.options.checkpoint,
                job.clock,
                attempt=last_attempt + 1,
                next_checkpoint_id=last_id + 1,
            )
            job.attempt = self.coordinator.attempt
        if point is not None and self.options.from_checkpoint:
            error = restore_error(partial(job.restore, point, self.initial_storage))
            if error is not None:  # the failover restores it again when it can
                cause = f"restore of {self.options.from_checkpoint} failed: {error}"
                self.failover.on_failure(cause, job.epoch)
        job.set_status(p.JobStatus.RUNNING)
        job.planner.start()
        # Step 4
        while not self.finished and not self.cancel_requested:
            self._run_one_epoch(runner)
        if not self.finished and self.options.savepoint_on_finish:
            self._stop_with_savepoint(runner)
        # Step 5
        if self.finished:
            job.set_status(p.JobStatus.FINISHED)
        else:
            self._cancel()

    def _last_in_storage(self, removed: list[int]) -> tuple[int, int]:
        """The highest checkpoint id in the job's own storage (``removed``: incomplete ones
        just removed) and the attempt of its latest completed checkpoint (0: none)."""
        job_id = self.job.job_id
        completed = self.storage.completed_checkpoint_ids(job_id)
        last_id = max([0, *completed, *removed])
        if not completed:
            return last_id, 0
        try:
            meta = self.storage.read_checkpoint_metadata(job_id, completed[-1])
            return last_id, int(meta.get("attempt", 0))
        except (OSError, SparkpointError, ValueError, TypeError) as err:
            raise CorruptSnapshotError(
                f"job {job_id}: cannot read the attempt of checkpoint {completed[-1]}: {err}"
            ) from err

    def _stop_with_savepoint(self, runner: EpochRunner) -> None:
        """A signal asked a job with ``--savepoint-on-finish`` to stop: as Flink's ``stop``,
        the next epoch ends with a final savepoint, then the job is FINISHED (its sources are
        not drained: event time does not end). A second signal cancels."""
        log.info("job %s: stopping with a savepoint (a second signal cancels)", self.job.job_id)
        self._stopping = True
        self._cancel_requested = False
        while not self.finished and not self.cancel_requested:
            self._run_one_epoch(runner)

    def _cancel(self) -> None:
        """Steps: (1) CANCELLING, (2) abort pending checkpoints (their ``chk-*`` directories
        go), (3) CANCELED. Transactions since the last completed checkpoint stay uncommitted:
        a restore aborts them."""
        # Step 1
        self.job.set_status(p.JobStatus.CANCELLING, "canceled by a signal")
        # Step 2
        self.handle_failed(
            self.coordinator.abort_all(
                CheckpointFailureReason.CHECKPOINT_COORDINATOR_SHUTDOWN, "the job was canceled"
            )
        )
        # Step 3
        self.job.set_status(p.JobStatus.CANCELED, "canceled by a signal")

    def _run_one_epoch(self, runner: EpochRunner) -> None:
        job, coordinator = self.job, self.coordinator
        self.handle_failed(coordinator.expire_overdue(why=self._epoch_ends.why_expired))
        ending = job.planner.exhausted() or self._stopping
        if ending and (wait_ms := coordinator.final_wait_ms()) > 0:
            # The last final checkpoint failed: the next waits (TriggerTiming.final_wait).
            self.wait_unless_canceled(min(wait_ms, IDLE_POLL_MS))
            return
        ranges = job.planner.next_ranges(wait_ms=IDLE_POLL_MS)
        barrier = None
        if job.planner.will_exhaust(ranges) or self._stopping:
            target = self.options.savepoint_on_finish
            kind = CheckpointKind.SAVEPOINT if target else CheckpointKind.CHECKPOINT
            pending = coordinator.trigger(kind, is_final=True, target_directory=target)
            ranges = job.planner.with_barrier(ranges, at_end=True)
        elif coordinator.periodic_due() and (job.planner.started or not holds_records(ranges)):
            # Not in the first epoch of records, which starts the Python workers: as Flink
            # triggers once the tasks run, the first checkpoint rides the next, bounded epoch.
            pending = coordinator.trigger(periodic=True)
            ranges = job.planner.with_barrier(ranges, at_end=False)
        elif not holds_records(ranges):  # an idle source: the loop sees a signal, expiries
            return
        else:
            pending = None
        if pending is not None:
            barrier = CheckpointBarrier(
                pending.checkpoint_id, pending.trigger_timestamp, pending.kind, pending.is_final
            )
            job.publish(
                p.CheckpointTriggered(
                    checkpoint_id=pending.checkpoint_id,
                    kind=pending.kind,
                    trigger_timestamp=pending.trigger_timestamp,
                    epoch=job.epoch,
                    is_final=pending.is_final,
                )
            )
        outcome = job.run_epoch(runner, ranges, barrier, self)
        self._epoch_ends.ended(job.attempt, outcome.epoch, job.clock.now_ms())
        if outcome.failure is not None:
            failed = outcome.failed
            vertex = failed[0] if failed is not None else None
            region = failover_region(job.graph, self.options.failover_strategy, vertex)
            if not outcome.recoverable:
                self.failover.fail_for_good(outcome.failure, outcome.epoch, failed)
            elif region is None or failed is None:  # the whole job: every job of one region
                self.failover.on_failure(outcome.failure, outcome.epoch, failed)
            else:
                self.failover.on_region_failure(outcome.failure, outcome.epoch, region, failed)

    # ------------------------------------------------------------------ EpochListener
    def before_acks(self) -> None:
        # A checkpoint whose timeout passed while the epoch ran: its acknowledgements are late.
        self.handle_failed(self.coordinator.expire_overdue(why=self._epoch_ends.why_expired))

    def on_decline(self, attempt: int, decline: p.CheckpointDeclined) -> None:
        failed = self.coordinator.decline(
            attempt,
            decline.checkpoint_id,
            decline.operator_id,
            decline.subtask,
            decline.reason,
            asynchronous=decline.asynchronous,
        )
        self.handle_failed([failed] if failed else [])

    def on_ack(self, attempt: int, ack: p.SnapshotCompleted) -> None:
        result = self.coordinator.acknowledge(attempt, ack)
        if result.discarded:  # late ack of an aborted checkpoint
            self.storage.discard(self.job.job_id, ack.checkpoint_id)
        if result.completed is not None:
            self._complete(result.completed)

    def after_acks(self) -> None:
        self.handle_failed(self.coordinator.drain_failed())

    def after_epoch(self, epoch: int) -> None:
        if self.coordinator.must_fail_job:  # the cause names the last checkpoint and why
            cause = self.coordinator.must_fail_cause
            raise EpochFailedError(
                epoch, cause or "exceeded checkpoint tolerable failure threshold"
            )

    # ------------------------------------------------------------------ completion, failures
    def _complete(self, cp: CompletedCheckpoint) -> None:
        """Completion order of DESIGN §1."""
        job = self.job
        # Step 1: _metadata to checkpoint storage (enough to restore from the path alone); a
        # savepoint (--savepoint-on-finish) is copied into its own directory instead.
        try:
            if cp.is_savepoint and self.options.savepoint_on_finish:
                self._write_savepoint(cp, self.options.savepoint_on_finish)
            else:
                cp.external_path = self.storage.write_metadata(
                    job.job_id, cp.checkpoint_id, checkpoint_metadata(job.job_id, cp)
                )
        except (OSError, SparkpointError) as err:
            failed = self.coordinator.finalize_failed(
                cp.checkpoint_id, f"writing _metadata failed: {err}"
            )
            self.handle_failed([failed])
            return
        # Step 2: record it (standalone: the coordinator's completed-checkpoint store).
        job.completed.append(cp.checkpoint_id)
        job.publish(
            p.CheckpointCompleted(
                checkpoint_id=cp.checkpoint_id,
                kind=cp.kind,
                external_path=cp.external_path,
                trigger_timestamp=cp.trigger_timestamp,
                completion_timestamp=cp.completion_timestamp,
                end_to_end_duration_ms=cp.end_to_end_duration_ms,
                state_size=cp.state_size,
            )
        )
        for old in self.coordinator.drain_subsumed():
            self.storage.discard(job.job_id, old.checkpoint_id)
        # Step 3: notify the job (in-process here).
        if (
            self.options.crash_after_checkpoint == cp.checkpoint_id
            and self.options.from_checkpoint is None
        ):
            os.kill(os.getpid(), signal.SIGKILL)  # testing hook: a driver crash, for real
        f = job.failure
        if (
            f is not None
            and f.where == "before_commit"
            and f.attempt == cp.attempt
            and f.checkpoint_id == cp.checkpoint_id
        ):
            raise InjectedFailure(
                f"injected failure after checkpoint {cp.checkpoint_id} completed, before its "
                "sink transactions were committed"
            )
        # Step 4: the sinks commit the transactions of this checkpoint. One that cannot (its
        # database away) fails the epoch: the restart strategy decides, and the restore
        # commits them again (the checkpoint is complete), as for a connected job.
        try:
            job.commit(cp.checkpoint_id, cp.acks.values())
        except Exception as err:  # a sink's error of any kind
            raise EpochFailedError(
                job.epoch, f"committing checkpoint {cp.checkpoint_id} failed: {err}"
            ) from err
        if cp.is_final:
            self.finished = True

    def _write_savepoint(self, cp: CompletedCheckpoint, target: str) -> None:
        """Copy a completed savepoint into ``target`` (its handles then point at the copy,
        so that a restore before the job ends reads it) and drop its checkpoint directory."""
        job_id = self.job.job_id
        cp.external_path, cp.acks = write_savepoint(job_id, cp, dict(cp.acks), self.storage, target)
        self.storage.discard(job_id, cp.checkpoint_id)
        log.info("job %s: savepoint %d written to %s", job_id, cp.checkpoint_id, cp.external_path)

    def restore_point(
        self, cp: CompletedCheckpoint | None
    ) -> tuple[RestorePoint | None, CheckpointStorage | None]:
        """What a failover restores: ``cp`` (in the job's own storage), else the checkpoint
        the job started from (``--from-checkpoint``, where it is), else the beginning."""
        if cp is not None:
            return RestorePoint.of(cp), None
        return self.initial_point, self.initial_storage

    def handle_failed(self, failed: list[FailedCheckpoint]) -> None:
        for f in failed:
            self.storage.discard(self.job.job_id, f.checkpoint_id)
            self.job.publish(
                p.CheckpointAborted(
                    checkpoint_id=f.checkpoint_id, reason=f"{f.reason.name}: {f.message}"
                )
            )
