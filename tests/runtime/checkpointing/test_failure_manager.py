"""Tests of the CheckpointFailureManager: which failures count, thresholds, resets."""

from __future__ import annotations

import pytest

from sparkpoint.checkpointing.failure_manager import CheckpointFailureManager
from sparkpoint.checkpointing.pending import CheckpointFailureReason as Reason
from sparkpoint.checkpointing.pending import FailedCheckpoint
from sparkpoint.errors import ConfigurationError
from sparkpoint.protocol import CheckpointKind


def failed(
    cid: int,
    reason: Reason = Reason.CHECKPOINT_EXPIRED,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    declined_by: tuple[str, int] | None = None,
) -> FailedCheckpoint:
    return FailedCheckpoint(
        checkpoint_id=cid,
        kind=kind,
        attempt=1,
        trigger_timestamp=0,
        failure_timestamp=1,
        reason=reason,
        message="m",
        declined_by=declined_by,
    )


@pytest.mark.parametrize(
    "reason",
    [
        Reason.CHECKPOINT_EXPIRED,
        Reason.CHECKPOINT_DECLINED,
        Reason.IO_EXCEPTION,
        Reason.CHECKPOINT_ASYNC_EXCEPTION,
    ],
)
def test_counted_reasons_fail_the_job_past_zero_tolerance(reason: Reason) -> None:
    manager = CheckpointFailureManager(tolerable_failures=0)
    assert manager.handle_failure(failed(1, reason)) is True


@pytest.mark.parametrize(
    "reason",
    [
        Reason.CHECKPOINT_SUBSUMED,
        Reason.TOO_MANY_CHECKPOINT_REQUESTS,
        Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS,
        Reason.CHECKPOINT_COORDINATOR_SHUTDOWN,
        Reason.JOB_FAILOVER_REGION,
        Reason.TASK_FAILURE,
        Reason.FINALIZE_CHECKPOINT_FAILURE,
        Reason.CHECKPOINT_DECLINED_TASK_NOT_READY,
    ],
)
def test_other_reasons_do_not_count(reason: Reason) -> None:
    manager = CheckpointFailureManager(tolerable_failures=0)
    assert manager.handle_failure(failed(1, reason)) is False
    assert manager.continuous_failures == 0


def test_threshold_is_exceeded_by_one_more_than_tolerable_then_cleared() -> None:
    manager = CheckpointFailureManager(tolerable_failures=2)
    assert [manager.handle_failure(failed(cid)) for cid in (1, 2)] == [False, False]
    assert manager.continuous_failures == 2
    assert manager.handle_failure(failed(3)) is True
    assert manager.continuous_failures == 0
    assert manager.handle_failure(failed(4)) is False


def test_a_newer_completion_resets_the_count() -> None:
    manager = CheckpointFailureManager(tolerable_failures=1)
    manager.handle_failure(failed(1))
    manager.handle_success(2)
    assert manager.continuous_failures == 0
    assert manager.handle_failure(failed(3)) is False
    manager.handle_success(2)  # not newer: nothing changes
    assert manager.continuous_failures == 1


def test_failures_of_checkpoints_older_than_the_last_completed_do_not_count() -> None:
    manager = CheckpointFailureManager(tolerable_failures=0)
    manager.handle_success(5)
    assert manager.handle_failure(failed(4)) is False
    assert manager.handle_failure(failed(5)) is False
    assert manager.last_succeeded_id == 5
    assert manager.handle_failure(failed(6)) is True


def test_one_checkpoint_counts_once() -> None:
    manager = CheckpointFailureManager(tolerable_failures=1)
    assert manager.handle_failure(failed(1, Reason.CHECKPOINT_DECLINED)) is False
    assert manager.handle_failure(failed(1, Reason.CHECKPOINT_EXPIRED)) is False
    assert manager.continuous_failures == 1


def test_savepoint_failures_count_only_when_a_task_declined() -> None:
    manager = CheckpointFailureManager(tolerable_failures=0)
    assert manager.handle_failure(failed(1, kind=CheckpointKind.SAVEPOINT)) is False
    declined = failed(2, Reason.CHECKPOINT_DECLINED, CheckpointKind.SAVEPOINT, ("pv", 0))
    assert manager.handle_failure(declined) is True


def test_set_tolerable_applies_to_the_next_failure_and_refuses_negatives() -> None:
    manager = CheckpointFailureManager(tolerable_failures=0)
    manager.set_tolerable(1)
    assert manager.handle_failure(failed(1)) is False
    assert manager.tolerable_failures == 1
    with pytest.raises(ConfigurationError, match="tolerable_failures must be an integer >= 0"):
        manager.set_tolerable(-1)
    with pytest.raises(ConfigurationError):
        CheckpointFailureManager(tolerable_failures=-2)
