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
import os
import signal
import time
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.coordinator import CheckpointCoordinator
from sparkpoint.checkpointing.pending import CompletedCheckpoint, FailedCheckpoint
from sparkpoint.checkpointing.restart import RestartStrategy
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.errors import InjectedFailure, SparkpointError
from sparkpoint.options import JobOptions
from sparkpoint.runtime.execution import EpochRunner, JobExecution
from sparkpoint.runtime.recovery import (
    RestorePoint,
    check_restore_point,
    checkpoint_metadata,
    restore_point_from_metadata,
    storage_for_checkpoint_path,
)
from sparkpoint.runtime.spark import EpochFailedError


class JobFailedError(SparkpointError):
    """The job failed and its restart strategy allows no more restarts."""


class Authority(abc.ABC):
    """Drives a job: which barrier each epoch carries, completions, failovers, its end."""

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


def config_summary(options: JobOptions, restart: RestartStrategy) -> dict[str, Any]:
    """The configuration a job registers with (``job_registered``)."""
    c = options.checkpoint
    return {
        "mode": c.mode.value,
        "interval_ms": c.interval_ms,
        "timeout_ms": c.timeout_ms,
        "min_pause_ms": c.min_pause_ms,
        "max_concurrent": c.max_concurrent,
        "tolerable_failures": c.tolerable_failures,
        "retained": c.retained,
        "checkpoint_storage": options.checkpoint_storage,
        "checkpoint_dir": options.checkpoint_dir,
        "state_backend": options.state_backend,
        "max_parallelism": options.max_parallelism,
        "restart_strategy": restart.to_config(),
    }


