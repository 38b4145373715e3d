"""Applying job events to the control plane's state, one handler per event type.

Every handler is idempotent, keyed by (job, attempt, checkpoint, operator, subtask): a
redelivered or duplicated event finds its effect already there and changes nothing. Events of
an attempt older than the job's current one are refused and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CheckpointTriggerError
from sparkpoint.clock import Clock
from sparkpoint.errors import CheckpointError, ConfigurationError, StaleAttemptError
from sparkpoint.runtime.recovery import (
    RestorePoint,
    restore_point_from_metadata,
    storage_for_checkpoint_path,
)
from sparkpoint_server.coordination.job import (
    JobRuntime,
    Origin,
    build_runtime,
    checkpoint_config_dict,
)
from sparkpoint_server.service import completions, storage_io
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service import failover as fo
from sparkpoint_server.service import heartbeats as hb
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.recovery import load_job
from sparkpoint_server.service.storage_io import StorageRoots, state_paths
from sparkpoint_server.storage.models import Job

log = logging.getLogger(__name__)


class RejectedEventError(CheckpointError):
    """A well-formed event that contradicts the job's state (unknown subtask, checkpoint never
    triggered, unknown job): it goes to the dead-letter stream with this message."""


class UnknownJobError(RejectedEventError):
    """An event of a job nobody registered: refused before anything changed, so the rest of
    its batch can still be applied."""


class EventApplier:
    """Applies events to the job runtimes of a control plane."""

    def __init__(
        self,
        jobs: dict[str, JobRuntime],
        clock: Clock,
        *,
        checkpoint_dir: str,
        savepoint_dir: str,
        on_stale: Callable[[], None],
        heartbeat_timeout_ms: int,
        roots: StorageRoots,
        disposing: set[storage_io.Location],
    ) -> None:
        self.jobs = jobs
        self.roots = roots
        self.disposing = disposing  # the control plane's: savepoints being disposed of
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.clock = clock
        self.checkpoint_dir = checkpoint_dir
        self.savepoint_dir = savepoint_dir
        self.on_stale = on_stale
        self._handlers: dict[type[Any], Callable[[Batch, JobRuntime, p.Envelope, Any], None]] = {
            p.JobStatusChanged: self._status,
            p.BarrierInjected: self._barrier_injected,
            p.BarrierReceived: self._barrier_received,
            p.AlignmentCompleted: self._alignment,
            p.SnapshotCompleted: self._ack,
            p.CheckpointDeclined: self._decline,
            p.SinkCommitted: self._sink_committed,
            p.TaskFailed: self._task_failed,
            p.JobRestored: self._restored,
            p.EndOfInput: self._end_of_input,
            p.Heartbeat: self._heartbeat,
        }

    def apply(self, batch: Batch, env: p.Envelope, payload: Any) -> None:
        """Apply one event. Raises :class:`RejectedEventError` for an event to dead-letter."""
        if isinstance(payload, p.JobRegistered):
            self._registered(batch, env, payload)
            return
        rt = self.jobs.get(env.job_id)
        if isinstance(payload, p.DriverHeartbeat):  # of a driver process, whatever its attempt
            if rt is not None:
                hb.received(batch, rt, self.clock.monotonic_ms(), payload.incarnation)
            return
        if rt is None:
            raise UnknownJobError(f"{env.type} event of unknown job {env.job_id}")
        handler = self._handlers.get(type(payload))
        if handler is None:
            return  # decisions a standalone driver would make (triggered, completed...)
        if env.attempt < rt.attempt:
            self.on_stale()
            return
        try:
            handler(batch, rt, env, payload)
        except StaleAttemptError:
            self.on_stale()
        except CheckpointError as err:
            raise RejectedEventError(str(err)) from err

    # ------------------------------------------------------------------ registration

    def _registered(self, batch: Batch, env: p.Envelope, ev: p.JobRegistered) -> None:
        """Steps: (1) a duplicate (same driver process) gets its start command again,
        (2) a restarted driver of a known job fails the job over (or, when the silence of the
        previous driver already did, gets the restore decided then), (3) a new job starts at
        attempt 1 from the beginning or from ``from_checkpoint``. The registering driver is
        watched from then on if it sends heartbeats."""
        rt = self.jobs.get(env.job_id)
        if rt is None:  # a job that ended before this control plane started
            row = batch.writer.session.get(Job, env.job_id)
            if row is not None:
                rt = load_job(batch.writer.session, row, self.clock, self.checkpoint_dir)
                self.jobs[rt.job_id] = rt
        # Step 1
        if rt is not None and rt.incarnation == ev.incarnation and ev.incarnation is not None:
            hb.received(batch, rt, self.clock.monotonic_ms())
            batch.command(rt.job_id, rt.attempt, _start_command(rt))
            return
        # Step 2
        if rt is not None:
            self._restarted_driver(batch, rt, ev)
            return
        # Step 3: a configuration the control plane cannot run is refused, and the job told
        # why (it would otherwise wait for a start that never comes).
        try:
            self._new_job(batch, env, ev)
        except (ConfigurationError, CheckpointError) as err:
            cause = f"the control plane refused job {env.job_id}: {err}"
            log.warning("%s", cause)
            batch.command(env.job_id, 0, p.CancelJob(status=p.JobStatus.FAILED, cause=cause))
            return
        self._watch(batch, self.jobs[env.job_id], ev)

    def _restarted_driver(self, batch: Batch, rt: JobRuntime, ev: p.JobRegistered) -> None:
        """A new driver process of a known job: fail over (:func:`~.failover.fail_over`),
        with the cause ``sparkpoint run`` gave (why the previous process ended) if any.

        When the previous driver's silence already failed the job over (RESTARTING), the
        restart strategy has decided: the new driver gets that restore (now, or from the
        timer when its delay is over), and no second failover is counted.
        """
        lost, rt.incarnation = rt.driver_lost, ev.incarnation
        batch.writer.job(
            rt.job_id,
            incarnation=ev.incarnation,
            updated_at=batch.now,
            spark_application_id=None,  # the new driver names its own once RUNNING
            spark_ui_url=None,
            spark_executors=None,
            **_guarantee_columns(ev),  # the new driver may run a changed job
        )
        self._watch(batch, rt, ev)
        _tell_configuration(batch, rt, ev)
        restarted = "the job's driver process registered again (it was restarted)"
        cause = f"{restarted}: {ev.previous_failure}" if ev.previous_failure else restarted
        decided = lost and rt.status is p.JobStatus.RESTARTING
        batch.writer.exception(
            f"{rt.job_id}:driver:{ev.incarnation}",
            job_id=rt.job_id,
            attempt=rt.attempt,
            timestamp=batch.now,
            kind="DRIVER_RESTART",
            cause=cause,
            action=(
                "the restart decided when the previous driver's heartbeats stopped goes on"
                if decided
                else f"restore {fo.target_name(rt)}"
            ),
        )
        if decided:
            if rt.restart_due_at is None:  # the restore went to the previous driver: again
                batch.command(rt.job_id, rt.attempt, _start_command(rt))
            return
        d.set_status(batch, rt, p.JobStatus.RESTARTING, cause)
        fo.fail_over(batch, rt, cause, batch.failover_verdicts.get(rt.job_id, {}))

    def _watch(self, batch: Batch, rt: JobRuntime, ev: p.JobRegistered) -> None:
        interval = ev.heartbeat_interval_ms
        if interval is not None and 2 * interval > self.heartbeat_timeout_ms:
            log.warning(
                "job %s: its driver sends a heartbeat every %d ms, too rarely for the heartbeat "
                "timeout of %d ms (SPARKPOINT_HEARTBEAT_TIMEOUT): one late heartbeat fails it "
                "over; lower its SPARKPOINT_HEARTBEAT_INTERVAL",
                rt.job_id,
                interval,
                self.heartbeat_timeout_ms,
            )
        hb.watch(batch, rt, interval, self.clock.monotonic_ms())

    def _new_job(self, batch: Batch, env: p.Envelope, ev: p.JobRegistered) -> None:
        graph = {
            "vertices": [v.model_dump(mode="json") for v in ev.vertices],
            "edges": [list(e) for e in ev.edges],
        }
        config = dict(ev.config)
        point = self._start_point(batch, env.job_id, config)
        rt = build_runtime(
            job_id=env.job_id,
            name=ev.job_name,
            graph=graph,
            config=config,
            checkpoint_config=config,
            restart_strategy=dict(config.get("restart_strategy") or {}),
            status=p.JobStatus.CREATED,
            incarnation=ev.incarnation,
            attempt=1,
            next_checkpoint_id=point.checkpoint_id + 1 if point else 1,
            clock=self.clock,
            default_checkpoint_dir=self.checkpoint_dir,
        )
        if point is not None:
            path = point.external_path or str(config["from_checkpoint"])
            rt.origin = Origin(point.checkpoint_id, path, rt.coordinator.next_checkpoint_id)
        self.jobs[rt.job_id] = rt
        batch.writer.insert_job(
            job_id=rt.job_id,
            name=rt.name,
            status=rt.status.value,
            attempt=1,
            incarnation=ev.incarnation,
            created_at=batch.now,
            updated_at=batch.now,
            start_time=batch.now,
            graph=graph,
            config=config,
            checkpoint_config=checkpoint_config_dict(rt.coordinator.config),
            restart_strategy=dict(rt.restart.to_config()),
            next_checkpoint_id=rt.coordinator.next_checkpoint_id,
            **d.origin_columns(rt.origin),
            **_guarantee_columns(ev),
        )
        batch.writer.status_change(
            job_id=rt.job_id,
            attempt=1,
            timestamp=batch.now,
            status=rt.status.value,
            previous=None,
            cause="registered",
        )
        restore = d.restore_command(rt, None, 1, None)
        rt.start_command = restore
        batch.command(rt.job_id, 1, restore)

    def _start_point(
        self, batch: Batch, job_id: str, config: dict[str, Any]
    ) -> RestorePoint | None:
        """Check the storage a new job names; the checkpoint it starts from (read before the
        lock was taken), if any.

        Raises:
            ConfigurationError: its checkpoint directory, its ``--from-checkpoint`` or a state
                file that one names is outside the storage roots, or it could not be read.
        """
        refusal = self.roots.registration_refusal(config)
        if refusal is not None:
            raise ConfigurationError(f"job {job_id}: {refusal}")
        if not config.get("from_checkpoint"):
            return None
        path = str(config["from_checkpoint"])
        if storage_io.location_of(path) in self.disposing:
            raise ConfigurationError(
                f"job {job_id}: --from-checkpoint {path!r} is being disposed of"
            )
        point = batch.restore_points.get(path)
        if not isinstance(point, RestorePoint):
            raise ConfigurationError(
                f"job {job_id}: --from-checkpoint {path!r}: {point or 'not read'}"
            )
        roots = self.roots.of_job(config)
        for state in (path for a in point.acks for h in a.handles for path in state_paths(h)):
            if not roots.contains(state):
                raise ConfigurationError(
                    f"job {job_id}: --from-checkpoint {path!r} names state at "
                    f"{state!r}, outside the storage roots: {roots.describe()}"
                )
        return point

    # ------------------------------------------------------------------ status, failures

    def _status(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.JobStatusChanged
    ) -> None:
        if ev.spark_application_id is not None:  # the driver's Spark application (RUNNING)
            batch.writer.job(
                rt.job_id,
                spark_application_id=ev.spark_application_id,
                spark_ui_url=ev.spark_ui_url,
            )
        if ev.status is p.JobStatus.RUNNING and rt.restart_due_at is not None:
            return  # a restart is decided; the job runs until it gets the restore
        if ev.status is p.JobStatus.FAILED and rt.status is not p.JobStatus.FAILING:
            # The job gave up on its own (Flink: RUNNING -> FAILING -> FAILED).
            d.set_status(batch, rt, p.JobStatus.FAILING, ev.cause)
        d.set_status_and_settle(batch, rt, ev.status, ev.cause)

    def _task_failed(self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.TaskFailed) -> None:
        if not rt.active:
            return
        where = f" in {ev.operator_id}[{ev.subtask}]" if ev.operator_id is not None else ""
        d.job_failed(
            batch,
            rt,
            f"epoch {ev.epoch} of attempt {env.attempt} failed{where}: {ev.cause}",
            kind="TASK_FAILURE",
            dedupe=f"task:{env.attempt}:{ev.epoch}",
            epoch=ev.epoch,
            operator_id=ev.operator_id,
            subtask=ev.subtask,
            region=(
                f"{ev.region} ({', '.join(ev.region_vertices or ())})"
                if ev.region is not None
                else None
            ),
        )

    def _restored(self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.JobRestored) -> None:
        d.job_restored(batch, rt, env.attempt, ev)

    def _end_of_input(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.EndOfInput
    ) -> None:
        for pending in rt.coordinator.pending.values():
            if pending.is_final:
                d.resend_trigger(batch, rt, pending)
                return
        try:
            d.trigger(batch, rt, is_final=True)
        except CheckpointTriggerError as err:  # never for a final checkpoint; be explicit
            raise RejectedEventError(str(err)) from err
        rt.final_requested = True

    # ------------------------------------------------------------------ checkpoint events

    def _known(self, rt: JobRuntime, env: p.Envelope, ev: Any) -> bool:
        """Whether a barrier or alignment event's checkpoint was triggered (if not, it is
        ignored). One of a subtask the job does not have, or of a newer attempt, is refused:
        its row would be a subtask no acknowledgement can match, or overwrite the current
        attempt's (as for acknowledgements, ``CheckpointCoordinator.acknowledge``)."""
        newer = env.attempt > rt.attempt
        if newer or ev.subtask >= rt.tasks.get(ev.operator_id, 0):
            what = f"job {rt.job_id}: {env.type} of checkpoint {ev.checkpoint_id}"
            where = f"{ev.operator_id}[{ev.subtask}]"
            raise RejectedEventError(
                f"{what} by {where} carries attempt {env.attempt}, newer than the current "
                f"attempt {rt.attempt}"
                if newer
                else f"{what}: unknown subtask {where} (operators: {rt.tasks})"
            )
        return bool(ev.checkpoint_id < rt.coordinator.next_checkpoint_id)

    def _barrier_injected(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.BarrierInjected
    ) -> None:
        if self._known(rt, env, ev):
            key = (rt.job_id, ev.checkpoint_id, ev.operator_id, ev.subtask)
            batch.writer.subtask(key, attempt=env.attempt, barrier_timestamp=ev.timestamp)
            batch.writer.checkpoint(rt.job_id, ev.checkpoint_id, epoch=ev.epoch)

    def _barrier_received(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.BarrierReceived
    ) -> None:
        if self._known(rt, env, ev):
            key = (rt.job_id, ev.checkpoint_id, ev.operator_id, ev.subtask)
            batch.writer.subtask(key, attempt=env.attempt, barrier_timestamp=ev.timestamp)

    def _alignment(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.AlignmentCompleted
    ) -> None:
        if self._known(rt, env, ev):
            batch.writer.subtask(
                (rt.job_id, ev.checkpoint_id, ev.operator_id, ev.subtask),
                attempt=env.attempt,
                alignment_duration=ev.duration_ms,
                alignment_buffered=ev.buffered_bytes,
                alignment_buffered_records=ev.buffered_records,
            )

    def _ack(self, batch: Batch, rt: JobRuntime, env: p.Envelope, ack: p.SnapshotCompleted) -> None:
        result = rt.coordinator.acknowledge(env.attempt, ack)
        if result.duplicate:
            return
        pending = rt.coordinator.pending_checkpoint(ack.checkpoint_id)
        trigger_ts = pending.trigger_timestamp if pending else None
        if result.completed is not None:
            trigger_ts = result.completed.trigger_timestamp
        batch.writer.subtask(
            (rt.job_id, ack.checkpoint_id, ack.operator_id, ack.subtask),
            attempt=env.attempt,
            ack_timestamp=ack.ack_timestamp,
            start_delay=ack.start_delay_ms,
            alignment_duration=ack.alignment_duration_ms,
            alignment_buffered=ack.alignment_buffered_bytes,
            sync_duration=ack.sync_duration_ms,
            async_duration=ack.async_duration_ms,
            state_size=ack.state_size,
            checkpointed_size=ack.checkpointed_size,
            end_to_end_duration=(
                float(max(0, ack.ack_timestamp - trigger_ts)) if trigger_ts is not None else None
            ),
            clock_flagged=ack.clock_flagged
            or (trigger_ts is not None and ack.ack_timestamp < trigger_ts),
            ack=env.payload,  # the wire form: what recovery validates back
            # A connected job sends the barrier events of an acknowledging subtask inside its
            # acknowledgement (``SnapshotCompleted.barrier_timestamp``); an older one, apart.
            barrier_timestamp=ack.barrier_timestamp,
            alignment_buffered_records=ack.alignment_buffered_records,
        )
        if ack.barrier_timestamp is not None and ack.source_positions:
            # A source acknowledges in the epoch that injected its barrier (BarrierInjected).
            batch.writer.checkpoint(rt.job_id, ack.checkpoint_id, epoch=ack.epoch)
        if result.discarded:  # a late acknowledgement of an aborted checkpoint
            storage, job_id, cid = rt.storage, rt.job_id, ack.checkpoint_id
            batch.later(lambda: storage.discard(job_id, cid))
            return
        if result.completed is not None:
            completions.complete_and_subsume(batch, rt, result.completed, self.savepoint_dir)
        else:
            d.acknowledged(batch, rt, ack)

    def _decline(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.CheckpointDeclined
    ) -> None:
        batch.writer.subtask(
            (rt.job_id, ev.checkpoint_id, ev.operator_id, ev.subtask),
            attempt=env.attempt,
            declined_reason=ev.reason,
        )
        failed = rt.coordinator.decline(
            env.attempt, ev.checkpoint_id, ev.operator_id, ev.subtask, ev.reason
        )
        if failed is not None:
            d.handle_failed(batch, rt, [failed])

    def _sink_committed(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.SinkCommitted
    ) -> None:
        d.sink_committed(batch, rt, ev, env.timestamp)

    def _heartbeat(self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.Heartbeat) -> None:
        hb.received(batch, rt, self.clock.monotonic_ms())
        batch.writer.heartbeat(
            rt.job_id,
            env.attempt,
            ev.epoch,
            timestamp=env.timestamp,
            records=ev.records,
            duration_ms=ev.duration_ms,
            records_per_second=ev.records_per_second,
            source_lag=ev.source_lag,
        )
        batch.writer.job(
            rt.job_id,
            records_per_second=ev.records_per_second,
            source_lag=ev.source_lag,
            last_heartbeat=env.timestamp,
        )
        if ev.restore_duration_ms is not None or ev.first_record_after_restore is not None:
            # The first epoch after a restore: how long the state took, when records flowed.
            batch.writer.job(
                rt.job_id,
                restored_state_ms=ev.restore_duration_ms,
                restored_first_record=ev.first_record_after_restore,
            )
        if ev.executors is not None:  # a driver that lists its Spark executors
            batch.writer.job(
                rt.job_id, spark_executors=[e.model_dump(mode="json") for e in ev.executors]
            )


