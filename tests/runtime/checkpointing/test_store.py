"""Tests of the CompletedCheckpointStore: retention, savepoints, pins."""

from __future__ import annotations

import pytest

from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.store import CompletedCheckpointStore
from sparkpoint.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError
from sparkpoint.protocol import CheckpointKind


def cp(cid: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=cid,
        kind=kind,
        attempt=1,
        trigger_timestamp=cid * 1000,
        completion_timestamp=cid * 1000 + 10,
        end_to_end_duration_ms=10.0,
        is_final=False,
        acks={},
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
