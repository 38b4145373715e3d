"""The checkpoint authority's pure core: ids, triggers, acknowledgements, expiry and failover.

:class:`CheckpointCoordinator` plays Flink's ``CheckpointCoordinator`` without I/O: the host feeds
it triggers, acknowledgements and declines, calls ``expire_overdue`` on a timer, and acts on the
answers (write ``_metadata``, delete the state of failed and subsumed checkpoints, fail over when
``must_fail_job``). Each failure is handed out once: ``drain_failed`` holds only the pending
checkpoints that a completion subsumed, never what a method returned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.failure_manager import CheckpointFailureManager
from sparkpoint.checkpointing.pending import (
    AckResult,
    CheckpointFailureReason,
    CompletedCheckpoint,
    FailedCheckpoint,
    FailoverDecision,
    PendingCheckpoint,
    SubtaskKey,
    TaskAcknowledgeResult,
    expected_subtasks,
    format_subtasks,
)
from sparkpoint.checkpointing.store import CompletedCheckpointStore
from sparkpoint.checkpointing.trigger_timing import TriggerTiming
from sparkpoint.clock import Clock
from sparkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    StaleAttemptError,
)
from sparkpoint.protocol import CheckpointKind, SnapshotCompleted

Reason = CheckpointFailureReason
#: What to add to an expired checkpoint's message (None: nothing), from the failed checkpoint.
Explain = Callable[[FailedCheckpoint], str | None]


class CheckpointCoordinator:
    """Assigns checkpoint ids, tracks pending checkpoints and completes, expires or aborts them."""

    def __init__(
        self,
        job_id: str,
        tasks: dict[str, int],
        config: CheckpointConfig,
        clock: Clock,
        *,
        attempt: int = 1,
        next_checkpoint_id: int = 1,
    ) -> None:
        """Create the coordinator of a job.

        Args:
            job_id: the job's id, named in every error.
            tasks: operator uid -> parallelism; every ``(uid, i < parallelism)`` must acknowledge.
            config: the checkpoint configuration.
            clock: wall clock for timestamps, monotonic clock for deadlines and pauses.
            attempt: the current job attempt.
            next_checkpoint_id: the id of the next checkpoint (>= 1; ids only ever increase).

        Raises:
            ConfigurationError: when ``tasks`` is empty or a parallelism is below 1.
        """
        if next_checkpoint_id < 1:
            raise ConfigurationError(f"job {job_id}: next_checkpoint_id must be >= 1")
        self.job_id = job_id
        self.set_tasks(tasks)
        self._config = config
        self._clock = clock
        self._attempt = attempt
        self._next_id = next_checkpoint_id
        self._pending: dict[int, PendingCheckpoint] = {}
        self.store = CompletedCheckpointStore(config.retained)
        self.failure_manager = CheckpointFailureManager(config.tolerable_failures)
        self._completed_ids: set[int] = set()
        self._failed: list[FailedCheckpoint] = []
        self._subsumed: list[tuple[int | None, CompletedCheckpoint]] = []  # (subsumed by, cp)
        self._timing = TriggerTiming(clock)
        self._must_fail_cause: str | None = None

    # ------------------------------------------------------------------------- state

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def config(self) -> CheckpointConfig:
        return self._config

    @property
    def next_checkpoint_id(self) -> int:
        return self._next_id

    @property
    def pending(self) -> dict[int, PendingCheckpoint]:
        """The pending checkpoints by id (a copy of the mapping)."""
        return dict(self._pending)

    @property
    def pending_count(self) -> int:
        """How many checkpoints are pending (without copying them)."""
        return len(self._pending)

    def pending_checkpoint(self, checkpoint_id: int) -> PendingCheckpoint | None:
        """The pending checkpoint ``checkpoint_id`` or None, without copying the mapping."""
        return self._pending.get(checkpoint_id)

    @property
    def must_fail_job(self) -> bool:
        """True once the tolerable failure threshold was exceeded; cleared by a failover."""
        return self._must_fail_cause is not None

    @property
    def must_fail_cause(self) -> str | None:
        return self._must_fail_cause

    def update_config(self, changes: dict[str, Any], *, running: bool = True) -> CheckpointConfig:
        """Apply changes (``running``: runtime-mutable ones) from the next trigger; a lower
        ``retained`` subsumes.

        Raises:
            ConfigurationError: when a field cannot change while the job runs, or is invalid.
        """
        new = self._config.with_changes(changes, running=running)
        if new.retained != self._config.retained:
            self._subsumed.extend((None, cp) for cp in self.store.set_retained(new.retained))
        self.failure_manager.set_tolerable(new.tolerable_failures)
        self._config = new
        return new

    def drain_failed(self) -> list[FailedCheckpoint]:
        """Pending checkpoints that completions subsumed since the last drain."""
        failed, self._failed = self._failed, []
        return failed

    def set_tasks(self, tasks: dict[str, int]) -> None:
        """The job's operators changed (a driver registered with another graph: a new version
        of the job, another parallelism): the subtasks that acknowledge from now on. Pending
        checkpoints expected the old ones; the new attempt that follows aborts them.

        Raises:
            ConfigurationError: when ``tasks`` is empty or a parallelism is below 1.
        """
        self._expected = expected_subtasks(self.job_id, tasks)
        self._operators = ", ".join(f"{op} x{n}" for op, n in sorted(tasks.items()))

    @property
    def subsumed_waiting(self) -> bool:
        """Whether :meth:`drain_subsumed` has checkpoints to hand out."""
        return bool(self._subsumed)

    def drain_subsumed(self) -> list[CompletedCheckpoint]:
        """Completed checkpoints retention dropped since the last drain: delete their state.
        Drain after writing the new ``_metadata``: ``finalize_failed`` takes back only these."""
        subsumed, self._subsumed = self._subsumed, []
        return [cp for _, cp in subsumed]

    # ------------------------------------------------------------------------- triggering

    def start_periodic_timer(self) -> None:
        """The job (re)started running: the next periodic checkpoint is one interval away
        (Flink starts its checkpoint scheduler when the job reaches RUNNING)."""
        self._timing.restart()

    def periodic_due(self) -> bool:
        """Whether a periodic checkpoint is due (see :class:`TriggerTiming`), no failover."""
        return not self.must_fail_job and self._timing.periodic_due(
            self._config, len(self._pending)
        )

    def final_wait_ms(self) -> float:
        """Milliseconds before a final checkpoint may go (:meth:`TriggerTiming.final_wait`)."""
        return self._timing.final_wait(self._config)

    def trigger(
        self,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
        *,
        periodic: bool = False,
        is_final: bool = False,
        target_directory: str | None = None,
    ) -> PendingCheckpoint:
        """Start a checkpoint or savepoint under the next id.

        Savepoints and final checkpoints are never refused. A regular checkpoint is refused
        while ``max_concurrent`` checkpoints (savepoints included, as in Flink) are pending; a
        periodic one also while the minimum pause is not over.

        Raises:
            CheckpointTriggerError: with reason ``TOO_MANY_CHECKPOINT_REQUESTS`` or
                ``MINIMUM_TIME_BETWEEN_CHECKPOINTS``; no id is used up then.
        """
        cfg, now = self._config, self._clock.monotonic_ms()
        if kind is CheckpointKind.CHECKPOINT and not is_final:
            self._timing.check_trigger(self.job_id, cfg, list(self._pending), periodic, now)
        checkpoint = PendingCheckpoint(
            checkpoint_id=self._next_id,
            kind=kind,
            attempt=self._attempt,
            trigger_timestamp=self._clock.now_ms(),
            trigger_monotonic_ms=now,
            timeout_ms=cfg.timeout_ms,
            expected=self._expected,
            is_final=is_final,
            target_directory=target_directory,
        )
        self._next_id += 1
        self._pending[checkpoint.checkpoint_id] = checkpoint
        if kind is CheckpointKind.CHECKPOINT:
            self._timing.periodic_base = now
        return checkpoint

    # ------------------------------------------------------------------------- task messages

    def acknowledge(self, attempt: int, ack: SnapshotCompleted) -> AckResult:
        """Record a subtask's acknowledgement; the last expected one completes the checkpoint.

        Completion: (1) the checkpoint leaves ``pending``, (2) enters the store (what retention
        drops goes to ``drain_subsumed``), (3) resets the failure count, (4) aborts older
        pending regular checkpoints as ``CHECKPOINT_SUBSUMED`` (to ``drain_failed``).

        Raises:
            StaleAttemptError: when ``attempt`` is older than the current one.
            CheckpointError: for an unknown subtask, a checkpoint never triggered, or an
                attempt newer than the current one.
        """
        cid, key = ack.checkpoint_id, (ack.operator_id, ack.subtask)
        self._check_message(attempt, cid, key, f"acknowledgement of checkpoint {cid}")
        pending = self._pending.get(cid)
        if pending is None:
            done = cid in self._completed_ids
            return AckResult(discarded=not done, duplicate=done)
        if pending.acknowledge_task(ack) is TaskAcknowledgeResult.DUPLICATE:
            return AckResult(duplicate=True)
        if not pending.is_fully_acknowledged:
            return AckResult()
        return AckResult(completed=self._complete(pending))

    def decline(
        self,
        attempt: int,
        checkpoint_id: int,
        operator_id: str,
        subtask: int,
        reason: str,
        *,
        asynchronous: bool = False,
    ) -> FailedCheckpoint | None:
        """Fail a checkpoint a subtask declined (``CHECKPOINT_DECLINED``) or could not write
        (``asynchronous``: Flink's ``CHECKPOINT_ASYNC_EXCEPTION``); None if not pending.

        Raises:
            StaleAttemptError: when ``attempt`` is older than the current one.
            CheckpointError: for an unknown subtask or a checkpoint never triggered.
        """
        key = (operator_id, subtask)
        self._check_message(attempt, checkpoint_id, key, f"decline of checkpoint {checkpoint_id}")
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            return None
        message = f"{self._name(checkpoint_id)} declined by {operator_id}[{subtask}]: {reason}"
        why = Reason.CHECKPOINT_ASYNC_EXCEPTION if asynchronous else Reason.CHECKPOINT_DECLINED
        return self._fail(pending, why, message, by=key)

    # ------------------------------------------------------------------------- timers, aborts

    def expire_overdue(
        self, now_ms: float | None = None, why: Explain | None = None
    ) -> list[FailedCheckpoint]:
        """Fail as ``CHECKPOINT_EXPIRED`` every pending checkpoint whose timeout (the one
        configured at its trigger) has passed, exactly at the deadline included.

        Args:
            now_ms: The monotonic time to judge by; the clock's when None. The control plane
                passes the time up to which it has read its inbox, so that acknowledgements
                that arrived in time but were not read yet do not let a checkpoint expire.
            why: What to add to an expired checkpoint's message (None: nothing), before it
                counts against the tolerable failures: a failover's cause quotes it too.
        """
        now = self._clock.monotonic_ms() if now_ms is None else now_ms
        expired = []
        for cid in sorted(self._pending):
            pending = self._pending[cid]
            if now >= pending.deadline_monotonic_ms():
                message = (
                    f"{self._name(cid)} expired before completing after {pending.timeout_ms} ms: "
                    f"{pending.num_acknowledged}/{pending.num_subtasks} subtasks acknowledged; "
                    f"missing: {format_subtasks(pending.missing_subtasks())}"
                )
                expired.append(self._fail(pending, Reason.CHECKPOINT_EXPIRED, message, why=why))
        return expired

    def abort_all(self, reason: CheckpointFailureReason, message: str) -> list[FailedCheckpoint]:
        """Abort every pending checkpoint, oldest first, with the given reason."""
        return self._abort_pending(reason, f"aborted: {message}")

    def finalize_failed(self, checkpoint_id: int, message: str) -> FailedCheckpoint:
        """Take back a completion whose ``_metadata`` could not be written.

        It fails as ``FINALIZE_CHECKPOINT_FAILURE`` and leaves the store; the checkpoints its
        completion subsumed that were not drained yet return to the store.

        Raises:
            CheckpointNotFoundError: when the store does not hold that checkpoint.
            CheckpointError: when it is pinned.
        """
        if self.store.get(checkpoint_id) is None:
            raise CheckpointNotFoundError(
                f"job {self.job_id}: checkpoint {checkpoint_id} is not in the store"
            )
        completed = self.store.remove(checkpoint_id)
        self._completed_ids.discard(checkpoint_id)
        taken_back = [cp for by, cp in self._subsumed if by == checkpoint_id]
        self._subsumed = [(by, cp) for by, cp in self._subsumed if by != checkpoint_id]
        for checkpoint in taken_back:
            self._subsumed.extend((None, cp) for cp in self.store.add(checkpoint))
        if completed.is_final:
            self._timing.failed(self._timing.monotonic_of(completed.trigger_timestamp))
        message = f"{self._name(checkpoint_id)} failed to finalize: {message}"
        failed = completed.to_failed(
            Reason.FINALIZE_CHECKPOINT_FAILURE, message, self._clock.now_ms()
        )
        self._report_failure(failed)
        return failed

    def failover(self, cause: str) -> FailoverDecision:
        """Abort all pending checkpoints, start the next attempt, and restore the completed
        checkpoint with the highest id, savepoints included (None when there is none)."""
        return self._restart(cause, self.store.latest(include_savepoints=True))

    def failover_to(self, checkpoint: CompletedCheckpoint | None, cause: str) -> FailoverDecision:
        """Like :meth:`failover`, restoring ``checkpoint`` (the host chose it among the store's:
        Sparkpoint's control plane skips those a restore went back past); None: the host
        restores what the job started from."""
        return self._restart(cause, checkpoint)

    def restore_to(self, checkpoint_id: int) -> FailoverDecision:
        """Like :meth:`failover`, restoring the given checkpoint (a user's request).

        Raises:
            CheckpointNotFoundError: when the store does not hold it; nothing changes then.
        """
        checkpoint = self.store.get(checkpoint_id)
        if checkpoint is None:
            retained = ", ".join(str(cp.checkpoint_id) for cp in self.store.all()) or "none"
            raise CheckpointNotFoundError(
                f"job {self.job_id}: checkpoint {checkpoint_id} is not retained "
                f"(retained: {retained})"
            )
        return self._restart(
            f"restore of checkpoint {checkpoint_id} requested", checkpoint, requested=True
        )

    def restore_from(self, checkpoint: CompletedCheckpoint, cause: str) -> FailoverDecision:
        """Like :meth:`failover`, restoring a checkpoint the store does not hold (a savepoint
        read from its path)."""
        return self._restart(cause, checkpoint, requested=True)

    # ------------------------------------------------------------------------- recovery

    def recover(
        self,
        *,
        completed: Iterable[CompletedCheckpoint] = (),
        failed: Iterable[FailedCheckpoint] = (),
        pending: Iterable[PendingCheckpoint] = (),
        pins: Iterable[tuple[int, str]] = (),
        last_trigger_timestamp: int | None = None,
        last_finished_timestamp: int | None = None,
        failed_final: FailedCheckpoint | None = None,
    ) -> None:
        """Rebuild the state of a host that restarted (the control plane) from its records.

        Steps: (1) completed checkpoints enter the store in id order (retention replays),
        (2) each one's pins come back as it enters, (3) failures since the last completion
        replay through the failure manager, (4) pending checkpoints come back with their
        acknowledgements, (5) the periodic, pause and final-retry clocks (``failed_final``:
        this attempt's last final checkpoint, if it failed) continue from the recorded times.
        """
        # Steps 1 and 2; the next drain hands what the replay subsumes to the host.
        completed = sorted(completed, key=lambda c: c.checkpoint_id)
        self._subsumed.extend((None, old) for old in self.store.replay(completed, pins))
        for cp in completed:
            self._completed_ids.add(cp.checkpoint_id)
            self.failure_manager.handle_success(cp.checkpoint_id)
        # Step 3
        for f in sorted(failed, key=lambda c: c.checkpoint_id):
            self._report_failure(f)
        # Step 4
        for pc in pending:
            self._pending[pc.checkpoint_id] = pc
            self._next_id = max(self._next_id, pc.checkpoint_id + 1)
        # Step 5
        self._timing.recover(last_trigger_timestamp, last_finished_timestamp, failed_final)

    def monotonic_of(self, timestamp: int) -> float:
        """The monotonic time of a recorded wall-clock timestamp (for recovered deadlines)."""
        return self._timing.monotonic_of(timestamp)

    # ------------------------------------------------------------------------- internals

    def _name(self, checkpoint_id: int) -> str:
        return f"checkpoint {checkpoint_id} of job {self.job_id}"

    def _check_message(self, attempt: int, checkpoint_id: int, key: SubtaskKey, what: str) -> None:
        what = f"job {self.job_id}: {what} by {key[0]}[{key[1]}]"
        if attempt < self._attempt:
            raise StaleAttemptError(
                f"{what} carries attempt {attempt}, older than the current attempt "
                f"{self._attempt}; refused"
            )
        if attempt > self._attempt:
            raise CheckpointError(
                f"{what} carries attempt {attempt}, newer than the current attempt {self._attempt}"
            )
        if key not in self._expected:
            raise CheckpointError(
                f"{what}: unknown subtask {key[0]}[{key[1]}] (operators: {self._operators})"
            )
        if checkpoint_id >= self._next_id:
            raise CheckpointError(f"{what}: checkpoint {checkpoint_id} was never triggered")

    def _complete(self, pending: PendingCheckpoint) -> CompletedCheckpoint:
        cid, now = pending.checkpoint_id, self._clock.monotonic_ms()
        # Step 1: the checkpoint leaves pending and becomes a completed checkpoint.
        del self._pending[cid]
        completed = pending.finalize(self._clock.now_ms(), now)
        self._completed_ids.add(cid)
        self._timing.finished(now)
        # Step 2: into the store; retention may subsume older completed checkpoints.
        self._subsumed.extend((cid, cp) for cp in self.store.add(completed))
        # Step 3: a completion resets the failure count.
        self.failure_manager.handle_success(cid)
        # Step 4: older pending regular checkpoints are subsumed (Flink: not by a savepoint).
        if completed.is_savepoint and not completed.is_final:
            return completed
        for older in sorted(i for i in self._pending if i < cid):
            candidate = self._pending[older]
            if not (candidate.is_savepoint or candidate.is_final):
                message = f"{self._name(older)} was subsumed by completed checkpoint {cid}"
                self._failed.append(self._fail(candidate, Reason.CHECKPOINT_SUBSUMED, message))
        return completed

    def _fail(
        self,
        pending: PendingCheckpoint,
        reason: Reason,
        message: str,
        by: SubtaskKey | None = None,
        why: Explain | None = None,
    ) -> FailedCheckpoint:
        del self._pending[pending.checkpoint_id]
        self._timing.failed(pending.trigger_monotonic_ms if pending.is_final else None)
        failed = pending.abort(reason, message, self._clock.now_ms(), by)
        if why is not None and (text := why(failed)) is not None:
            failed = replace(failed, message=f"{message}. {text}")
        self._report_failure(failed)
        return failed

    def _abort_pending(self, reason: CheckpointFailureReason, why: str) -> list[FailedCheckpoint]:
        return [
            self._fail(self._pending[cid], reason, f"{self._name(cid)} {why}")
            for cid in sorted(self._pending)
        ]

    def _report_failure(self, failed: FailedCheckpoint) -> None:
        if self.failure_manager.handle_failure(failed):
            self._must_fail_cause = self.failure_manager.exceeded_cause(self.job_id, failed)

    def _restart(
        self, cause: str, restore_from: CompletedCheckpoint | None, *, requested: bool = False
    ) -> FailoverDecision:
        """Abort what is pending and start the next attempt from ``restore_from``.

        A failover aborts with ``JOB_FAILOVER_REGION``; a restore a user ``requested`` is no
        failure of the job: its checkpoints in flight are aborted as Flink aborts them when it
        suspends the coordinator to restart the job (``CHECKPOINT_COORDINATOR_SUSPEND``), and
        the message says which restore.
        """
        if requested:
            reason = Reason.CHECKPOINT_COORDINATOR_SUSPEND
            why = f"aborted: attempt {self._attempt} ends, {cause}"
        else:
            reason = Reason.JOB_FAILOVER_REGION
            why = f"aborted by the failover of attempt {self._attempt}: {cause}"
        aborted = self._abort_pending(reason, why)
        self._attempt += 1
        self._must_fail_cause = None
        self._timing.restart()
        return FailoverDecision(self._attempt, restore_from, cause, aborted)
