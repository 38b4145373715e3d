"""The job driver: runs epochs on Spark, hosts the checkpoint coordinator, recovers.

One loop: plan the next epoch (ranges, and barrier *n* when a checkpoint is due), run it as
one Spark job, accept it (working-state versions, positions, events, acknowledgements), and
complete checkpoints in DESIGN §1's order. A failed epoch goes to the restart strategy; a
restart increments the job attempt and restores the latest completed checkpoint: state,
source positions and sink transactions.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.coordinator import CheckpointCoordinator
from sparkpoint.checkpointing.pending import CompletedCheckpoint, FailedCheckpoint
from sparkpoint.checkpointing.restart import restart_strategy_from_config
from sparkpoint.checkpointing.storage import (
    CheckpointStorage,
    FileSystemCheckpointStorage,
    checkpoint_storage_from_options,
)
from sparkpoint.clock import Clock, SystemClock
from sparkpoint.errors import ConfigurationError, InjectedFailure, SparkpointError
from sparkpoint.events import EventSink, FanOutEventSink, InMemoryEventSink, JsonLinesEventSink
from sparkpoint.graph import JobGraph
from sparkpoint.options import JobOptions
from sparkpoint.runtime.plan import EpochPlan, FailureInjection, StateInput, TaskReport
from sparkpoint.runtime.planner import EpochPlanner
from sparkpoint.runtime.recovery import (
    RestorePoint,
    check_restore_point,
    checkpoint_metadata,
    restore_point_from_metadata,
    storage_for_checkpoint_path,
)
from sparkpoint.runtime.spark import EpochFailedError, SparkEpochRunner, spark_session


class JobFailedError(SparkpointError):
    """The job failed and its restart strategy allows no more restarts."""


@dataclass
class JobResult:
    job_id: str
    status: p.JobStatus
    attempt: int
    epochs: int
    records: int
    duration_s: float
    completed_checkpoints: list[int] = field(default_factory=list)
    restores: list[int | None] = field(default_factory=list)
    events: InMemoryEventSink | None = None

    @property
    def records_per_second(self) -> float:
        return self.records / self.duration_s if self.duration_s > 0 else 0.0


class JobDriver:
    """Runs one job graph to its end (bounded input) or until it fails for good."""

    def __init__(
        self,
        graph: JobGraph,
        options: JobOptions,
        *,
        spark: Any = None,
        clock: Clock | None = None,
        events: EventSink | None = None,
        failure: FailureInjection | None = None,
    ) -> None:
        self.graph = graph
        self.options = options
        self.clock = clock or SystemClock()
        self.job_id = options.job_id
        self.memory = InMemoryEventSink(max_events=options.max_events_in_memory)
        sinks: list[EventSink] = [self.memory]
        if events is not None:
            sinks.append(events)
        if options.events_log:
            sinks.append(JsonLinesEventSink(options.events_log))
        self.events = FanOutEventSink(*sinks)
        self.storage = checkpoint_storage_from_options(
            options.checkpoint_storage, options.checkpoint_dir, options.max_inline_state_bytes
        )
        self.coordinator = CheckpointCoordinator(
            self.job_id, graph.tasks(), options.checkpoint, self.clock
        )
        restart_conf: dict[str, str | int | float] = dict(options.restart_strategy)
        self.restart = restart_strategy_from_config(
            restart_conf, checkpointing_enabled=options.checkpoint.interval_ms > 0
        )
        self.planner = EpochPlanner(
            graph.source.source,
            self.clock,
            target_ms=options.epoch_target_ms,
            min_records=options.min_epoch_records,
            max_records=options.max_epoch_records,
        )
        if failure is None and options.fail_after is not None:
            failure = FailureInjection("source", subtask=0, offset=options.fail_after)
        self.failure = failure
        self._spark = spark
        self.epoch = 0
        self.committed_up_to = 0
        self.records = 0
        self.finished = False
        self.status = p.JobStatus.CREATED
        self.completed: list[int] = []
        self.restores: list[int | None] = []
        n_state = graph.keyed.parallelism if graph.keyed else graph.source.parallelism
        self.state_inputs: tuple[StateInput, ...] = tuple(StateInput() for _ in range(n_state))
        self.initial_point: RestorePoint | None = None  # --from-checkpoint, the fallback
        self.durable = durable_working_state(options, self.storage)
        self.restore_storage: CheckpointStorage | None = None

    # ------------------------------------------------------------------ events
    def _publish(self, *payloads: Any) -> None:
        now = self.clock.now_ms()
        self.events.publish(
            [p.envelope(self.job_id, self.coordinator.attempt, now, pl) for pl in payloads]
        )

    def _set_status(self, status: p.JobStatus, cause: str | None = None) -> None:
        if status != self.status:
            self._publish(p.JobStatusChanged(status=status, previous=self.status, cause=cause))
            self.status = status

    # ------------------------------------------------------------------ main loop
    def run(self) -> JobResult:
        """Steps: (1) read the checkpoint to start from, if any, (2) Spark session,
        (3) register, (4) restore, (5) epochs until the final checkpoint committed,
        (6) FINISHED."""
        started = self.clock.monotonic_ms()
        # Step 1: before Spark starts, so that a wrong path fails at once.
        point = None
        if self.options.from_checkpoint:
            point = restore_point_from_metadata(self.storage, self.options.from_checkpoint)
            check_restore_point(point, self.graph)
        # Step 2
        session = self._spark or spark_session(self.options.master, self.graph.name)
        runner = SparkEpochRunner(self.graph, session)
        runner.warm_up()
        # Step 3
        self._publish(
            p.JobRegistered(
                job_name=self.graph.name,
                vertices=self.graph.vertices(),
                edges=self.graph.edges(),
                config=self._config_summary(),
            )
        )
        for cid in self.storage.cleanup_incomplete(self.job_id):
            self._publish(p.CheckpointAborted(checkpoint_id=cid, reason="no _metadata: removed"))
        # Step 4
        if point is not None and self.options.from_checkpoint:
            self.restore_storage = storage_for_checkpoint_path(self.options.from_checkpoint)
            self.initial_point = point
            self.coordinator = CheckpointCoordinator(
                self.job_id,
                self.graph.tasks(),
                self.options.checkpoint,
                self.clock,
                attempt=point.attempt + 1,
                next_checkpoint_id=point.checkpoint_id + 1,
            )
            self._restore(point)
        self._set_status(p.JobStatus.RUNNING)
        self.planner.start()
        # Step 5
        try:
            while not self.finished:
                self._run_one_epoch(runner)
            # Step 6
            self._set_status(p.JobStatus.FINISHED)
            shutil.rmtree(os.path.join(self.options.local_dir, self.job_id), ignore_errors=True)
            self.storage.discard_working_state(self.job_id)
        except JobFailedError:
            self._set_status(p.JobStatus.FAILED)
            raise
        finally:
            self.events.close()
        return JobResult(
            job_id=self.job_id,
            status=self.status,
            attempt=self.coordinator.attempt,
            epochs=self.epoch,
            records=self.records,
            duration_s=(self.clock.monotonic_ms() - started) / 1000,
            completed_checkpoints=list(self.completed),
            restores=list(self.restores),
            events=self.memory,
        )

    def _config_summary(self) -> dict[str, Any]:
        c = self.options.checkpoint
        return {
            "mode": c.mode.value,
            "interval_ms": c.interval_ms,
            "timeout_ms": c.timeout_ms,
            "min_pause_ms": c.min_pause_ms,
            "max_concurrent": c.max_concurrent,
            "tolerable_failures": c.tolerable_failures,
            "retained": c.retained,
            "checkpoint_storage": self.options.checkpoint_storage,
            "checkpoint_dir": self.options.checkpoint_dir,
            "state_backend": self.options.state_backend,
            "max_parallelism": self.options.max_parallelism,
            "restart_strategy": self.restart.to_config(),
        }

    def _run_one_epoch(self, runner: SparkEpochRunner) -> None:
        self._handle_failed(self.coordinator.expire_overdue())
        ranges = self.planner.next_ranges()
        barrier = None
        if self.planner.will_exhaust(ranges):
            pending = self.coordinator.trigger(is_final=True)
            ranges = self.planner.with_barrier(ranges, at_end=True)
        elif self.coordinator.periodic_due():
            pending = self.coordinator.trigger(periodic=True)
            ranges = self.planner.with_barrier(ranges, at_end=False)
        else:
            pending = None
        if pending is not None:
            barrier = CheckpointBarrier(
                pending.checkpoint_id, pending.trigger_timestamp, pending.kind, pending.is_final
            )
            self._publish(
                p.CheckpointTriggered(
                    checkpoint_id=pending.checkpoint_id,
                    kind=pending.kind,
                    trigger_timestamp=pending.trigger_timestamp,
                    epoch=self.epoch,
                    is_final=pending.is_final,
                )
            )
        plan = EpochPlan(
            job_id=self.job_id,
            job_name=self.graph.name,
            attempt=self.coordinator.attempt,
            epoch=self.epoch,
            mode=self.options.checkpoint.mode,
            ranges=tuple(ranges),
            barrier=barrier,
            state_inputs=self.state_inputs,
            committed_up_to=self.committed_up_to,
            storage=self.storage,
            local_dir=self.options.local_dir,
            failure=self.failure,
            restore_storage=self.restore_storage,
            durable_working_state=self.durable,
            isolate_workers=self.options.isolate_workers,
        )
        started = self.clock.monotonic_ms()
        try:
            reports = runner.run(plan)
            self._accept(plan, reports, self.clock.monotonic_ms() - started)
        except EpochFailedError as err:
            self._on_failure(err.cause, plan.epoch)
        except InjectedFailure as err:
            self._on_failure(f"InjectedFailure: {err}", plan.epoch)
        self.epoch += 1

    # ------------------------------------------------------------------ accepting an epoch
    def _accept(self, plan: EpochPlan, reports: list[TaskReport], duration_ms: float) -> None:
        """Accept a finished epoch: the reports of its tasks become the truth."""
        expected = {(uid, i) for uid, n in self.graph.tasks().items() for i in range(n)}
        by_task = {
            (r.operator_id, r.subtask): r
            for r in reports
            if r.attempt == plan.attempt and r.epoch == plan.epoch
        }
        if set(by_task) != expected:
            missing = sorted(expected - set(by_task))
            raise EpochFailedError(plan.epoch, f"no report from subtasks {missing}")
        # Step 1: the working-state versions written by the accepted task attempts.
        tail_uid = self.graph.sink_vertex_uid
        replaced = [i.durable_path for i in self.state_inputs if i.durable_path]
        self.state_inputs = tuple(
            StateInput(
                version=by_task[(tail_uid, i)].state_version,
                durable_path=by_task[(tail_uid, i)].state_durable_path,
            )
            for i in range(len(self.state_inputs))
        )
        self.storage.discard_working_state(self.job_id, replaced)
        # Step 2: positions, counters.
        self.planner.advance(list(plan.ranges))
        records = sum(r.records for r in plan.ranges)
        self.records += records
        self.planner.observe(records, duration_ms)
        # Step 3: the tasks' events, then the acknowledgements (after expiring any checkpoint
        # whose timeout passed while the epoch ran: its acknowledgements arrive too late).
        self._handle_failed(self.coordinator.expire_overdue())
        ordered = sorted(
            by_task.values(),
            key=lambda r: (r.operator_id != self.graph.source.uid, r.operator_id, r.subtask),
        )
        self._publish(*(ev for r in ordered for ev in r.events))
        for r in ordered:
            for decline in r.declines:
                self._publish(decline)
                failed = self.coordinator.decline(
                    plan.attempt,
                    decline.checkpoint_id,
                    decline.operator_id,
                    decline.subtask,
                    decline.reason,
                )
                self._handle_failed([failed] if failed else [])
            for ack in r.acks:
                self._publish(ack)
                result = self.coordinator.acknowledge(plan.attempt, ack)
                if result.discarded:  # late ack of an aborted checkpoint
                    self.storage.discard(self.job_id, ack.checkpoint_id)
                if result.completed is not None:
                    self._complete(result.completed)
        self._handle_failed(self.coordinator.drain_failed())
        self._publish(
            p.Heartbeat(
                epoch=plan.epoch,
                records=records,
                duration_ms=duration_ms,
                records_per_second=records / duration_ms * 1000 if duration_ms > 0 else 0.0,
                source_lag=self.planner.lag(),
                host_time=self.clock.now_ms(),
            )
        )
        if self.coordinator.must_fail_job:
            raise EpochFailedError(plan.epoch, "exceeded checkpoint tolerable failure threshold")

    def _complete(self, cp: CompletedCheckpoint) -> None:
        """Completion order of DESIGN §1."""
        # Step 1: _metadata to checkpoint storage (enough to restore from the path alone).
        try:
            cp.external_path = self.storage.write_metadata(
                self.job_id, cp.checkpoint_id, checkpoint_metadata(self.job_id, cp)
            )
        except (OSError, SparkpointError) as err:
            failed = self.coordinator.finalize_failed(
                cp.checkpoint_id, f"writing _metadata failed: {err}"
            )
            self._handle_failed([failed])
            return
        # Step 2: record it (standalone: the coordinator's completed-checkpoint store).
        self.completed.append(cp.checkpoint_id)
        self._publish(
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
            self.storage.discard(self.job_id, old.checkpoint_id)
        # Step 3: notify the job (in-process here).
        if (
            self.options.crash_after_checkpoint == cp.checkpoint_id
            and self.options.from_checkpoint is None
        ):
            os.kill(os.getpid(), signal.SIGKILL)  # testing hook: a driver crash, for real
        f = self.failure
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
        self._commit(cp.checkpoint_id, cp.acks.values())
        if cp.is_final:
            self.finished = True

    def _commit(self, checkpoint_id: int, acks: Any) -> None:
        sink, sink_uid = self.graph.sink, self.graph.sink_uid
        assert sink is not None and sink_uid is not None
        for ack in acks:
            for txn in ack.sink_transactions:
                sink.commit(sink_uid, txn)
                self._publish(
                    p.SinkCommitted(
                        checkpoint_id=checkpoint_id,
                        operator_id=ack.operator_id,
                        subtask=ack.subtask,
                        transaction_id=txn.transaction_id,
                        parts=len(txn.parts),
                    )
                )
        self.committed_up_to = max(self.committed_up_to, checkpoint_id)

    def _handle_failed(self, failed: list[FailedCheckpoint]) -> None:
        for f in failed:
            self.storage.discard(self.job_id, f.checkpoint_id)
            self._publish(
                p.CheckpointAborted(
                    checkpoint_id=f.checkpoint_id, reason=f"{f.reason.name}: {f.message}"
                )
            )

    # ------------------------------------------------------------------ failures
    def _on_failure(self, cause: str, epoch: int) -> None:
        """Steps: (1) report, (2) ask the restart strategy, (3) fail over, (4) restore."""
        # Step 1
        self._publish(p.TaskFailed(epoch=epoch, cause=cause))
        # Step 2
        decision = self.restart.on_failure(self.clock.now_ms())
        if not decision.restart:
            self._set_status(p.JobStatus.FAILING, cause)
            raise JobFailedError(f"job {self.job_id} failed: {cause} ({decision.message})")
        self._set_status(p.JobStatus.RESTARTING, cause)
        if decision.delay_ms > 0:
            time.sleep(decision.delay_ms / 1000)
        # Step 3
        failover = self.coordinator.failover(cause)
        self._handle_failed(failover.aborted)
        # Step 4: the latest completed checkpoint, else the one the job started from.
        cp = failover.restore_from
        self._restore(RestorePoint.of(cp) if cp is not None else self.initial_point)
        self._set_status(p.JobStatus.RUNNING)

    def _restore(self, point: RestorePoint | None) -> None:
        """Steps: (1) commit the restored checkpoint's pre-committed transactions again,
        (2) abort every other uncommitted part, (3) seek the sources back, (4) hand the
        state handles to the subtasks."""
        sink, sink_uid = self.graph.sink, self.graph.sink_uid
        assert sink is not None and sink_uid is not None
        # Step 1
        committed = 0
        if point is not None:
            for ack in point.acks:
                for txn in ack.sink_transactions:
                    committed += 1
                    sink.commit(sink_uid, txn)
            self.committed_up_to = max(self.committed_up_to, point.checkpoint_id)
        # Step 2
        aborted = sink.abort_uncommitted(sink_uid, keep=set())
        # Step 3
        self.planner.reset(point.source_positions() if point else {})
        self.storage.discard_working_state(self.job_id)  # every version is stale now
        # Step 4
        n = len(self.state_inputs)
        if point is not None and self.graph.keyed is not None:
            handles = point.handles(self.graph.keyed.uid)
            self.state_inputs = tuple(
                StateInput(handles=handles, restored_from=point.checkpoint_id) for _ in range(n)
            )
        else:
            self.state_inputs = tuple(StateInput() for _ in range(n))
        self.restores.append(point.checkpoint_id if point else None)
        self._publish(
            p.JobRestored(
                checkpoint_id=point.checkpoint_id if point else None,
                external_path=point.external_path if point else None,
                committed_transactions=committed,
                aborted_parts=aborted,
            )
        )


def durable_working_state(options: JobOptions, storage: CheckpointStorage) -> bool:
    """Whether working state is also kept in checkpoint storage between epochs.

    On by default when the master is not local: on a cluster the next epoch's task may run on
    another machine. Local masters (``local[*]``, ``local-cluster[...]``) share one disk.
    """
    if options.durable_working_state is False:
        return False
    can = isinstance(storage, FileSystemCheckpointStorage)
    if options.durable_working_state and not can:
        raise ConfigurationError("--durable-working-state on needs --checkpoint-dir")
    return can and (options.durable_working_state or not options.master.startswith("local"))
