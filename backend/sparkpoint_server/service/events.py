"""Applying job events to the control plane's state, one handler per event type.

Every handler is idempotent, keyed by (job, attempt, checkpoint, operator, subtask): a
redelivered or duplicated event finds its effect already there and changes nothing. Events of
an attempt older than the job's current one are refused and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.clock import Clock
from sparkpoint.errors import CheckpointError, StaleAttemptError
from sparkpoint_server.coordination.job import (
    JobRuntime,
)
from sparkpoint_server.service import attempts, completions, final_checkpoint, storage_io
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service import heartbeats as hb
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.registration import Registrations
from sparkpoint_server.service.storage_io import StorageRoots
from sparkpoint_server.storage.models import Checkpoint

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
        self.registrations = Registrations(
            jobs,
            clock,
            checkpoint_dir=checkpoint_dir,
            heartbeat_timeout_ms=heartbeat_timeout_ms,
            roots=roots,
            disposing=disposing,
        )
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
            self.registrations.registered(batch, env, payload)
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
            self._stale(batch, rt, payload)
            return
        try:
            handler(batch, rt, env, payload)
        except StaleAttemptError:
            self._stale(batch, rt, payload)
        except CheckpointError as err:
            raise RejectedEventError(str(err)) from err

    def _stale(self, batch: Batch, rt: JobRuntime, payload: Any) -> None:
        """An event of an attempt that was failed over: refused and counted. The state of a
        late acknowledgement goes if its checkpoint failed (aborted by the failover, before
        this driver, paused or cut off, wrote it), as Flink discards a late message's state."""
        self.on_stale()
        if not isinstance(payload, p.SnapshotCompleted) or payload.checkpoint_id in rt.finalizing:
            return  # (a completion being written decides about its files when it ends)
        row = batch.writer.session.get(Checkpoint, (rt.job_id, payload.checkpoint_id))
        if row is not None and row.status == p.CheckpointStatus.FAILED.value:
            batch.later(partial(rt.storage.discard, rt.job_id, payload.checkpoint_id))

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
        where = ""
        if ev.operator_id is not None:
            where = f" in {ev.operator_id}[{ev.subtask}]"
            # The vertex's chained operators (events -> check): which one raised is in the
            # cause's traceback, and a vertex named by its source alone would mislead.
            name = next(
                (v.get("name") for v in rt.graph.get("vertices", []) if v["id"] == ev.operator_id),
                None,
            )
            if name and name != ev.operator_id:
                where += f" ({name})"
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
            recoverable=ev.recoverable,
        )

    def _restored(self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.JobRestored) -> None:
        attempts.job_restored(batch, rt, env.attempt, ev)

    def _end_of_input(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.EndOfInput
    ) -> None:
        final_checkpoint.end_of_input(batch, rt)

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
            batch.later(partial(rt.storage.discard, rt.job_id, ack.checkpoint_id))
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
            env.attempt,
            ev.checkpoint_id,
            ev.operator_id,
            ev.subtask,
            ev.reason,
            asynchronous=ev.asynchronous,
        )
        if failed is not None:
            d.handle_failed(batch, rt, [failed])

    def _sink_committed(
        self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.SinkCommitted
    ) -> None:
        d.sink_committed(batch, rt, ev, env.timestamp)

    def _heartbeat(self, batch: Batch, rt: JobRuntime, env: p.Envelope, ev: p.Heartbeat) -> None:
        hb.received(batch, rt, self.clock.monotonic_ms())
        rt.epoch_ends.ended(env.attempt, ev.epoch, batch.now, ev.duration_ms)
        batch.writer.heartbeat(
            rt.job_id,
            env.attempt,
            ev.epoch,
            timestamp=env.timestamp,
            records=ev.records,
            duration_ms=ev.duration_ms,
            records_per_second=ev.records_per_second,
            source_lag=ev.source_lag,
            unanswered_splits=ev.unanswered_splits,
        )
        batch.writer.job(
            rt.job_id,
            records_per_second=ev.records_per_second,
            source_lag=ev.source_lag,
            unanswered_splits=ev.unanswered_splits,
            epoch_bound_ms=ev.epoch_bound_ms,
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
