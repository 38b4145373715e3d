"""Connected mode: the control plane is the authority, and the driver obeys its commands.

The conversation of ``docs/control-plane.md`` ("A job's life"): the driver registers, waits
for its first ``restore``, then runs epochs, reading its command stream before each one (and,
while one runs, obeying the completions and triggers that need not wait for it: see
:mod:`~sparkpoint.runtime.epoch_commands`). The control plane assigns checkpoint ids and
trigger timestamps, completes checkpoints (it writes ``_metadata`` and owns checkpoint
storage) and decides every restart. The driver carries the barriers it is given, one per epoch
in id order, keeps its tasks' acknowledgements until the checkpoint completes (then the sinks
commit) or is aborted (then they are forgotten), and reports everything under its current
attempt.
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.restart import RestartStrategy
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    SparkpointError,
)
from sparkpoint.job_graph import Region
from sparkpoint.runtime.authority import Authority, JobFailedError, registration
from sparkpoint.runtime.commanded import CommandedCheckpoints, QueuedBarrier
from sparkpoint.runtime.connected_console import Waiting, settings_text
from sparkpoint.runtime.control_plane_link import ControlPlaneLink
from sparkpoint.runtime.driver_lease import DriverSupersededError
from sparkpoint.runtime.epoch_commands import EpochCommandReader
from sparkpoint.runtime.epochs import EpochRunner
from sparkpoint.runtime.execution import JobExecution
from sparkpoint.runtime.failover import failover_region, restore_error, task_failed
from sparkpoint.runtime.plan import SplitRange
from sparkpoint.runtime.planner import holds_records
from sparkpoint.runtime.recovery import (
    RestorePoint,
    check_restore_point,
    restore_point_from_metadata,
    storage_for_checkpoint_path,
)
from sparkpoint.runtime.silence import Silence
from sparkpoint.runtime.spark import SparkLostError
from sparkpoint.transport import ReceivedMessage, RedisUnreachableError, TransportError

#: How long one wait for commands blocks (back-pressure, a decision, the final checkpoint, a
#: source with nothing new: records that come meanwhile are read after it).
WAIT_MS = 100
#: How long one read blocks while the driver waits for its first ``restore``.
FIRST_ANSWER_POLL_MS = 1000


class ControlPlaneTimeoutError(SparkpointError):
    """The control plane did not answer a job's registration in time."""


