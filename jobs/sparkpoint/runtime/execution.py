"""The job's side of checkpointing, the same under either authority: epochs, commits, restores.

:class:`JobExecution` runs one epoch on Spark and accepts it (working-state versions, source
positions, the tasks' events and acknowledgements), commits the sink transactions of a
completed checkpoint, and restores a checkpoint (state, source positions, sink transactions).
It decides nothing: an authority (:mod:`~sparkpoint.runtime.authority` in-process, or
:mod:`~sparkpoint.runtime.connected` through the control plane) says which barrier an epoch
carries, which checkpoint completed and what to restore, and hears of every acknowledgement
through an :class:`~sparkpoint.runtime.epochs.EpochListener`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.clock import Clock
from sparkpoint.connectors.sinks import TwoPhaseCommitSink
from sparkpoint.connectors.sources import Source, SourceUnavailableError
from sparkpoint.console import Console
from sparkpoint.errors import ConfigurationError, InjectedFailure
from sparkpoint.events import EventSink
from sparkpoint.graph import JobGraph, SinkNode
from sparkpoint.job_graph import Region
from sparkpoint.options import JobOptions
from sparkpoint.runtime.durable_copies import DurableCopiesWatch
from sparkpoint.runtime.epochs import EpochListener, EpochOutcome, EpochRunner, unacknowledged
from sparkpoint.runtime.plan import EpochPlan, FailureInjection, SplitRange, StateInput, TaskReport
from sparkpoint.runtime.planner import EpochPlanner
from sparkpoint.runtime.recovery import RestorePoint
from sparkpoint.runtime.spark import EpochFailedError, SparkApplication

SWEEP_AFTER_RESTORE_MS = 60_000
"""How long after a restore commits keep sweeping the parts of earlier attempts: a killed
task's Python worker lives at most ``spark.python.task.killTimeout`` (2 s) longer."""


