"""Tests of the CheckpointCoordinator: completion, acks, expiry, declines, limits, failover."""

from __future__ import annotations

from typing import Any

import pytest

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.coordinator import AckResult, CheckpointCoordinator
from sparkpoint.checkpointing.failure_manager import counts_against_tolerance
from sparkpoint.checkpointing.pending import CheckpointFailureReason as Reason
from sparkpoint.checkpointing.pending import CheckpointTriggerError, FailedCheckpoint
from sparkpoint.clock import ManualClock
from sparkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    StaleAttemptError,
)
from sparkpoint.protocol import CheckpointKind, SnapshotCompleted

JOB = "job-1"
TASKS = {"src": 1, "pv": 2}  # three subtasks: src[0], pv[0], pv[1]
START_WALL = 1_700_000_000_000


def make(**config: Any) -> tuple[CheckpointCoordinator, ManualClock]:
    clock = ManualClock(START_WALL)
    return CheckpointCoordinator(JOB, TASKS, CheckpointConfig(**config), clock), clock


ZERO_TIMINGS = ("start_delay_ms", "alignment_duration_ms", "alignment_buffered_bytes")
TIMINGS = {**dict.fromkeys(ZERO_TIMINGS, 0), "sync_duration_ms": 1, "async_duration_ms": 2}


