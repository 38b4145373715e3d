"""A ``hashmap`` checkpoint in its own format (the tables' columns, ``hashmap-columns-v1``):
what it holds, and that every backend restores it at any parallelism or refuses it by name."""

from __future__ import annotations

import pytest

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state import canonical, changelog_delta
from sparkpoint.state.backend import DELETED
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import KeyGroupRange, key_group_for, key_group_range
from sparkpoint.testing import MemorySnapshotTarget, snapshot_blob

from .conftest import COUNT, EVENTS, FULL, KEYS, contents, contents_of_subtasks, fill
from .contract import Backends, table_of


def _hashmap(kg_range: KeyGroupRange = FULL) -> HashMapKeyedStateBackend:
    return HashMapKeyedStateBackend(128, kg_range)


def test_a_checkpoint_writes_the_columns_format_and_a_savepoint_stays_canonical() -> None:
    backend = _hashmap()
    fill(backend, KEYS)
    for native, fmt in ((True, changelog_delta.FORMAT_ID), (False, canonical.FORMAT_ID)):
        capture = backend.snapshot(1, native=native)
        target = MemorySnapshotTarget(1, FULL)
        try:
            (handle,) = capture.materialize(target)
        finally:
            capture.release()
        assert handle.format == fmt
    snap = changelog_delta.decode_delta(snapshot_blob(backend, native=True), "the checkpoint")
    assert snap.full and snap.key_group_range == FULL
    assert set(snap.states) == {"count", "events", "last-seen"}


def test_writes_after_the_synchronous_part_are_not_in_the_checkpoint(backends: Backends) -> None:
    backend = _hashmap()
    count, events = backend.get_state(COUNT), backend.get_state(EVENTS)
    backend.set_current_key("a")
    count.update(1)
    events.add(1)
    capture = backend.snapshot(1, native=True)
    events.add(2)  # in place, after the synchronous part, before the asynchronous one
    count.update(999)
    target = MemorySnapshotTarget(1, FULL)
    try:
        capture.materialize(target)
    finally:
        capture.release()
    restored = backends.restore(target.blobs)
    assert table_of(restored, "events") == {"a": [1]} and table_of(restored, "count") == {"a": 1}


def test_every_backend_restores_it_at_parallelism_3_then_1(backends: Backends) -> None:
    subtasks = [_hashmap(key_group_range(i, 2, 128)) for i in range(2)]
    for i, subtask in enumerate(subtasks):
        fill(subtask, [k for k in KEYS if key_group_for(k) in subtask.key_group_range])
        subtask.channel_watermarks = {0: 10 + 30 * i, 1: 50 - 30 * i}
    before = contents_of_subtasks(subtasks)
    blobs = [snapshot_blob(subtask, native=True) for subtask in subtasks]
    three = [backends.restore(blobs, key_group_range(i, 3, 128)) for i in range(3)]
    assert contents_of_subtasks(three) == before  # every key exactly once
    assert {b.channel_watermarks[0] for b in three} == {10}  # per channel the minimum
    assert {b.channel_watermarks[1] for b in three} == {20}
    (one,) = [backends.restore(blobs, FULL)]
    assert contents(one) == before
    assert one.state_infos == subtasks[0].state_infos


def test_an_epochs_changes_are_refused_as_a_checkpoint(backends: Backends) -> None:
    backend = _hashmap()
    fill(backend, ["a", "b"])
    changes = changelog_delta.encode_delta(
        backend.state_infos,
        {"count": {"a": 3, "b": DELETED}},
        max_parallelism=128,
        key_group_range=FULL,
        watermarks={},
    )
    with pytest.raises(CorruptSnapshotError, match="changes only"):
        backends.restore([changes])


def test_a_damaged_checkpoint_is_refused_and_names_the_problem(backends: Backends) -> None:
    backend = _hashmap()
    fill(backend, KEYS)
    blob = bytearray(snapshot_blob(backend, native=True))
    blob[len(blob) // 2] ^= 0xFF
    with pytest.raises(CorruptSnapshotError, match="CRC-32 does not match"):
        backends.restore([bytes(blob)])


def test_another_max_parallelism_is_refused(backends: Backends) -> None:
    other = HashMapKeyedStateBackend(256, KeyGroupRange(0, 255))
    fill(other, ["a"])
    with pytest.raises(ConfigurationError, match="max_parallelism 256"):
        backends.restore([snapshot_blob(other, native=True)])
