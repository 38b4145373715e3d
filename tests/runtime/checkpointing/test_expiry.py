"""Why a checkpoint expired (:mod:`sparkpoint.checkpointing.expiry`), from its epochs' ends."""

from __future__ import annotations

from sparkpoint.checkpointing.expiry import KEPT, EpochEnds
from sparkpoint.checkpointing.pending import (
    CheckpointFailureReason,
    CheckpointKind,
    FailedCheckpoint,
)


def _failed(
    reason: CheckpointFailureReason = CheckpointFailureReason.CHECKPOINT_EXPIRED,
    attempt: int = 2,
) -> FailedCheckpoint:
    return FailedCheckpoint(
        checkpoint_id=9,
        kind=CheckpointKind.CHECKPOINT,
        attempt=attempt,
        trigger_timestamp=10_000,
        failure_timestamp=12_000,
        reason=reason,
        message="checkpoint 9 of job j expired before completing after 2000 ms",
    )


def test_the_epoch_running_at_the_trigger_ended_but_not_the_barriers() -> None:
    ends = EpochEnds()
    ends.ended(2, 4, 9_900)
    ends.ended(2, 5, 10_400)
    assert (ends.why_expired(_failed()) or "").startswith(
        "Epoch 5 ended 400 ms after the trigger, and no epoch ended in the 1600 ms from then to "
        "the expiry; a barrier travels with an epoch"
    )


def test_no_epoch_ended_since_the_trigger() -> None:
    ends = EpochEnds()
    ends.ended(2, 4, 9_900)
    assert (ends.why_expired(_failed()) or "").startswith(
        "No epoch ended between the trigger and the expiry: the last to end, epoch 4, ended "
        "100 ms before the trigger and 2100 ms before the expiry;"
    )


def test_nothing_is_told_without_evidence_or_when_the_barriers_epoch_ended() -> None:
    ends = EpochEnds()
    assert ends.why_expired(_failed()) is None  # no epoch end known
    ends.ended(1, 30, 9_000)  # another attempt's epochs say nothing of this one
    assert ends.why_expired(_failed()) is None
    ends.ended(2, 1, 10_500)
    ends.ended(2, 2, 11_500)  # the barrier's epoch ended: epochs did not hold it up
    assert ends.why_expired(_failed()) is None
    ends.ended(2, 3, 12_500)  # after the expiry: not counted
    assert ends.why_expired(_failed()) is None


def test_only_the_latest_epoch_ends_are_kept() -> None:
    ends = EpochEnds()
    ends.ended(2, 4, 9_900)
    assert ends.why_expired(_failed()) is not None
    for epoch in range(KEPT):  # a later attempt's epochs push attempt 2's out
        ends.ended(3, epoch, 20_000 + epoch)
    assert ends.why_expired(_failed()) is None
