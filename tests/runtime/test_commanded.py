"""The connected driver's bookkeeping of commanded checkpoints (pure, no Spark, no Redis)."""

from __future__ import annotations

from sparkpoint import protocol as p
from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.runtime.commanded import (
    MAX_UNCOMMITTED_CHECKPOINTS,
    CommandedCheckpoints,
    QueuedBarrier,
)

from ..support.acks import bare_ack


def _queued(cid: int, *, final: bool = False, stop: bool = False) -> QueuedBarrier:
    kind = p.CheckpointKind.SAVEPOINT if stop else p.CheckpointKind.CHECKPOINT
    return QueuedBarrier(CheckpointBarrier(cid, 1000 + cid, kind, final), stops_job=stop)


def _ack(cid: int, subtask: int = 0) -> p.SnapshotCompleted:
    return bare_ack(cid, "pv", subtask, epoch=cid)


def _take(state: CommandedCheckpoints) -> QueuedBarrier:
    queued = state.next_barrier(exhausts_input=False)
    assert queued is not None
    return queued


def _carry(state: CommandedCheckpoints, cid: int, **kind: bool) -> QueuedBarrier:
    """Trigger, carry in an epoch and acknowledge checkpoint ``cid`` (two subtasks)."""
    assert state.queue(_queued(cid, **kind))
    queued = state.next_barrier(exhausts_input=bool(kind.get("final")))
    assert queued is not None and queued.checkpoint_id == cid
    state.hold(queued, _ack(cid, 0))
    state.hold(queued, _ack(cid, 1))
    state.carried(queued)
    return queued


def test_barriers_go_out_in_id_order_once_and_never_older_than_a_carried_one() -> None:
    state = CommandedCheckpoints()
    assert state.queue(_queued(3)) and state.queue(_queued(2))
    assert not state.queue(_queued(3))  # a redelivered trigger
    assert [_take(state).checkpoint_id for _ in range(2)] == [2, 3]
    assert state.next_barrier(False) is None
    assert not state.queue(_queued(1))  # older than one already carried


def test_a_final_barrier_waits_for_the_epoch_that_ends_the_input_and_goes_at_its_end() -> None:
    state = CommandedCheckpoints()
    state.queue(_queued(5, final=True))
    assert state.next_barrier(exhausts_input=False) is None
    final = state.next_barrier(exhausts_input=True)
    assert final is not None and final.at_end and final.barrier.is_final
    assert _queued(6, stop=True).at_end and not _queued(7).at_end


def test_complete_hands_out_exactly_the_held_acks_once() -> None:
    state = CommandedCheckpoints()
    _carry(state, 1)
    completion = state.complete(1)
    assert completion is not None and not completion.ends_job
    assert [(a.checkpoint_id, a.subtask) for a in completion.acks] == [(1, 0), (1, 1)]
    assert state.complete(1) is None  # a duplicate
    assert state.complete(9) is None  # never carried here
    assert state.uncommitted == 0


def test_a_completion_subsumes_older_regular_checkpoints_but_not_savepoints() -> None:
    state = CommandedCheckpoints()
    _carry(state, 1)
    savepoint = QueuedBarrier(CheckpointBarrier(2, 0, p.CheckpointKind.SAVEPOINT))
    state.queue(savepoint)
    state.hold(_take(state), _ack(2))
    _carry(state, 3)
    assert state.complete(3) is not None
    assert state.complete(1) is None
    assert state.complete(2) is not None


def test_the_final_checkpoint_ends_the_job_and_an_aborted_one_is_asked_for_again() -> None:
    state = CommandedCheckpoints()
    assert state.ask_end_of_input() and not state.ask_end_of_input()
    _carry(state, 4, final=True)
    assert not state.may_run_epoch  # nothing runs after the final barrier
    state.abort(4)
    assert state.may_run_epoch and state.uncommitted == 0
    assert state.ask_end_of_input()  # ask again
    _carry(state, 5, final=True)
    completion = state.complete(5)
    assert completion is not None and completion.ends_job


def test_an_aborted_stop_with_savepoint_lets_the_job_run_on() -> None:
    state = CommandedCheckpoints()
    _carry(state, 2, stop=True)
    assert not state.may_run_epoch
    state.abort(2)
    assert state.may_run_epoch
    _carry(state, 3, stop=True)
    completion = state.complete(3)
    assert completion is not None and completion.ends_job


def test_an_aborted_queued_final_barrier_is_dropped_and_asked_for_again() -> None:
    state = CommandedCheckpoints()
    assert state.ask_end_of_input()
    state.queue(_queued(7, final=True))
    state.abort(7)
    assert state.next_barrier(exhausts_input=True) is None
    assert state.ask_end_of_input()


def test_back_pressure_past_eight_uncommitted_checkpoints() -> None:
    state = CommandedCheckpoints()
    for cid in range(1, MAX_UNCOMMITTED_CHECKPOINTS + 1):
        state.queue(QueuedBarrier(CheckpointBarrier(cid, 0, p.CheckpointKind.SAVEPOINT)))
        state.hold(_take(state), _ack(cid))
    assert state.uncommitted == 8 and state.may_run_epoch
    _carry(state, 9)
    assert state.uncommitted == 9 and not state.may_run_epoch
    state.abort(9)
    assert state.may_run_epoch


def test_reset_forgets_queued_barriers_held_acks_and_the_end() -> None:
    state = CommandedCheckpoints()
    _carry(state, 1, final=True)
    state.queue(_queued(2))
    state.reset()
    assert state.may_run_epoch and state.uncommitted == 0
    assert state.next_barrier(False) is None and state.complete(1) is None
    assert not state.queue(_queued(1))  # ids keep increasing across restores