def read_restore_point(path: str) -> RestorePoint:
    """The checkpoint at ``path`` (storage I/O: call it outside the lock, bounded in time)."""
    return restore_point_from_metadata(storage_for_checkpoint_path(path), path)


def _start_command(rt: JobRuntime) -> p.RestoreJob:
    """The ``restore`` that starts the job's current attempt (rebuilt when a control-plane
    restart lost it)."""
    start = rt.start_command
    if start is None or start.new_attempt != rt.attempt:
        cp = rt.coordinator.store.get(rt.restore_pin) if rt.restore_pin else None
        start = d.restore_command(rt, cp, rt.attempt, None)
    return start


def _tell_configuration(batch: Batch, rt: JobRuntime, ev: p.JobRegistered) -> None:
    """A restarted driver registers with its command line's checkpoint settings; those the
    control plane has (changed through ``PATCH /jobs/{id}/checkpoints/config`` since) win, and
    the driver hears them as the earlier one did: what it expects of the control plane (how
    often a command comes) follows them."""
    current = checkpoint_config_dict(rt.coordinator.config)
    changes = {
        name: value
        for name, value in current.items()
        if isinstance(value, int) and ev.config.get(name) != value
    }
    if changes:
        batch.command(rt.job_id, rt.attempt, p.ConfigurationChanged(changes=changes))


def _guarantee_columns(ev: p.JobRegistered) -> dict[str, str | None]:
    """The job row's guarantee columns from a registration (both None: not reported)."""
    g = ev.guarantee
    return {"guarantee_level": g.level if g else None, "guarantee_reason": g.reason if g else None}