class ControlPlaneAuthority(Authority):
    """Runs a job as the control plane commands (see the module docstring)."""

    # The control plane reads a subtask's barrier time and alignment from its acknowledgement.
    acks_carry_barrier_events = True

    def __init__(
        self,
        job: JobExecution,
        restart: RestartStrategy,
        link: ControlPlaneLink,
        *,
        timeout_ms: int,
    ) -> None:
        self.job = job
        self.restart = restart
        self.link = link
        self.timeout_ms = timeout_ms
        self._registered = False
        self._started = False  # the first restore was obeyed
        self._spark_ready = False  # run() began: Spark is up
        self._end: tuple[p.JobStatus, str | None] | None = None
        self._checkpoints = CommandedCheckpoints()
        self._running: QueuedBarrier | None = None  # the barrier of the epoch running now
        self._awaiting_decision = False  # after task_failed: until restore or cancel
        self._region: tuple[Region, int] | None = None  # a region failure reported, its epoch
        self._epoch_attempt = 0  # the attempt of the last epoch that ended (a heartbeat)
        self._reader = EpochCommandReader(link.channel, self._obey_while_running)
        self._silence = Silence(job)

    # ------------------------------------------------------------------ lifecycle
    def prepare(self) -> None:
        """Register and obey the control plane's first ``restore`` (before Spark starts).

        Steps: (1) take the job's lease (:mod:`.driver_lease`: no other driver runs it) and
        open the command stream, (2) send ``job_registered`` under attempt 0, (3) read
        commands until the first ``restore`` came and was obeyed.

        Raises:
            AnotherDriverError: another driver runs the job (nothing of it was touched).
            ControlPlaneTimeoutError: no ``restore`` within ``--control-plane-timeout``.
        """
        job, channel = self.job, self.link.channel
        try:
            # Step 1
            lease, canceled = self.link.lease, lambda: self.cancel_requested
            if lease and not lease.acquire(job.job_id, self.timeout_ms, self._say, canceled):
                job.status = p.JobStatus.CANCELED  # before it registered: nobody to tell
                return
            channel.open()
            # Step 2
            job.attempt = 0
            link = self.link
            announce = link.heartbeats is not None
            job.publish(
                registration(
                    job,
                    self.restart,
                    incarnation=link.incarnation,
                    extra_config={"from_checkpoint": job.options.from_checkpoint},
                ).model_copy(
                    update={
                        "heartbeat_interval_ms": link.heartbeat_interval_ms if announce else None,
                        "previous_failure": link.previous_failure,
                        "first_epoch_heartbeat": True,
                    }
                )
            )
            self._registered = True
            if link.heartbeats is not None:  # from now on, for the life of this process
                link.heartbeats.start(lambda: job.attempt, job.clock)
            # Step 3
            deadline = job.clock.monotonic_ms() + self.timeout_ms
            waiting = Waiting(job, channel.stream, self.timeout_ms)
            while not self._started and not self._cancel_if_requested():
                waiting.say()
                left = deadline - job.clock.monotonic_ms()
                if left <= 0:
                    raise ControlPlaneTimeoutError(
                        f"job {job.job_id}: the control plane did not answer its registration "
                        f"within {self.timeout_ms / 1000:g} s (no restore command on "
                        f"{channel.stream}); is `sparkpoint server` running on the same Redis "
                        "and stream prefix? (--control-plane-timeout sets the wait)"
                    )
                block_ms = max(1, int(min(left, FIRST_ANSWER_POLL_MS)))
                self._obey(channel.read(block_ms=block_ms, retry_for_s=left / 1000))
            if self._end is not None and not self._started:
                self._finish()  # refused (FAILED: raises, before Spark starts) or cancelled
        except SparkpointError as err:
            self._failed(err)
            raise

    def run(self, runner: EpochRunner) -> None:
        """Until told to end: obey commands without blocking, then run the next epoch, or
        wait for commands when no epoch may run (a decision, back-pressure, the final
        checkpoint or the stop-with-savepoint in flight, the end of input, a source with
        nothing new and no checkpoint to carry)."""
        channel = self.link.channel
        runner = self._reader.around(runner)
        self.job.planner.start()  # --rate counts from the first epoch, not from start-up
        self._silence.reset()  # Spark's start is no silence
        self._spark_ready = True
        try:
            if self.job.status is p.JobStatus.CREATED and self._end is None:
                self.job.set_status(p.JobStatus.RUNNING)
            while True:
                self._obey(self._reader.held() + channel.read())
                # A decided restart waits its delay with no command: that is no silence.
                self._silence.check(paused=self._awaiting_decision)
                if self._cancel_if_requested():
                    self._finish()
                    return
                epoch = self._next_epoch()
                if epoch is None:
                    self._obey(channel.read(block_ms=WAIT_MS))
                    continue
                ranges, queued = epoch
                self._running, attempt = queued, self.job.attempt
                outcome = self.job.run_epoch(
                    runner, ranges, queued.barrier if queued else None, self
                )
                self._running = None
                if outcome.failure is None:  # its heartbeat went out (a failed one has none)
                    self._epoch_attempt = attempt
                if outcome.failure is not None and not self._awaiting_decision:
                    # (A commit that failed while the epoch ran reported the failure already.)
                    self._fail(outcome.epoch, outcome.failure, outcome.failed, outcome.recoverable)
                elif queued is not None:
                    self._checkpoints.carried(queued)
        except (JobFailedError, SparkLostError):
            raise  # lost Spark: the supervisor's next driver reports it (or the heartbeats stop)
        except SparkpointError as err:
            self._failed(err)
            raise

    def close(self) -> None:
        try:
            self._reader.close()
            if self.link.heartbeats is not None:
                self.link.heartbeats.stop()
        finally:
            if self.link.lease is not None:
                self.link.lease.release()
            self.link.client.close()

    def _say(self, text: str) -> None:
        if self.job.console is not None:
            self.job.console.line("waiting_for_driver", text, level="warning")

    def _cancel_if_requested(self) -> bool:
        """Whether the job is to end; a cancel a signal requested (:meth:`request_cancel`)
        ends it as CANCELED (reported CANCELLING now, CANCELED by :meth:`_finish`), at this
        epoch boundary. The control plane aborts what is pending and does not restart it."""
        if self.cancel_requested and self._end is None:
            self.job.set_status(p.JobStatus.CANCELLING, "canceled by a signal")
            self._end = (p.JobStatus.CANCELED, "canceled by a signal")
        return self._end is not None

    def _finish(self) -> None:
        assert self._end is not None
        status, cause = self._end
        if status is p.JobStatus.FAILED:
            self.job.set_status(p.JobStatus.FAILED, cause)
            raise JobFailedError(f"job {self.job.job_id} failed: {cause or 'canceled as FAILED'}")
        self.job.set_status(status, cause)

    def _failed(self, err: SparkpointError) -> None:
        """Tell the control plane that a registered job failed (if Redis still listens); not
        a driver another one took over from (the job is that one's), nor a lost Redis (told
        once Redis is back, it would fail the job for good): that one raises
        :class:`~sparkpoint.transport.ControlPlaneLostError` instead, and the next driver
        registers."""
        if isinstance(err, (DriverSupersededError, TransportError)):
            self.link.raise_if_lost(err, self._registered)
            return
        if self._registered and self.job.status is not p.JobStatus.FAILED:
            with suppress(SparkpointError):
                self.job.set_status(p.JobStatus.FAILED, str(err))

    # ------------------------------------------------------------------ planning
    def _next_epoch(self) -> tuple[list[SplitRange], QueuedBarrier | None] | None:
        """The next epoch's ranges and barrier, or None when no epoch may run now.

        The oldest queued barrier goes into the next epoch (a final one, or a
        stop-with-savepoint one, after its last record). An epoch that would end the input
        with no barrier left to carry asks for the final checkpoint (``end_of_input``) and
        waits for it instead. An attempt's first epoch runs at once, with no record if the
        sources have none: its heartbeat tells the control plane that the attempt's tasks
        run, and periodic checkpoints start (``JobRegistered.first_epoch_heartbeat``).
        """
        if self._awaiting_decision or not self._checkpoints.may_run_epoch:
            return None
        planner = self.job.planner
        ranges = planner.next_ranges(wait_ms=0)  # idle: the caller waits on its commands
        exhausts = planner.will_exhaust(ranges)
        queued = self._checkpoints.next_barrier(exhausts)
        if queued is not None:
            return planner.with_barrier(ranges, at_end=queued.at_end), queued
        if exhausts:
            if self._checkpoints.ask_end_of_input():
                self.job.publish(p.EndOfInput(epoch=self.job.epoch))
            return None
        first = self._epoch_attempt != self.job.attempt
        # idle: commands first
        return (ranges, None) if first or holds_records(ranges) else None

    # ------------------------------------------------------------------ EpochListener
    def before_acks(self) -> None:
        pass

    def on_decline(self, attempt: int, decline: p.CheckpointDeclined) -> None:
        pass  # the control plane aborts the checkpoint

    def on_ack(self, attempt: int, ack: p.SnapshotCompleted) -> None:
        assert self._running is not None, f"job {self.job.job_id}: ack without a barrier"
        self._checkpoints.hold(self._running, ack)

    def after_acks(self) -> None:
        pass

    def after_epoch(self, epoch: int) -> None:
        pass

    # ------------------------------------------------------------------ commands
    def _obey(self, messages: list[ReceivedMessage]) -> None:
        """Obey commands in order, acknowledging each; stop at the first that ends the job."""
        for message in messages:
            if self._end is not None:
                return
            self._obey_one(message.envelope, message.payload)
            self.link.channel.ack([message.entry_id])

    def _obey_while_running(self, message: ReceivedMessage) -> bool:
        """Obey a command read while an epoch runs (on the reader's thread), if it does not
        depend on that epoch's result: a completion (its acknowledgements came from earlier
        epochs) or a trigger (queued for a later epoch). False: it waits for the epoch's end,
        with every command after it (an abort may name the running epoch's barrier, whose
        acknowledgements are not held yet)."""
        if self._end is not None or self._awaiting_decision:
            return False
        if not isinstance(message.payload, (p.NotifyCheckpointComplete, p.TriggerCheckpoint)):
            return False
        self._obey_one(message.envelope, message.payload)
        return True

    def _obey_one(self, envelope: p.Envelope, command: object) -> None:
        job = self.job
        if envelope.job_id != job.job_id:
            return
        self._silence.heard(command)
        if isinstance(command, p.RestoreJob):
            self._on_restore(command)
        elif envelope.attempt < job.attempt:
            return  # a command of an older attempt
        elif isinstance(command, p.CancelJob):
            # FAILED: no more restarts; FINISHED: the job had ended so (a restarted driver).
            ends = (p.JobStatus.FAILED, p.JobStatus.FINISHED)
            status = command.status if command.status in ends else p.JobStatus.CANCELED
            self._end = (status, command.cause)
        elif isinstance(command, p.ConfigurationChanged):
            timeout_ms = command.changes.get("timeout_ms")
            if isinstance(timeout_ms, int) and timeout_ms > 0:  # it bounds the epochs
                job.planner.checkpoint_timeout_ms = timeout_ms
            if job.console is not None:
                # Informational (the control plane triggers), but whoever reads the console sees
                # that the settings it started with no longer hold.
                job.console.line(
                    "configuration_changed",
                    f"the control plane's checkpoint settings: {settings_text(command.changes)}",
                    changes=dict(command.changes),
                )
        elif not self._started:
            return  # nothing but restore and cancel before the first restore
        elif isinstance(command, p.TriggerCheckpoint):
            barrier = CheckpointBarrier(
                command.checkpoint_id, command.trigger_timestamp, command.kind, command.is_final
            )
            self._checkpoints.queue(QueuedBarrier(barrier))
        elif isinstance(command, p.StopWithSavepoint):
            barrier = CheckpointBarrier(
                command.checkpoint_id, command.trigger_timestamp, p.CheckpointKind.SAVEPOINT
            )
            self._checkpoints.queue(QueuedBarrier(barrier, stops_job=True))
        elif isinstance(command, p.NotifyCheckpointComplete):
            self._on_complete(command.checkpoint_id)
        elif isinstance(command, p.NotifyCheckpointAborted):
            self._checkpoints.abort(command.checkpoint_id)

    def _on_complete(self, checkpoint_id: int) -> None:
        """Commit the transactions of a completed checkpoint (ending the job if it is the
        final checkpoint or the stop-with-savepoint)."""
        job = self.job
        completion = self._checkpoints.complete(checkpoint_id)
        if completion is None:
            return  # a duplicate, or not this attempt's
        if job.console is not None:  # the control plane decided it: no event of ours says so
            job.console.checkpoint_completed(checkpoint_id, completion.kind.value, None, None)
        if job.options.crash_after_checkpoint == checkpoint_id:
            os.kill(os.getpid(), signal.SIGKILL)  # testing hook: a driver crash, for real
        try:
            job.commit(checkpoint_id, completion.acks)
        except RedisUnreachableError:
            raise  # the link is lost, not the sink: the next driver restores and commits it
        except Exception as err:  # a sink's error of any kind: the control plane decides
            self._fail(job.epoch, f"committing checkpoint {checkpoint_id} failed: {err}")
            return
        job.completed.append(checkpoint_id)
        if completion.ends_job:
            self._end = (p.JobStatus.FINISHED, None)

    def _fail(
        self,
        epoch: int,
        cause: str,
        failed: tuple[str, int] | None = None,
        recoverable: bool = True,
    ) -> None:
        """Report a failure, naming the subtask that raised it when known, and wait for the
        control plane's decision. A failure of a subtask whose region the failover strategy
        restarts alone (not in a job of one region) names that region; the next ``restore``
        then restores that region only. One that no restart can fix says so: the control
        plane fails the job."""
        job = self.job
        vertex = failed[0] if failed is not None and recoverable else None
        region = failover_region(job.graph, job.options.failover_strategy, vertex)
        self._region = (region, epoch) if region is not None else None
        job.publish(task_failed(epoch, cause, failed, region, recoverable))
        self._awaiting_decision = True

    def _on_restore(self, command: p.RestoreJob) -> None:
        """Continue as the control plane's new attempt from the checkpoint it names.

        Steps: (1) ignore a duplicate, (2) switch to the new attempt, forgetting queued
        barriers and held acknowledgements, (3) read the checkpoint, (4) restore it (commit
        its transactions again, abort every other uncommitted part, seek the sources),
        (5) RUNNING.
        """
        job = self.job
        # Step 1
        if self._started and command.new_attempt <= job.attempt:
            return
        # Step 2
        if not self._started and command.new_attempt > 1 and job.console is not None:
            job.console.took_over_at = command.new_attempt  # earlier drivers ran the job
        self._started = True
        previous, job.attempt = job.attempt, command.new_attempt
        region, self._region = self._region, None
        self._checkpoints.reset()
        self._awaiting_decision = False
        fresh = job.status is p.JobStatus.CREATED
        what = (
            f"checkpoint {command.checkpoint_id}"
            if command.checkpoint_id is not None
            else "the beginning"
        )
        if not fresh:
            # Why, as the control plane tells it (as a standalone job's console says it).
            why = command.cause or f"attempt {job.attempt} restores {what}"
            job.set_status(p.JobStatus.RESTARTING, why)

        def restore() -> None:
            # Step 3
            point, storage = self._restore_point(command)
            # Step 4
            if region is not None and not fresh:
                job.restore_region(region[0], point, storage, previous, region[1])
            else:
                job.restore(point, storage, record=point is not None or not fresh)

        error = restore_error(restore)
        if error is not None:
            self._fail(job.epoch, f"restore of {what} failed: {error}")
            return
        # Step 5: a first start reports RUNNING once Spark is up (see run), as Flink does
        # once the tasks are deployed: the control plane starts the checkpoint interval then.
        if not fresh or self._spark_ready:
            job.set_status(p.JobStatus.RUNNING)

    def _restore_point(
        self, command: p.RestoreJob
    ) -> tuple[RestorePoint | None, CheckpointStorage | None]:
        """The checkpoint a ``restore`` names and the storage its handles live in.

        Raises:
            CheckpointNotFoundError: no ``_metadata`` at its path, or it names a checkpoint
                without saying where it is.
            ConfigurationError: the checkpoint does not fit the job.
        """
        job = self.job
        path = command.external_path or command.savepoint_path
        storage: CheckpointStorage | None = None
        if path:
            storage = storage_for_checkpoint_path(path)
            point = restore_point_from_metadata(storage, path)
        elif command.acks:
            if command.checkpoint_id is None:
                raise CheckpointError(
                    f"job {job.job_id}: restore to attempt {command.new_attempt} carries "
                    "acknowledgements but no checkpoint id"
                )
            point = RestorePoint(
                command.checkpoint_id, command.new_attempt - 1, tuple(command.acks)
            )
        elif command.checkpoint_id is not None:
            raise CheckpointNotFoundError(
                f"job {job.job_id}: restore of checkpoint {command.checkpoint_id} names neither "
                "its external path nor its acknowledgements"
            )
        else:
            return None, None
        point = check_restore_point(
            point, job.graph, allow_non_restored_state=job.options.allow_non_restored_state
        )
        return point, storage
