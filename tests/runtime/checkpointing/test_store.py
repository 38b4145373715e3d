"""Tests of the CompletedCheckpointStore (retention, savepoints, pins) and its records."""

from __future__ import annotations

import pytest

from sparkpoint.checkpointing.pending import (
    CompletedCheckpoint,
    PendingCheckpoint,
    format_subtasks,
)
from sparkpoint.checkpointing.store import CompletedCheckpointStore
from sparkpoint.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError
from sparkpoint.protocol import CheckpointKind, SinkTransactionModel, SnapshotCompleted


def cp(
    cid: int,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    acks: dict[tuple[str, int], SnapshotCompleted] | None = None,
) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=cid,
        kind=kind,
        attempt=1,
        trigger_timestamp=cid * 1000,
        completion_timestamp=cid * 1000 + 10,
        end_to_end_duration_ms=10.0,
        is_final=False,
        acks=acks or {},
    )


def ack(op: str, subtask: int, **extra: object) -> SnapshotCompleted:
    return SnapshotCompleted.model_validate(
        {
            "checkpoint_id": 1,
            "operator_id": op,
            "subtask": subtask,
            "epoch": 1,
            "ack_timestamp": 0,
            "start_delay_ms": 0,
            "alignment_duration_ms": 0,
            "alignment_buffered_bytes": 0,
            "sync_duration_ms": 0,
            "async_duration_ms": 0,
            "state_size": 8,
            "checkpointed_size": 4,
            **extra,
        }
    )


def sp(cid: int) -> CompletedCheckpoint:
    return cp(cid, CheckpointKind.SAVEPOINT)


def ids(checkpoints: list[CompletedCheckpoint]) -> list[int]:
    return [c.checkpoint_id for c in checkpoints]


def test_keeps_the_newest_retained_and_returns_the_subsumed() -> None:
    store = CompletedCheckpointStore(retained=2)
    assert store.add(cp(1)) == []
    assert store.add(cp(2)) == []
    assert ids(store.add(cp(3))) == [1]
    assert ids(store.add(cp(4))) == [2]
    assert ids(store.all()) == [3, 4]
    assert store.get(1) is None and len(store) == 2 and 4 in store


def test_savepoints_are_never_subsumed_and_do_not_count() -> None:
    store = CompletedCheckpointStore(retained=1)
    store.add(sp(1))
    store.add(cp(2))
    store.add(sp(3))
    assert ids(store.add(cp(4))) == [2]
    assert ids(store.add(cp(5))) == [4]
    assert ids(store.all()) == [1, 3, 5]
    assert ids(store.set_retained(1)) == []


def test_latest_with_and_without_savepoints() -> None:
    store = CompletedCheckpointStore(retained=3)
    assert store.latest() is None
    store.add(cp(1))
    store.add(sp(2))
    assert store.latest() is store.get(2)
    assert store.latest(include_savepoints=False) is store.get(1)


def test_a_pinned_checkpoint_is_kept_until_its_last_pin_is_released() -> None:
    store = CompletedCheckpointStore(retained=1)
    store.add(cp(1))
    store.pin(1, "restore attempt 2")
    store.pin(1, "sink transactions")
    assert store.add(cp(2)) == []
    assert ids(store.all()) == [2]
    assert ids(store.subsumed_pinned()) == [1]
    assert store.get(1) is not None  # its state is still held
    assert store.pins(1) == frozenset({"restore attempt 2", "sink transactions"})
    assert store.unpin(1, "restore attempt 2") == []
    assert store.unpin(1, "not a pin") == []
    assert ids(store.unpin(1, "sink transactions")) == [1]
    assert store.get(1) is None and not store.is_pinned(1)
    assert store.unpin(1, "sink transactions") == []


def test_a_checkpoint_unpinned_before_it_is_subsumed_is_returned_by_a_later_add() -> None:
    store = CompletedCheckpointStore(retained=1)
    store.add(cp(1))
    store.pin(1, "sink transactions")
    assert store.unpin(1, "sink transactions") == []
    assert ids(store.add(cp(2))) == [1]


def test_set_retained_lower_subsumes_but_keeps_pinned() -> None:
    store = CompletedCheckpointStore(retained=3)
    for cid in (1, 2, 3):
        store.add(cp(cid))
    store.pin(2, "restore attempt 5")
    assert ids(store.set_retained(1)) == [1]
    assert ids(store.all()) == [3] and ids(store.subsumed_pinned()) == [2]
    assert store.retained == 1
    with pytest.raises(ConfigurationError, match="retained must be an integer >= 1, got 0"):
        store.set_retained(0)


