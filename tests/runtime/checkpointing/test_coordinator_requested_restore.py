"""A restore a user requested aborts the checkpoints in flight as a suspension, not a failover:
the dashboard and the API then show it as the restore it is."""

from __future__ import annotations

from sparkpoint.checkpointing.failure_manager import counts_against_tolerance
from sparkpoint.checkpointing.pending import CheckpointFailureReason as Reason

from .test_coordinator import complete, make


def test_a_requested_restore_aborts_pending_checkpoints_naming_the_restore() -> None:
    coord, _ = make(retained=3, max_concurrent=2)
    complete(coord, 1)
    coord.trigger()

    decision = coord.restore_to(1)

    assert [(f.checkpoint_id, f.reason) for f in decision.aborted] == [
        (2, Reason.CHECKPOINT_COORDINATOR_SUSPEND)
    ]
    assert decision.aborted[0].message == (
        "checkpoint 2 of job job-1 aborted: attempt 1 ends, restore of checkpoint 1 requested"
    )
    assert not counts_against_tolerance(decision.aborted[0])  # never counts against the job


def test_a_savepoint_restore_aborts_the_same_way_and_a_failover_stays_a_failover() -> None:
    coord, _ = make(retained=3)
    complete(coord, 1)
    coord.trigger()
    savepoint = coord.store.get(1)
    assert savepoint is not None

    restored = coord.restore_from(savepoint, "restore of savepoint 1 requested")
    coord.trigger()
    failed_over = coord.failover("epoch 9 failed")

    assert [f.reason for f in restored.aborted] == [Reason.CHECKPOINT_COORDINATOR_SUSPEND]
    assert [f.reason for f in failed_over.aborted] == [Reason.JOB_FAILOVER_REGION]
    assert "aborted by the failover of attempt 2: epoch 9 failed" in failed_over.aborted[0].message