class JobExecution:
    """The running job: positions, working state, counters, events, sinks."""

    def __init__(
        self,
        graph: JobGraph,
        options: JobOptions,
        clock: Clock,
        events: EventSink,
        storage: CheckpointStorage,
        planner: EpochPlanner,
        *,
        failure: FailureInjection | None,
        durable: bool,
    ) -> None:
        self.graph = graph
        self.options = options
        self.clock = clock
        self.job_id = options.job_id
        self.events = events
        self.storage = storage
        self.planner = planner
        self.failure = failure
        self.durable = durable
        self.durable_copies = DurableCopiesWatch(clock)
        self.attempt = 1  # the authority sets it: every event carries it
        # Vertices of regions that a region failover left running -> their attempt (plan's).
        self.vertex_attempts: dict[str, int] = {}
        self.region_restores: list[tuple[str, int | None]] = []  # (region, checkpoint id)
        # (sink uid, epoch): parts that a failed epoch wrote in a region that kept running
        self._orphaned: list[tuple[SinkNode, int]] = []
        self.epoch = 0
        self.committed_up_to = 0
        self.records = 0
        self.status = p.JobStatus.CREATED
        self.completed: list[int] = []
        self.restores: list[int | None] = []
        self.state_inputs: dict[str, tuple[StateInput, ...]] = {
            uid: tuple(StateInput() for _ in range(n)) for uid, n in graph.stateful().items()
        }
        self.restore_storage: CheckpointStorage | None = None  # where restored handles live
        self.spark: SparkApplication | None = None  # set once Spark is up; RUNNING reports it
        self._restored_ms: int | None = None  # when the latest restore ran; None: swept since
        self.console: Console | None = None  # what the user sees; the driver sets it
        self._unacknowledged: set[str] = set()  # sources a completion could not be told
        # (sink uid, another output) -> the sink that commits there: transactions of another
        # job's checkpoint that this job restored.
        self._other_outputs: dict[tuple[str, str], TwoPhaseCommitSink] = {}
        self.executors: list[p.ExecutorModel] | None = None  # the heartbeat reports them

    # ------------------------------------------------------------------ events
    def publish(self, *payloads: Any) -> None:
        now = self.clock.now_ms()
        self.events.publish([p.envelope(self.job_id, self.attempt, now, pl) for pl in payloads])

    def set_status(self, status: p.JobStatus, cause: str | None = None) -> None:
        """Report a status change; RUNNING names the Spark application (once Spark is up)."""
        if status == self.status:
            return
        spark = self.spark if status is p.JobStatus.RUNNING else None
        self.publish(
            p.JobStatusChanged(
                status=status,
                previous=self.status,
                cause=cause,
                spark_ui_url=spark.ui_url if spark else None,
                spark_application_id=spark.application_id if spark else None,
            )
        )
        self.status = status

    # ------------------------------------------------------------------ epochs
    def run_epoch(
        self,
        runner: EpochRunner,
        ranges: list[SplitRange],
        barrier: CheckpointBarrier | None,
        listener: EpochListener,
    ) -> EpochOutcome:
        """Run one epoch (its ranges carry the barrier's offsets) and accept it.

        Steps: (1) plan, (2) run it on Spark, (3) accept it, telling ``listener``; a failure
        in (2) or (3) makes the outcome failed, (4) count the epoch either way.
        """
        # Step 1
        plan = EpochPlan(
            job_id=self.job_id,
            job_name=self.graph.name,
            attempt=self.attempt,
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
            state_backend=self.options.state_backend,
            incremental=self.options.incremental,
            alignment_buffer_bytes=self.options.alignment_buffer_bytes,
            vertex_attempts=dict(self.vertex_attempts),
        )
        started = self.clock.monotonic_ms()
        outcome = EpochOutcome(plan.epoch)
        try:
            # Step 2
            reports = runner.run(plan)
            self.executors = _executors(runner)
            # Step 3
            self._accept(plan, reports, self.clock.monotonic_ms() - started, listener)
        except EpochFailedError as err:
            outcome = EpochOutcome(plan.epoch, err.cause, err.failed, err.recoverable)
        except InjectedFailure as err:
            outcome = EpochOutcome(plan.epoch, f"InjectedFailure: {err}")
        # Step 4
        self.epoch += 1
        return outcome

    def _accept(
        self,
        plan: EpochPlan,
        reports: list[TaskReport],
        duration_ms: float,
        listener: EpochListener,
    ) -> None:
        """Accept a finished epoch: the reports of its tasks become the truth."""
        expected = {(uid, i) for uid, n in self.graph.tasks().items() for i in range(n)}
        by_task = {
            (r.operator_id, r.subtask): r
            for r in reports
            if r.attempt == plan.attempt_of(r.operator_id) and r.epoch == plan.epoch
        }
        if set(by_task) != expected:
            missing = sorted(expected - set(by_task))
            raise EpochFailedError(plan.epoch, f"no report from subtasks {missing}")
        # Step 1: the working-state versions written by the accepted task attempts.
        previous = self.state_inputs
        self.state_inputs = {
            uid: tuple(
                StateInput(
                    version=by_task[(uid, i)].state_version,
                    durable_path=by_task[(uid, i)].state_durable_path,
                    backend_url=by_task[(uid, i)].state_backend_url,
                    durable_files=by_task[(uid, i)].state_durable_files,
                )
                for i in range(len(inputs))
            )
            for uid, inputs in previous.items()
        }
        needed = {url for ins in self.state_inputs.values() for i in ins for url in i.durable_files}
        replaced = {
            url for ins in previous.values() for i in ins for url in i.durable_files
        } - needed
        self.storage.discard_working_state(self.job_id, sorted(replaced))
        if self.durable:
            self.durable_copies.accepted(plan.epoch, by_task, self.console)
        # Step 2: positions, counters.
        self.planner.advance(list(plan.ranges))
        records = sum(r.records for r in plan.ranges)
        self.records += records
        self.planner.observe(records, duration_ms)
        # Step 3: the tasks' events, then the acknowledgements and declines.
        listener.before_acks()
        order = {uid: i for i, uid in enumerate(self.graph.tasks())}  # sources first
        ordered = sorted(by_task.values(), key=lambda r: (order[r.operator_id], r.subtask))
        events = [ev for r in ordered for ev in r.events]
        if listener.acks_carry_barrier_events:
            events = unacknowledged(events, (ack for r in ordered for ack in r.acks))
        self.publish(*events)
        for r in ordered:
            for decline in r.declines:
                self.publish(decline)
                listener.on_decline(plan.attempt, decline)
            for ack in r.acks:
                self.publish(ack)
                listener.on_ack(plan.attempt, ack)
        listener.after_acks()
        # Step 4: the heartbeat (with how long restoring took, in an epoch that restored).
        restored = [r for r in ordered if r.restore_ms is not None]
        firsts = [r.first_record_wall_ms for r in restored if r.first_record_wall_ms is not None]
        self.publish(
            p.Heartbeat(
                epoch=plan.epoch,
                records=records,
                duration_ms=duration_ms,
                records_per_second=records / duration_ms * 1000 if duration_ms > 0 else 0.0,
                source_lag=self.planner.lag(),
                host_time=self.clock.now_ms(),
                unanswered_splits=self.planner.unanswered_splits(),
                epoch_bound_ms=self.planner.held_within_ms,
                executors=self.executors,
                restore_duration_ms=max((r.restore_ms or 0.0 for r in restored), default=None),
                first_record_after_restore=min(firsts, default=None),
            )
        )
        listener.after_epoch(plan.epoch)

    # ------------------------------------------------------------------ commits, restores
    def commit(self, checkpoint_id: int, acks: Iterable[p.SnapshotCompleted]) -> None:
        """Commit the sink transactions that the acknowledgements of a completed checkpoint
        carry (``sink_committed`` each), then tell each source the checkpoint's positions
        (``notify_checkpoint_complete``: it may acknowledge what they cover)."""
        acks = list(acks)
        for ack in acks:
            for txn in ack.sink_transactions:
                self._commit_txn(ack, txn)
                self.publish(
                    p.SinkCommitted(
                        checkpoint_id=checkpoint_id,
                        operator_id=ack.operator_id,
                        subtask=ack.subtask,
                        transaction_id=txn.transaction_id,
                        parts=len(txn.parts),
                    )
                )
        positions = {split: at for ack in acks for split, at in ack.source_positions.items()}
        for vertex, own in self.graph.positions_by_source(positions):
            self._notify(vertex.uid, vertex.source, checkpoint_id, own)
        self.committed_up_to = max(self.committed_up_to, checkpoint_id)
        self._sweep_earlier_attempts()

    def _notify(self, uid: str, source: Source, checkpoint_id: int, own: dict[str, int]) -> None:
        """Tell a source that a checkpoint completed. One whose system does not answer is
        told by the next completion (its output is committed: nothing is lost); the console
        says so once per outage, and when it is told again."""
        try:
            source.notify_checkpoint_complete(checkpoint_id, own)
        except SourceUnavailableError as err:
            if uid not in self._unacknowledged and self.console is not None:
                self.console.line(
                    "source_unacknowledged",
                    f"source {uid} was not told that checkpoint {checkpoint_id} completed: "
                    f"{str(err).rstrip('.')}; a later completed checkpoint tells it",
                    level="warning",
                    checkpoint_id=checkpoint_id,
                )
            self._unacknowledged.add(uid)
            return
        if uid in self._unacknowledged:
            self._unacknowledged.discard(uid)
            if self.console is not None:
                self.console.line(
                    "source_acknowledged",
                    f"source {uid} was told again (checkpoint {checkpoint_id} completed)",
                    checkpoint_id=checkpoint_id,
                )

    def _sink_node(self, ack: p.SnapshotCompleted, txn: p.SinkTransactionModel) -> SinkNode:
        """The sink of transaction ``txn`` in ``ack``: the one it names, else (a checkpoint
        of a one-sink vertex) the sink chained into the acknowledging vertex."""
        nodes = self.graph.sinks_of(ack.operator_id)
        found = [n for n in nodes if txn.sink is None or n.uid == txn.sink]
        if not found:
            raise ConfigurationError(
                f"checkpoint {ack.checkpoint_id} holds a transaction of sink "
                f"{txn.sink or '(unnamed)'} of {ack.operator_id}[{ack.subtask}], which has no "
                "such sink in this job"
            )
        return found[0]

    def _commit_txn(self, ack: p.SnapshotCompleted, txn: p.SinkTransactionModel) -> None:
        """Commit ``txn`` where it was pre-committed: a transaction of a checkpoint that this
        job restored may come from another output (another job's, this job's before its
        output moved); it is committed there when this job reaches it, else, as always, at
        this job's sink."""
        node = self._sink_node(ack, txn)
        sink = node.sink
        if txn.location is not None and txn.location != sink.location:
            key = (node.uid, txn.location)
            there = self._other_outputs.get(key) or sink.at(txn.location)
            if there is not None:  # not reached now (an outage?): asked again next time
                self._other_outputs[key] = there
            sink = there or sink
        sink.commit(node.uid, txn)

    def _sweep_earlier_attempts(self) -> None:
        """Abort the parts that tasks of earlier attempts wrote after the restore aborted theirs.

        A failed epoch's sibling tasks are killed, not awaited: Spark ends a killed task at once
        but gives its Python worker ``spark.python.task.killTimeout`` (2 s) before destroying
        it, so a sink writer can still create a part after the restore swept. Each commit in
        the :data:`SWEEP_AFTER_RESTORE_MS` after a restore (and the first after it, however
        late) sweeps again; the swept parts belong to attempts that can never commit them."""
        if self._restored_ms is None:
            return
        for node in self.graph.sinks:
            attempt = self.vertex_attempts.get(node.vertex, self.attempt)
            node.sink.abort_uncommitted(self.job_id, node.uid, keep=set(), before_attempt=attempt)
        for node, epoch in self._orphaned:
            node.sink.abort_uncommitted(self.job_id, node.uid, keep=set(), in_epoch=epoch)
        if self.clock.now_ms() - self._restored_ms >= SWEEP_AFTER_RESTORE_MS:
            self._restored_ms = None
            self._orphaned = []

    def restore(
        self,
        point: RestorePoint | None,
        storage: CheckpointStorage | None,
        *,
        record: bool = True,
    ) -> None:
        """Restore a checkpoint (None: the beginning); ``storage`` is where its handles live
        (None: the job's own storage). ``record`` False leaves it out of ``restores``.

        Steps: (1) commit the restored checkpoint's pre-committed transactions again (also
        when another job wrote them: a fork), (2) abort every other uncommitted part that this
        job wrote, never another job's (:mod:`~sparkpoint.connectors.sinks`), (3) seek the
        sources back, (4) hand the state handles to the subtasks, (5) report
        ``job_restored``."""
        self.restore_storage = storage
        self.vertex_attempts.clear()  # every vertex restarts in the job's attempt
        # Step 1
        committed = self._commit_again(point)
        # Step 2
        aborted = sum(
            node.sink.abort_uncommitted(self.job_id, node.uid, keep=set())
            for node in self.graph.sinks
        )
        if self.attempt > 1:  # an attempt 1 has no earlier attempts to sweep up after
            self._restored_ms = self.clock.now_ms()
        # Step 3
        self.planner.reset(point.source_positions() if point else {})
        self.storage.discard_working_state(self.job_id)  # every version is stale now
        # Step 4: every keyed vertex gets its own handles, every vertex its operator state.
        keyed = {k.uid for k in self.graph.keyed_vertices}
        self.state_inputs = {
            uid: tuple(
                StateInput(
                    handles=point.handles(uid) if uid in keyed else (),
                    operator_state=point.operator_state(uid),
                    restored_from=point.checkpoint_id,
                )
                if point is not None
                else StateInput()
                for _ in range(n)
            )
            for uid, n in self.graph.stateful().items()
        }
        # Step 5
        if record:
            self.restores.append(point.checkpoint_id if point else None)
        self.publish(
            p.JobRestored(
                checkpoint_id=point.checkpoint_id if point else None,
                external_path=point.external_path if point else None,
                committed_transactions=committed,
                aborted_parts=aborted,
            )
        )

    def _commit_again(self, point: RestorePoint | None) -> int:
        """Commit the pre-committed transactions of ``point`` again (idempotent); how many."""
        if point is None:
            return 0
        committed = 0
        for ack in point.acks:
            for txn in ack.sink_transactions:
                committed += 1
                self._commit_txn(ack, txn)
        self.committed_up_to = max(self.committed_up_to, point.checkpoint_id)
        return committed

    def restore_region(
        self,
        region: Region,
        point: RestorePoint | None,
        storage: CheckpointStorage | None,
        previous_attempt: int,
        failed_epoch: int,
    ) -> None:
        """Restore only ``region`` (a region failover, :mod:`~sparkpoint.runtime.failover`)
        from a checkpoint (None: the beginning); every other vertex keeps its working state
        and source positions from before the failed epoch, and runs that epoch again in
        ``previous_attempt``, the attempt it ran in (its transactions stay its own).

        Steps: (1) the other vertices keep their attempt, (2) commit the transactions of the
        restored checkpoint again, (3) abort the uncommitted parts of the region's
        sinks, and the parts that the other regions' sinks wrote in ``failed_epoch`` (no
        working state names them; commits sweep them again a while, as after any restore),
        (4) seek the region's sources back, (5) hand the state handles to the region's
        subtasks, (6) report ``job_restored``."""
        inside = set(region.vertices)
        self.restore_storage = storage
        # Step 1
        for uid in self.graph.tasks():
            if uid in inside:
                self.vertex_attempts.pop(uid, None)
            else:
                self.vertex_attempts.setdefault(uid, previous_attempt)
        # Step 2: every region's (idempotent): the other regions' subtasks drop their pending
        # transactions of this checkpoint, whose commit a failure may have come before.
        committed = self._commit_again(point)
        # Step 3
        aborted = sum(
            node.sink.abort_uncommitted(self.job_id, node.uid, keep=set())
            for node in self.graph.sinks
            if node.vertex in inside
        )
        self._orphaned += [(n, failed_epoch) for n in self.graph.sinks if n.vertex not in inside]
        aborted += sum(
            node.sink.abort_uncommitted(self.job_id, node.uid, keep=set(), in_epoch=epoch)
            for node, epoch in self._orphaned
        )
        self._restored_ms = self.clock.now_ms()
        # Step 4
        restored = point.source_positions() if point is not None else {}
        ids = self.graph.split_ids()
        positions = dict(zip(ids, self.planner.positions, strict=True))
        for src in self.graph.sources:
            if src.uid in inside:
                first = self.graph.split_offset(src.uid)
                for sid in ids[first : first + src.parallelism]:
                    positions[sid] = restored.get(sid, 0)
        self.planner.reset(positions)
        # Step 5
        stale = [
            url
            for uid, ins in self.state_inputs.items()
            if uid in inside
            for i in ins
            for url in i.durable_files
        ]
        self.storage.discard_working_state(self.job_id, stale)
        keyed = {k.uid for k in self.graph.keyed_vertices}
        self.state_inputs = {
            uid: tuple(
                StateInput(
                    handles=point.handles(uid) if uid in keyed else (),
                    operator_state=point.operator_state(uid),
                    restored_from=point.checkpoint_id,
                )
                if point is not None
                else StateInput()
                for _ in range(n)
            )
            if uid in inside
            else self.state_inputs[uid]
            for uid, n in self.graph.stateful().items()
        }
        # Step 6
        self.region_restores.append((region.name, point.checkpoint_id if point else None))
        self.publish(
            p.JobRestored(
                checkpoint_id=point.checkpoint_id if point else None,
                external_path=point.external_path if point else None,
                committed_transactions=committed,
                aborted_parts=aborted,
            )
        )


def _executors(runner: EpochRunner) -> list[p.ExecutorModel] | None:
    """The executors of a runner that has them (Spark's); None for one that runs in-process."""
    listing = getattr(runner, "executors", None)
    return [e.model() for e in listing()] if callable(listing) else None
