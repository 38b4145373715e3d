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
from sparkpoint.runtime.recovery import restore_point_from_metadata, storage_for_checkpoint_path
from sparkpoint_server.coordination.job import (
    JobRuntime,
    build_runtime,
    checkpoint_config_dict,
)
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.recovery import load_job
from sparkpoint_server.storage.models import Job

log = logging.getLogger(__name__)


# Events that neither read nor change completed checkpoints: completions whose ``_metadata``
# is still being written may stay open while they are applied.
COMPLETION_SAFE = frozenset(
    {
        p.SnapshotCompleted,
        p.BarrierInjected,
        p.BarrierReceived,
        p.AlignmentCompleted,
        p.Heartbeat,
        p.SinkCommitted,  # for a checkpoint notified in an earlier batch: its pin only
    }
)


class RejectedEventError(CheckpointError):
    """A well-formed event that contradicts the job's state (unknown subtask, checkpoint never
    triggered, unknown job): it goes to the dead-letter stream with this message."""


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
    ) -> None:
        self.jobs = jobs
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
            d.finish_completions(batch)
            self._registered(batch, env, payload)
            return
        rt = self.jobs.get(env.job_id)
        if rt is None:
            raise RejectedEventError(f"{env.type} event of unknown job {env.job_id}")
        handler = self._handlers.get(type(payload))
        if handler is None:
            return  # decisions a standalone driver would make (triggered, completed...)
        if batch.completions and type(payload) not in COMPLETION_SAFE:
            d.finish_completions(batch)  # what follows may read the completed checkpoints
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
        (2) a restarted driver of a known job fails the job over, (3) a new job starts at
        attempt 1 from the beginning or from ``from_checkpoint``."""
        rt = self.jobs.get(env.job_id)
        if rt is None:  # a job that ended before this control plane started
            row = batch.writer.session.get(Job, env.job_id)
            if row is not None:
                rt = load_job(batch.writer.session, row, self.clock, self.checkpoint_dir)
                self.jobs[rt.job_id] = rt
        # Step 1
        if rt is not None and rt.incarnation == ev.incarnation and ev.incarnation is not None:
            start = rt.start_command  # lost with a control-plane restart: rebuilt below
            if start is None or start.new_attempt != rt.attempt:
                cp = rt.coordinator.store.get(rt.restore_pin) if rt.restore_pin else None
                start = d.restore_command(rt, cp, rt.attempt, None)
            batch.command(rt.job_id, rt.attempt, start)
            return
        # Step 2
        if rt is not None:
            rt.incarnation = ev.incarnation
            batch.writer.job(
                rt.job_id,
                incarnation=ev.incarnation,
                updated_at=batch.now,
                spark_application_id=None,  # the new driver names its own once RUNNING
                spark_ui_url=None,
            )
            cause = "the job's driver process registered again (it was restarted)"
            batch.writer.exception(
                f"{rt.job_id}:driver:{ev.incarnation}",
                job_id=rt.job_id,
                attempt=rt.attempt,
                timestamp=batch.now,
                kind="DRIVER_RESTART",
                cause=cause,
                action="restore the latest completed checkpoint",
            )
            d.set_status(batch, rt, p.JobStatus.RESTARTING, cause)
            d.start_attempt(batch, rt, rt.coordinator.failover(cause), request_id=None)
            return
        # Step 3: a configuration the control plane cannot run is refused, and the job told
        # why (it would otherwise wait for a start that never comes).
        try:
            self._new_job(batch, env, ev)
        except (ConfigurationError, CheckpointError) as err:
            cause = f"the control plane refused job {env.job_id}: {err}"
            log.warning("%s", cause)
            batch.command(env.job_id, 0, p.CancelJob(status=p.JobStatus.FAILED, cause=cause))

    def _new_job(self, batch: Batch, env: p.Envelope, ev: p.JobRegistered) -> None:
        graph = {
            "vertices": [v.model_dump(mode="json") for v in ev.vertices],
            "edges": [list(e) for e in ev.edges],
        }
        config = dict(ev.config)
        point = None
        if config.get("from_checkpoint"):
            path = str(config["from_checkpoint"])
            point = restore_point_from_metadata(storage_for_checkpoint_path(path), path)
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
        )
        batch.writer.status_change(
            job_id=rt.job_id,
            attempt=1,
            timestamp=batch.now,
            status=rt.status.value,
            previous=None,
            cause="registered",
        )
        restore = p.RestoreJob(
            new_attempt=1,
            checkpoint_id=point.checkpoint_id if point else None,
            external_path=point.external_path if point else None,
            savepoint_path=point.external_path if point else None,
        )
        rt.start_command = restore
        batch.command(rt.job_id, 1, restore)

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
        changed = d.set_status(batch, rt, ev.status, ev.cause)
        if changed and ev.status is p.JobStatus.CANCELED and rt.cancel_request is not None:
            batch.writer.operation(rt.cancel_request, status=d.OK, updated_at=batch.now)
            rt.cancel_request = None
        if changed and not rt.active:  # the job is over: nothing pending can complete
            aborted = rt.coordinator.abort_all(
                d.Reason.CHECKPOINT_COORDINATOR_SHUTDOWN, f"the job is {ev.status.value}"
            )
            d.handle_failed(batch, rt, aborted)
            rt.stop_checkpoint = None

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

    def _known(self, rt: JobRuntime, checkpoint_id: int) -> bool:
        return checkpoint_id < rt.coordinator.next_checkpoint_id

    def _barrier_injected(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.BarrierInjected
    ) -> None:
        if self._known(rt, ev.checkpoint_id):
            key = (rt.job_id, ev.checkpoint_id, ev.operator_id, ev.subtask)
            batch.writer.subtask(key, attempt=env.attempt, barrier_timestamp=ev.timestamp)
            batch.writer.checkpoint(rt.job_id, ev.checkpoint_id, epoch=ev.epoch)

    def _barrier_received(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.BarrierReceived
    ) -> None:
        if self._known(rt, ev.checkpoint_id):
            key = (rt.job_id, ev.checkpoint_id, ev.operator_id, ev.subtask)
            batch.writer.subtask(key, attempt=env.attempt, barrier_timestamp=ev.timestamp)

    def _alignment(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.AlignmentCompleted
    ) -> None:
        if self._known(rt, ev.checkpoint_id):
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
        pending = rt.coordinator.pending.get(ack.checkpoint_id)
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
        )
        if result.discarded:  # a late acknowledgement of an aborted checkpoint
            storage, job_id, cid = rt.storage, rt.job_id, ack.checkpoint_id
            batch.later(lambda: storage.discard(job_id, cid))
            return
        if result.completed is not None:
            d.complete(batch, rt, result.completed, self.savepoint_dir)
            d.handle_failed(batch, rt, rt.coordinator.drain_failed())
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
        d.sink_committed(batch, rt, ev)

    def _heartbeat(self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.Heartbeat) -> None:
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