def registration(
    job: JobExecution,
    restart: RestartStrategy,
    *,
    incarnation: str | None = None,
    extra_config: dict[str, Any] | None = None,
) -> p.JobRegistered:
    """The ``job_registered`` event of a job (graph, configuration, restart strategy)."""
    return p.JobRegistered(
        job_name=job.graph.name,
        vertices=job.graph.vertices(),
        edges=job.graph.edges(),
        config={**config_summary(job.options, restart), **(extra_config or {})},
        incarnation=incarnation,
    )


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
        self.initial_point: RestorePoint | None = None  # --from-checkpoint, the fallback
        self.initial_storage: CheckpointStorage | None = None
        self.finished = False

    def prepare(self) -> None:
        """Read ``--from-checkpoint`` before Spark starts, so that a wrong path fails at once."""
        if self.options.from_checkpoint:
            point = restore_point_from_metadata(self.storage, self.options.from_checkpoint)
            check_restore_point(point, self.job.graph)
            self.initial_point = point

    def run(self, runner: EpochRunner) -> None:
        """Steps: (1) register, (2) remove checkpoints without ``_metadata``, (3) restore
        ``--from-checkpoint``, (4) epochs until the final checkpoint committed, (5) FINISHED."""
        job = self.job
        job.attempt = self.coordinator.attempt
        # Step 1
        job.publish(registration(job, self.restart))
        # Step 2
        for cid in self.storage.cleanup_incomplete(job.job_id):
            job.publish(p.CheckpointAborted(checkpoint_id=cid, reason="no _metadata: removed"))
        # Step 3
        point = self.initial_point
        if point is not None and self.options.from_checkpoint:
            self.initial_storage = storage_for_checkpoint_path(self.options.from_checkpoint)
            self.coordinator = CheckpointCoordinator(
                job.job_id,
                job.graph.tasks(),
                self.options.checkpoint,
                job.clock,
                attempt=point.attempt + 1,
                next_checkpoint_id=point.checkpoint_id + 1,
            )
            job.attempt = self.coordinator.attempt
            job.restore(point, self.initial_storage)
        job.set_status(p.JobStatus.RUNNING)
        job.planner.start()
        # Step 4
        while not self.finished:
            self._run_one_epoch(runner)
        # Step 5
        job.set_status(p.JobStatus.FINISHED)

    def _run_one_epoch(self, runner: EpochRunner) -> None:
        job, coordinator = self.job, self.coordinator
        self._handle_failed(coordinator.expire_overdue())
        ranges = job.planner.next_ranges()
        barrier = None
        if job.planner.will_exhaust(ranges):
            pending = coordinator.trigger(is_final=True)
            ranges = job.planner.with_barrier(ranges, at_end=True)
        elif coordinator.periodic_due():
            pending = coordinator.trigger(periodic=True)
            ranges = job.planner.with_barrier(ranges, at_end=False)
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
        if outcome.failure is not None:
            self._on_failure(outcome.failure, outcome.epoch)

    # ------------------------------------------------------------------ EpochListener
    def before_acks(self) -> None:
        # A checkpoint whose timeout passed while the epoch ran: its acknowledgements are late.
        self._handle_failed(self.coordinator.expire_overdue())

    def on_decline(self, attempt: int, decline: p.CheckpointDeclined) -> None:
        failed = self.coordinator.decline(
            attempt, decline.checkpoint_id, decline.operator_id, decline.subtask, decline.reason
        )
        self._handle_failed([failed] if failed else [])

    def on_ack(self, attempt: int, ack: p.SnapshotCompleted) -> None:
        result = self.coordinator.acknowledge(attempt, ack)
        if result.discarded:  # late ack of an aborted checkpoint
            self.storage.discard(self.job.job_id, ack.checkpoint_id)
        if result.completed is not None:
            self._complete(result.completed)

    def after_acks(self) -> None:
        self._handle_failed(self.coordinator.drain_failed())

    def after_epoch(self, epoch: int) -> None:
        if self.coordinator.must_fail_job:
            raise EpochFailedError(epoch, "exceeded checkpoint tolerable failure threshold")

    # ------------------------------------------------------------------ completion, failures
    def _complete(self, cp: CompletedCheckpoint) -> None:
        """Completion order of DESIGN §1."""
        job = self.job
        # Step 1: _metadata to checkpoint storage (enough to restore from the path alone).
        try:
            cp.external_path = self.storage.write_metadata(
                job.job_id, cp.checkpoint_id, checkpoint_metadata(job.job_id, cp)
            )
        except (OSError, SparkpointError) as err:
            failed = self.coordinator.finalize_failed(
                cp.checkpoint_id, f"writing _metadata failed: {err}"
            )
            self._handle_failed([failed])
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
        # Step 4: the sinks commit the transactions of this checkpoint.
        job.commit(cp.checkpoint_id, cp.acks.values())
        if cp.is_final:
            self.finished = True

    def _handle_failed(self, failed: list[FailedCheckpoint]) -> None:
        for f in failed:
            self.storage.discard(self.job.job_id, f.checkpoint_id)
            self.job.publish(
                p.CheckpointAborted(
                    checkpoint_id=f.checkpoint_id, reason=f"{f.reason.name}: {f.message}"
                )
            )

    def _on_failure(self, cause: str, epoch: int) -> None:
        """Steps: (1) report, (2) ask the restart strategy, (3) fail over, (4) restore."""
        job = self.job
        # Step 1
        job.publish(p.TaskFailed(epoch=epoch, cause=cause))
        # Step 2
        decision = self.restart.on_failure(job.clock.now_ms())
        if not decision.restart:
            job.set_status(p.JobStatus.FAILING, cause)
            raise JobFailedError(f"job {job.job_id} failed: {cause} ({decision.message})")
        job.set_status(p.JobStatus.RESTARTING, cause)
        if decision.delay_ms > 0:
            time.sleep(decision.delay_ms / 1000)
        # Step 3
        failover = self.coordinator.failover(cause)
        job.attempt = failover.attempt
        self._handle_failed(failover.aborted)
        # Step 4: the latest completed checkpoint, else the one the job started from.
        cp = failover.restore_from
        if cp is not None:
            job.restore(RestorePoint.of(cp), None)
        else:
            job.restore(self.initial_point, self.initial_storage)
        job.set_status(p.JobStatus.RUNNING)