def test_adding_an_id_twice_is_refused() -> None:
    store = CompletedCheckpointStore(retained=1)
    store.add(cp(1))
    with pytest.raises(CheckpointError, match="checkpoint 1 is already in the completed"):
        store.add(cp(1))


def test_pin_of_an_unknown_checkpoint_raises() -> None:
    store = CompletedCheckpointStore(retained=1)
    with pytest.raises(CheckpointNotFoundError, match=r"cannot pin checkpoint 9 \(restore\)"):
        store.pin(9, "restore")


def test_remove_refuses_a_pinned_checkpoint_and_an_unknown_one() -> None:
    store = CompletedCheckpointStore(retained=2)
    store.add(sp(1))
    store.pin(1, "restore")
    with pytest.raises(CheckpointError, match=r"checkpoint 1 is pinned \(restore\)"):
        store.remove(1)
    store.unpin(1, "restore")
    assert store.remove(1).checkpoint_id == 1
    with pytest.raises(CheckpointNotFoundError):
        store.remove(1)


def test_retained_below_one_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        CompletedCheckpointStore(retained=0)


def test_completed_checkpoint_merges_positions_and_lists_sink_transactions() -> None:
    txn = SinkTransactionModel(transaction_id="t-1", parts=["p0"], records=3)
    acks = {
        ("src", 1): ack("src", 1, source_positions={"split-1": 7}),
        ("src", 0): ack("src", 0, source_positions={"split-0": 10}),
        ("sink", 0): ack("sink", 0, sink_transactions=[txn.model_dump()]),
    }
    done = cp(1, acks=acks)
    assert done.source_positions() == {"split-0": 10, "split-1": 7}
    assert done.sink_transactions() == {("sink", 0): [txn]}
    assert (done.state_size, done.checkpointed_size) == (24, 12)
    done.external_path = "file:///chk/job-1/chk-1"
    store = CompletedCheckpointStore(retained=1)
    store.add(done)
    assert store.get(1) is done and done.external_path == "file:///chk/job-1/chk-1"


def test_conflicting_source_positions_name_both_subtasks() -> None:
    acks = {
        ("src", 0): ack("src", 0, source_positions={"split-0": 10}),
        ("src", 1): ack("src", 1, source_positions={"split-0": 12}),
    }
    with pytest.raises(CheckpointError) as err:
        cp(3, acks=acks).source_positions()
    assert str(err.value) == "checkpoint 3: split 'split-0' is at 10 in src[0] but at 12 in src[1]"


def test_pending_checkpoint_finalizes_only_when_complete_and_clamps_its_duration() -> None:
    pending = PendingCheckpoint(
        checkpoint_id=1,
        kind=CheckpointKind.CHECKPOINT,
        attempt=1,
        trigger_timestamp=0,
        trigger_monotonic_ms=50.0,
        timeout_ms=1_000,
        expected=frozenset({("src", 0), ("pv", 0)}),
    )
    pending.acknowledge_task(ack("src", 0))
    with pytest.raises(CheckpointError, match="checkpoint 1 cannot complete: missing pv\\[0\\]"):
        pending.finalize(completion_timestamp=10, now_monotonic_ms=60.0)
    pending.acknowledge_task(ack("pv", 0))
    assert (
        pending.finalize(completion_timestamp=10, now_monotonic_ms=40.0).end_to_end_duration_ms == 0
    )


def test_format_subtasks_names_ten_then_counts_the_rest() -> None:
    keys = [("pv", i) for i in range(12)]
    assert format_subtasks(keys[:2]) == "pv[0], pv[1]"
    assert format_subtasks(keys).endswith("pv[8], pv[9] and 2 more")


def test_keep_holds_a_checkpoint_retention_handed_out_until_its_pin_is_released() -> None:
    store = CompletedCheckpointStore(retained=1)
    store.add(cp(1))
    [dropped] = store.add(cp(2))
    store.keep(dropped, "another job's origin")
    assert ids(store.all()) == [2] and ids(store.subsumed_pinned()) == [1]
    assert store.get(1) is dropped
    with pytest.raises(CheckpointError, match="already in the completed-checkpoint store"):
        store.keep(dropped, "again")
    assert ids(store.unpin(1, "another job's origin")) == [1]
    assert store.get(1) is None