def ack(cid: int, op: str, subtask: int, *, size: int = 10) -> SnapshotCompleted:
    ids = {"checkpoint_id": cid, "operator_id": op, "subtask": subtask, "epoch": 1}
    sizes = {"state_size": size, "checkpointed_size": size // 2, "ack_timestamp": START_WALL}
    return SnapshotCompleted.model_validate({**ids, **sizes, **TIMINGS})


def ack_all(coord: CheckpointCoordinator, cid: int, attempt: int = 1) -> AckResult:
    result = AckResult()
    for op, i in (("src", 0), ("pv", 0), ("pv", 1)):
        result = coord.acknowledge(attempt, ack(cid, op, i))
    return result


def complete(coord: CheckpointCoordinator, *cids: int) -> None:
    """Trigger and fully acknowledge one regular checkpoint per id."""
    for cid in cids:
        assert coord.trigger().checkpoint_id == cid
        assert ack_all(coord, cid, coord.attempt).completed is not None


def test_completes_only_when_the_last_subtask_acknowledges() -> None:
    coord, clock = make()
    pending = coord.trigger()
    clock.advance(250)
    assert coord.acknowledge(1, ack(1, "src", 0, size=100)) == AckResult()
    assert coord.acknowledge(1, ack(1, "pv", 0, size=20)) == AckResult()
    assert pending.num_acknowledged == 2 and not pending.is_fully_acknowledged
    assert list(coord.pending) == [1] and coord.store.latest() is None
    clock.advance(50)
    result = coord.acknowledge(1, ack(1, "pv", 1, size=30))
    done = result.completed
    assert done is not None and not result.discarded
    assert (done.checkpoint_id, done.attempt, done.kind) == (1, 1, CheckpointKind.CHECKPOINT)
    assert (done.trigger_timestamp, done.completion_timestamp) == (START_WALL, START_WALL + 300)
    assert done.end_to_end_duration_ms == 300.0
    assert (done.state_size, done.checkpointed_size) == (150, 75)
    assert coord.pending == {} and coord.store.latest() is done
    assert coord.drain_failed() == [] and coord.drain_subsumed() == []


def test_duplicate_ack_is_idempotent_and_keeps_the_first() -> None:
    coord, _ = make()
    pending = coord.trigger()
    assert coord.acknowledge(1, ack(1, "pv", 0, size=10)) == AckResult()
    assert coord.acknowledge(1, ack(1, "pv", 0, size=99)) == AckResult(duplicate=True)
    assert pending.num_acknowledged == 1
    assert pending.acks[("pv", 0)].state_size == 10


def test_duplicate_ack_of_a_completed_checkpoint_is_not_discarded() -> None:
    coord, _ = make()
    coord.trigger()
    assert ack_all(coord, 1).completed is not None
    assert coord.acknowledge(1, ack(1, "pv", 1)) == AckResult(duplicate=True)
    assert coord.store.get(1) is not None


def test_ack_and_decline_of_an_older_attempt_are_refused() -> None:
    coord, _ = make()
    coord.trigger()
    coord.failover("epoch 4 failed")
    coord.trigger()
    with pytest.raises(StaleAttemptError) as err:
        coord.acknowledge(1, ack(2, "pv", 1))
    assert str(err.value) == (
        "job job-1: acknowledgement of checkpoint 2 by pv[1] carries attempt 1, "
        "older than the current attempt 2; refused"
    )
    with pytest.raises(StaleAttemptError, match="decline of checkpoint 2 by pv"):
        coord.decline(1, 2, "pv", 0, "late")
    assert coord.pending[2].num_acknowledged == 0


@pytest.mark.parametrize(
    ("attempt", "cid", "op", "subtask", "message"),
    [
        (3, 1, "pv", 1, "by pv[1] carries attempt 3, newer than the current attempt 1"),
        (1, 1, "pv", 2, "by pv[2]: unknown subtask pv[2] (operators: pv x2, src x1)"),
        (1, 5, "src", 0, "by src[0]: checkpoint 5 was never triggered"),
    ],
)
def test_acks_that_cannot_belong_to_the_job_are_refused(
    attempt: int, cid: int, op: str, subtask: int, message: str
) -> None:
    coord, _ = make()
    coord.trigger()
    with pytest.raises(CheckpointError) as err:
        coord.acknowledge(attempt, ack(cid, op, subtask))
    assert str(err.value) == f"job job-1: acknowledgement of checkpoint {cid} {message}"
    assert coord.pending[1].num_acknowledged == 0


def test_expires_exactly_at_the_timeout_with_a_message_naming_the_missing() -> None:
    coord, clock = make(timeout_ms=1000)
    coord.trigger()
    coord.acknowledge(1, ack(1, "src", 0))
    clock.advance(999)
    assert coord.expire_overdue() == []
    clock.advance(1)
    [failed] = coord.expire_overdue()
    assert failed.reason is Reason.CHECKPOINT_EXPIRED
    assert failed.message == (
        "checkpoint 1 of job job-1 expired before completing after 1000 ms: "
        "1/3 subtasks acknowledged; missing: pv[0], pv[1]"
    )
    assert failed.failure_timestamp == START_WALL + 1000
    assert list(failed.acks) == [("src", 0)]
    assert coord.pending == {} and coord.expire_overdue() == []
    assert coord.drain_failed() == []  # returned once, not repeated


def test_late_ack_after_expiry_is_discarded() -> None:
    coord, clock = make(timeout_ms=1000)
    coord.trigger()
    clock.advance(1000)
    coord.expire_overdue()
    assert coord.acknowledge(1, ack(1, "pv", 0)) == AckResult(discarded=True)


def test_timeout_is_fixed_when_the_checkpoint_is_triggered() -> None:
    coord, clock = make(timeout_ms=1000, max_concurrent=2)
    coord.trigger()
    coord.update_config({"timeout_ms": 5000})
    coord.trigger()
    clock.advance(1000)
    assert [f.checkpoint_id for f in coord.expire_overdue()] == [1]
    clock.advance(4000)
    assert [f.checkpoint_id for f in coord.expire_overdue()] == [2]


def test_decline_fails_the_checkpoint_and_keeps_the_acks() -> None:
    coord, _ = make()
    coord.trigger()
    coord.acknowledge(1, ack(1, "src", 0))
    failed = coord.decline(1, 1, "pv", 1, "snapshot above the inline limit")
    assert failed is not None and failed.declined_by == ("pv", 1)
    assert failed.reason is Reason.CHECKPOINT_DECLINED
    assert failed.message == (
        "checkpoint 1 of job job-1 declined by pv[1]: snapshot above the inline limit"
    )
    assert list(failed.acks) == [("src", 0)]
    assert coord.pending == {}
    assert coord.decline(1, 1, "pv", 0, "again") is None


def test_a_snapshot_that_could_not_be_written_fails_as_an_asynchronous_exception() -> None:
    """Flink's ``CHECKPOINT_ASYNC_EXCEPTION``: it names the subtask and counts against the
    tolerable failures as a decline does."""
    coord, _ = make()
    coord.trigger()
    failed = coord.decline(1, 1, "pv", 1, "its snapshot could not be written", asynchronous=True)
    assert failed is not None and failed.declined_by == ("pv", 1)
    assert failed.reason is Reason.CHECKPOINT_ASYNC_EXCEPTION
    assert counts_against_tolerance(failed)


def test_abort_all_returns_every_pending_oldest_first() -> None:
    coord, _ = make(max_concurrent=3)  # a pending savepoint counts too, as in Flink
    coord.trigger()
    coord.trigger(CheckpointKind.SAVEPOINT)
    coord.trigger()
    failed = coord.abort_all(Reason.CHECKPOINT_COORDINATOR_SHUTDOWN, "control plane stops")
    assert [f.checkpoint_id for f in failed] == [1, 2, 3]
    assert [f.kind.value for f in failed] == ["checkpoint", "savepoint", "checkpoint"]
    assert failed[0].message == "checkpoint 1 of job job-1 aborted: control plane stops"
    assert coord.pending == {} and coord.drain_failed() == []


def test_completion_subsumes_older_pending_checkpoints_but_not_savepoints() -> None:
    coord, _ = make(max_concurrent=4)
    coord.trigger(CheckpointKind.SAVEPOINT)  # 1
    coord.trigger()  # 2
    coord.trigger()  # 3
    coord.trigger()  # 4
    assert ack_all(coord, 3).completed is not None
    failed = coord.drain_failed()
    assert [(f.checkpoint_id, f.reason) for f in failed] == [(2, Reason.CHECKPOINT_SUBSUMED)]
    assert failed[0].message == "checkpoint 2 of job job-1 was subsumed by completed checkpoint 3"
    assert sorted(coord.pending) == [1, 4]
    assert coord.drain_failed() == []
    assert coord.failure_manager.continuous_failures == 0
    coord.trigger(CheckpointKind.SAVEPOINT, target_directory="/sp")  # 5
    done = ack_all(coord, 5).completed  # a savepoint subsumes nothing (Flink)
    assert done is not None and done.is_savepoint
    assert sorted(coord.pending) == [1, 4] and coord.drain_failed() == []


def test_retention_hands_out_subsumed_completed_checkpoints() -> None:
    coord, _ = make(retained=1)
    complete(coord, 1)
    first = coord.store.get(1)
    complete(coord, 2)
    assert coord.drain_subsumed() == [first]
    assert coord.drain_subsumed() == []


def test_max_concurrent_refuses_regular_checkpoints_only() -> None:
    coord, _ = make(max_concurrent=1)
    coord.trigger()
    with pytest.raises(CheckpointTriggerError) as err:
        coord.trigger()
    assert err.value.reason is Reason.TOO_MANY_CHECKPOINT_REQUESTS
    assert str(err.value) == (
        "job job-1: 1 checkpoint(s) pending (1), max concurrent is 1 (TOO_MANY_CHECKPOINT_REQUESTS)"
    )
    assert coord.trigger(CheckpointKind.SAVEPOINT).checkpoint_id == 2
    assert coord.trigger(is_final=True).checkpoint_id == 3
    assert coord.next_checkpoint_id == 4


def test_min_pause_refuses_periodic_but_not_manual_triggers() -> None:
    coord, clock = make(min_pause_ms=500, max_concurrent=2)
    coord.trigger()
    ack_all(coord, 1)
    clock.advance(499)
    with pytest.raises(CheckpointTriggerError) as err:
        coord.trigger(periodic=True)
    assert err.value.reason is Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS
    assert "minimum pause of 500 ms between checkpoints not over (1 ms left)" in str(err.value)
    assert coord.trigger().checkpoint_id == 2  # manual: no pause
    coord.decline(1, 2, "src", 0, "nope")  # a failure restarts the pause
    clock.advance(500)
    assert coord.trigger(periodic=True).checkpoint_id == 3


def test_periodic_due_follows_interval_pending_and_min_pause() -> None:
    coord, clock = make(interval_ms=1000, min_pause_ms=800)
    assert not coord.periodic_due()
    clock.advance(999)
    assert not coord.periodic_due()
    clock.advance(1)
    assert coord.periodic_due()
    coord.trigger(periodic=True)  # at t=1000
    clock.advance(500)
    ack_all(coord, 1)  # finished at t=1500
    clock.advance(500)  # t=2000: interval passed, 300 ms of pause left
    assert not coord.periodic_due()
    clock.advance(300)
    assert coord.periodic_due()
    coord.trigger()
    clock.advance(5_000)
    assert not coord.periodic_due()  # max_concurrent (1) pending
    off, clock2 = make(interval_ms=0)
    clock2.advance(10_000)
    assert not off.periodic_due()


def test_failover_aborts_pending_and_ids_keep_increasing() -> None:
    coord, _ = make(max_concurrent=2)
    coord.trigger()
    coord.trigger()
    decision = coord.failover("epoch 7 failed: ValueError")
    assert decision.attempt == coord.attempt == 2
    assert decision.restore_from is None
    failover = Reason.JOB_FAILOVER_REGION
    aborted = [(f.checkpoint_id, f.reason, f.attempt) for f in decision.aborted]
    assert aborted == [(1, failover, 1), (2, failover, 1)]
    assert decision.aborted[0].message == (
        "checkpoint 1 of job job-1 aborted by the failover of attempt 1: epoch 7 failed: ValueError"
    )
    nxt = coord.trigger()
    assert (nxt.checkpoint_id, nxt.attempt) == (3, 2)


def test_failover_restores_the_latest_completed_savepoints_included() -> None:
    coord, _ = make(retained=2)
    complete(coord, 1)
    coord.trigger(CheckpointKind.SAVEPOINT)
    ack_all(coord, 2)
    decision = coord.failover("boom")
    assert decision.restore_from is not None
    assert decision.restore_from.checkpoint_id == 2
    complete(coord, 3)
    assert coord.failover("again").restore_from == coord.store.get(3)


def test_coordinator_can_start_at_a_later_id_and_attempt() -> None:
    clock = ManualClock()
    coord = CheckpointCoordinator(
        JOB, TASKS, CheckpointConfig(), clock, attempt=4, next_checkpoint_id=42
    )
    pending = coord.trigger()
    assert (pending.checkpoint_id, pending.attempt) == (42, 4)
    assert coord.acknowledge(4, ack(41, "src", 0)) == AckResult(discarded=True)


def test_restore_to_a_checkpoint_not_retained_raises_and_changes_nothing() -> None:
    coord, _ = make()
    complete(coord, 1)
    coord.trigger()
    with pytest.raises(CheckpointNotFoundError) as err:
        coord.restore_to(7)
    assert str(err.value) == "job job-1: checkpoint 7 is not retained (retained: 1)"
    assert coord.attempt == 1 and list(coord.pending) == [2]


def test_restore_to_a_retained_checkpoint() -> None:
    coord, _ = make(retained=3)
    complete(coord, 1, 2)
    decision = coord.restore_to(1)
    assert decision.restore_from is coord.store.get(1)
    assert decision.cause == "restore of checkpoint 1 requested"
    assert (decision.attempt, coord.trigger().checkpoint_id) == (2, 3)


def test_exceeding_tolerable_failures_requires_failover_until_it_happens() -> None:
    coord, clock = make(timeout_ms=100, tolerable_failures=1)
    coord.trigger()
    clock.advance(100)
    coord.expire_overdue()
    assert not coord.must_fail_job
    coord.trigger()
    coord.decline(1, 2, "pv", 0, "disk full")
    assert coord.must_fail_job
    assert coord.must_fail_cause == (
        "Exceeded checkpoint tolerable failure threshold. Job job-1, tolerable failures 1; last: "
        "checkpoint 2 of job job-1 declined by pv[0]: disk full (CHECKPOINT_DECLINED)"
    )
    clock.advance(10_000)
    assert not coord.periodic_due()
    coord.failover(coord.must_fail_cause or "")
    assert not coord.must_fail_job


def test_an_expiry_is_explained_before_it_counts_so_the_failover_cause_quotes_why() -> None:
    coord, clock = make(timeout_ms=100, tolerable_failures=0)
    seen: list[tuple[int, int, int]] = []

    def why(f: FailedCheckpoint) -> str:
        seen.append((f.checkpoint_id, f.trigger_timestamp, f.failure_timestamp))
        return "no epoch ended"

    coord.trigger()
    clock.advance(100)
    [failed] = coord.expire_overdue(why=why)
    assert seen == [(1, START_WALL, START_WALL + 100)]
    assert failed.message == (
        "checkpoint 1 of job job-1 expired before completing after 100 ms: 0/3 subtasks "
        "acknowledged; missing: pv[0], pv[1], src[0]. no epoch ended"
    )
    assert coord.must_fail_cause == (
        "Exceeded checkpoint tolerable failure threshold. Job job-1, tolerable failures 0; last: "
        f"{failed.message} (CHECKPOINT_EXPIRED)"
    )
    coord.failover(coord.must_fail_cause or "")
    coord.trigger()
    coord.decline(2, 2, "pv", 0, "disk full")  # a decline is not an expiry: nothing added
    assert coord.must_fail_cause is not None and coord.must_fail_cause.endswith(
        "declined by pv[0]: disk full (CHECKPOINT_DECLINED)"
    )
    assert len(seen) == 1


def test_a_completion_resets_the_failure_count() -> None:
    coord, _ = make(tolerable_failures=1)
    coord.trigger()
    coord.decline(1, 1, "pv", 0, "x")
    complete(coord, 2)
    coord.trigger()
    coord.decline(1, 3, "pv", 0, "y")
    assert not coord.must_fail_job
    assert coord.failure_manager.continuous_failures == 1


def test_update_config_applies_retained_and_tolerable_and_refuses_fixed_fields() -> None:
    coord, _ = make(retained=3)
    complete(coord, 1, 2, 3)
    new = coord.update_config({"retained": 1, "tolerable_failures": 4})
    assert new == coord.config and coord.config.retained == 1
    assert [cp.checkpoint_id for cp in coord.drain_subsumed()] == [1, 2]
    assert coord.store.retained == 1
    assert coord.failure_manager.tolerable_failures == 4
    with pytest.raises(ConfigurationError, match="max_concurrent cannot change"):
        coord.update_config({"max_concurrent": 2})


def test_constructor_refuses_an_empty_graph_and_bad_parallelism() -> None:
    with pytest.raises(ConfigurationError, match="job job-1: no tasks"):
        CheckpointCoordinator(JOB, {}, CheckpointConfig(), ManualClock())
    with pytest.raises(ConfigurationError, match="operator 'pv' has parallelism 0"):
        CheckpointCoordinator(JOB, {"pv": 0}, CheckpointConfig(), ManualClock())


def test_finalize_failure_takes_back_the_completion_and_what_it_subsumed() -> None:
    coord, _ = make(retained=1)
    complete(coord, 1, 2)
    failed = coord.finalize_failed(2, "cannot write _metadata: disk full")
    assert failed.reason is Reason.FINALIZE_CHECKPOINT_FAILURE
    assert failed.message == (
        "checkpoint 2 of job job-1 failed to finalize: cannot write _metadata: disk full"
    )
    assert len(failed.acks) == 3
    assert [cp.checkpoint_id for cp in coord.store.all()] == [1]
    assert coord.drain_subsumed() == []
    assert coord.acknowledge(1, ack(2, "pv", 0)) == AckResult(discarded=True)


def test_recover_pins_each_checkpoint_as_it_enters_and_hands_out_the_rest() -> None:
    """Retention replays on recovery: a pinned checkpoint older than the retained ones stays
    held (its sinks have not committed); one that nothing pins any more (kept past retention
    for a reason that ended with the host) goes to the next drain."""
    done, _ = make(retained=1)
    complete(done, 1, 2, 3)
    completed = [*done.store.all(), *done.drain_subsumed()]
    coord, _ = make(retained=1)
    coord.recover(
        completed=sorted(completed, key=lambda c: c.checkpoint_id),
        failed=[],
        pending=[],
        pins=[(1, "uncommitted sink transactions")],
    )
    assert [c.checkpoint_id for c in coord.store.all()] == [3]
    assert [c.checkpoint_id for c in coord.store.subsumed_pinned()] == [1]
    assert [c.checkpoint_id for c in coord.drain_subsumed()] == [2]


def test_a_final_checkpoint_goes_at_once_and_after_a_failure_waits_as_a_periodic_one() -> None:
    coord, clock = make(interval_ms=1000, min_pause_ms=300, tolerable_failures=9)
    assert coord.final_wait_ms() == 0  # the first: at once
    final = coord.trigger(is_final=True).checkpoint_id
    clock.advance(200)
    assert coord.decline(1, final, "pv", 0, "full") is not None
    assert coord.final_wait_ms() == 800  # the rest of the interval since its trigger
    clock.advance(800)
    assert coord.final_wait_ms() == 0
    final = coord.trigger(is_final=True).checkpoint_id
    clock.advance(900)
    assert coord.decline(1, final, "pv", 0, "full") is not None
    assert coord.final_wait_ms() == 300  # the minimum pause since it failed is longer
    clock.advance(300)
    assert coord.final_wait_ms() <= 0
    # A regular checkpoint's failure does not delay a final one.
    coord.failover("test")
    regular = coord.trigger().checkpoint_id
    assert coord.decline(2, regular, "pv", 0, "full") is not None
    assert coord.final_wait_ms() == 0


def test_a_failed_final_checkpoint_waits_a_second_with_periodic_checkpoints_off() -> None:
    coord, _ = make(interval_ms=0, tolerable_failures=1)
    final = coord.trigger(is_final=True).checkpoint_id
    coord.decline(1, final, "pv", 1, "full")
    assert coord.final_wait_ms() == 1000


def test_a_new_attempt_triggers_its_final_checkpoint_at_once() -> None:
    coord, _ = make(interval_ms=1000, tolerable_failures=1)
    final = coord.trigger(is_final=True).checkpoint_id
    coord.decline(1, final, "pv", 0, "full")
    assert coord.final_wait_ms() > 0
    coord.failover("the storage is back")
    assert coord.final_wait_ms() == 0


def test_a_final_checkpoint_whose_metadata_failed_waits_too() -> None:
    coord, clock = make(interval_ms=1000, tolerable_failures=1)
    final = coord.trigger(is_final=True).checkpoint_id
    clock.advance(300)
    assert ack_all(coord, final).completed is not None
    coord.finalize_failed(final, "OSError: [Errno 28] No space left on device")
    assert coord.final_wait_ms() == 700
