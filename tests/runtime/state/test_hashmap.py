"""The hashmap keyed state backend: construction, sizes, the canonical snapshot's bytes,
restore checks, and the legacy pickled (``SPKS``) snapshots that still restore.

The behaviour every backend shares (state semantics, canonical round trips, restore with
rescaling) is in test_backend_contract.py and test_backend_contract_snapshots.py."""

from __future__ import annotations

import pickle
import sys
from typing import Any

import pytest

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state import canonical, snapshot_format
from sparkpoint.state.backend import StateInfo
from sparkpoint.state.descriptors import ListStateDescriptor, ValueStateDescriptor
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import KeyGroupOutOfRangeError, KeyGroupRange, key_group_for
from sparkpoint.state.serializers import PICKLE, encode_key, encode_value
from sparkpoint.testing import MemorySnapshotTarget, snapshot_blob

from .conftest import COUNT, EVENTS, FULL, contents, fill


@pytest.fixture
def backend() -> HashMapKeyedStateBackend:
    return HashMapKeyedStateBackend(128, FULL)


# ----------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: HashMapKeyedStateBackend(0, FULL), "max_parallelism must be between 1 and 32768"),
        (
            lambda: HashMapKeyedStateBackend(64, FULL),
            "key group range [0, 127] does not fit in max_parallelism 64 (key groups 0 to 63)",
        ),
        (
            lambda: HashMapKeyedStateBackend(128, (0, 127)),  # type: ignore[arg-type]
            "must be a KeyGroupRange, got tuple",
        ),
        (lambda: ValueStateDescriptor(""), "a ValueStateDescriptor needs a non-empty str name"),
    ],
)
def test_invalid_construction(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()
    assert message in str(info.value)


# ----------------------------------------------------------------------------- raw keys


def test_snapshot_refuses_a_raw_key_outside_the_range() -> None:
    backend = HashMapKeyedStateBackend(128, KeyGroupRange(0, 42))
    backend.get_state(COUNT)
    backend.table("count")["c"] = 1
    backend.table("count")["a"] = 2  # key group 55: written around set_current_key's check
    capture = backend.snapshot(1, native=False)  # the synchronous part only copies
    target = MemorySnapshotTarget(1, backend.key_group_range)
    with pytest.raises(KeyGroupOutOfRangeError) as info:
        capture.materialize(target)
    capture.release()
    assert str(info.value) == (
        "keyed state 'count' holds key 'a' of key group 55, outside the key group range "
        "[0, 42] of the snapshot (max_parallelism 128)"
    )
    assert target.blobs == []


# ----------------------------------------------------------------------------- sizes


def test_num_keys_and_state_size(backend: HashMapKeyedStateBackend) -> None:
    assert backend.num_keys() == 0 and backend.state_size() == 0
    count, events = backend.get_state(COUNT), backend.get_state(EVENTS)
    backend.set_current_key("a")
    count.update(1000)
    assert backend.num_keys() == 1
    assert backend.state_size() == sys.getsizeof("a") + sys.getsizeof(1000)
    events.add("x")
    backend.set_current_key("b")
    events.add("y")
    assert backend.num_keys() == 2  # distinct keys over all states
    list_size = sys.getsizeof(["x"]) + sys.getsizeof("x")
    assert backend.state_size() == sys.getsizeof("a") + sys.getsizeof(1000) + 2 * (
        sys.getsizeof("a") + list_size
    )


def test_state_size_is_scaled_from_a_sample(backend: HashMapKeyedStateBackend) -> None:
    backend.get_state(COUNT)
    backend.table("count").put_many(list(range(1000)), [10**6 + i for i in range(1000)])
    per_entry = sys.getsizeof(10**6)  # small ints and large ints have different sizes
    sample = sum(sys.getsizeof(i) for i in range(256)) + 256 * per_entry
    assert backend.state_size() == round(sample * 1000 / 256)


# ----------------------------------------------------------------------------- snapshots


def test_snapshot_format(backend: HashMapKeyedStateBackend) -> None:
    count = backend.get_state(COUNT)
    backend.get_state(EVENTS)  # registered, never written
    for key, value in (("a", 1), ("c", 2), (8, 3)):
        backend.set_current_key(key)
        count.update(value)
    backend.channel_watermarks = {1: 2000, 0: 1000}  # the operator's event-time state
    blob = snapshot_blob(backend)
    assert blob[:5] == b"SPKV\x01"  # canonical, format version 1
    snap = canonical.decode_snapshot(blob, "the snapshot")
    assert (snap.max_parallelism, snap.key_group_range) == (128, FULL)
    assert (snap.backend, snap.changelog) == ("hashmap", False)
    assert snap.states == {
        "count": StateInfo("count", "value", "pickle"),
        "events": StateInfo("events", "list", "pickle"),
    }
    assert snap.watermarks == {0: 1000, 1: 2000}
    assert snap.key_groups() == [15, 48, 55]
    assert list(snap.entries()) == [
        (15, "count", "c", 2),
        (48, "count", 8, 3),
        (55, "count", "a", 1),
    ]
    count_bytes = sum(
        len(encode_key(k)) + len(encode_value("value", PICKLE, v))
        for k, v in (("a", 1), ("c", 2), (8, 3))
    )
    assert snap.state_sizes() == {"count": (3, count_bytes), "events": (0, 0)}
    assert snap.entry_count == 3 and snap.size == len(blob)


def test_equal_state_gives_equal_bytes() -> None:
    keys: list[Any] = [f"k-{i}" for i in range(50)] + list(range(50))
    first, second = HashMapKeyedStateBackend(128, FULL), HashMapKeyedStateBackend(128, FULL)
    fill(first, keys)
    fill(second, keys)  # the same state, built in another order and with a detour
    second.set_current_key("k-0")
    second.get_state(EVENTS).add("gone")
    second.get_state(EVENTS).update([0, "0"])
    reordered = HashMapKeyedStateBackend(128, FULL)
    for name in ("last-seen", "events", "count"):  # registered in another order too
        reordered.register(first.state_infos[name])
        entries = list(first.table(name).items())[::-1]
        reordered.table(name).put_many([k for k, _ in entries], [v for _, v in entries])
    assert snapshot_blob(second) == snapshot_blob(first) == snapshot_blob(reordered)


def test_snapshot_of_int_keys(backend: HashMapKeyedStateBackend) -> None:
    backend.get_state(COUNT)
    backend.table("count").put_many([0, 8, 2**63, True], ["x", "y", "z", "t"])  # True == 1
    snap = canonical.decode_snapshot(snapshot_blob(backend), "the snapshot")
    assert list(snap.entries()) == [
        (34, "count", 2**63, "z"),
        (48, "count", 8, "y"),
        (57, "count", 0, "x"),
        (108, "count", 1, "t"),  # True and 1 are one key (as in a dict), written as 1
    ]


# ----------------------------------------------------------------------------- restore checks


def test_snapshot_with_another_max_parallelism_is_refused(
    backend: HashMapKeyedStateBackend,
) -> None:
    fill(backend, ["a"])
    with pytest.raises(ConfigurationError) as info:
        HashMapKeyedStateBackend.restore([snapshot_blob(backend)], 256, KeyGroupRange(0, 255))
    assert str(info.value) == (
        "snapshot 0 was taken with max_parallelism 128; it cannot be restored with "
        "max_parallelism 256 (every key would change key group)"
    )


def test_the_same_key_group_in_two_snapshots_is_refused(backend: HashMapKeyedStateBackend) -> None:
    fill(backend, ["a"])
    blob = snapshot_blob(backend)
    with pytest.raises(CorruptSnapshotError) as info:
        HashMapKeyedStateBackend.restore([blob, blob], 128, FULL)
    assert str(info.value) == (
        "key group 55 is in snapshots 0 and 1; the snapshots of one checkpoint have disjoint "
        "key group ranges"
    )
    # Outside the new range the overlap is not looked at (those key groups are skipped).
    low = HashMapKeyedStateBackend.restore([blob, blob], 128, KeyGroupRange(0, 50))
    assert low.table("count") == {}


def test_conflicting_state_kinds_across_snapshots_are_refused() -> None:
    first, second = HashMapKeyedStateBackend(128, FULL), HashMapKeyedStateBackend(128, FULL)
    first.get_state(COUNT)
    second.get_state(ListStateDescriptor("count"))
    with pytest.raises(CorruptSnapshotError) as info:
        HashMapKeyedStateBackend.restore([snapshot_blob(first), snapshot_blob(second)], 128, FULL)
    assert str(info.value) == (
        "snapshot 1: keyed state 'count' is a value state; it cannot be used as a list state"
    )


def test_conflicting_serializers_across_snapshots_are_refused() -> None:
    first, second = HashMapKeyedStateBackend(128, FULL), HashMapKeyedStateBackend(128, FULL)
    first.get_state(COUNT)
    second.get_state(ValueStateDescriptor("count", serializer="json"))
    with pytest.raises(CorruptSnapshotError) as info:
        HashMapKeyedStateBackend.restore([snapshot_blob(first), snapshot_blob(second)], 128, FULL)
    assert str(info.value) == (
        "snapshot 1: keyed state 'count' was written with serializer 'pickle'; its descriptor "
        "now declares 'json'"
    )


# ----------------------------------------------------------------------------- corrupt input


def _canonical_blob() -> bytes:
    source = HashMapKeyedStateBackend(128, FULL)
    source.get_state(COUNT)
    source.table("count")["a"] = 1
    return snapshot_blob(source)


CANONICAL = _canonical_blob()
NOT_CANONICAL = "snapshot 0 is not a valid canonical keyed state snapshot: "


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"", NOT_CANONICAL + "0 bytes, shorter than the 13-byte prefix"),
        (b"XXXX\x01" + bytes(20), NOT_CANONICAL + "starts with b'XXXX', expected magic b'SPKV'"),
        (
            CANONICAL[:4] + b"\x02" + CANONICAL[5:],
            NOT_CANONICAL + "format version 2; this version of Sparkpoint reads version 1",
        ),
        (CANONICAL[:-3], NOT_CANONICAL + "the body is"),
        (CANONICAL[:-1] + bytes([CANONICAL[-1] ^ 1]), NOT_CANONICAL + "the body's CRC-32"),
        (CANONICAL[:15] + bytes([CANONICAL[15] ^ 1]) + CANONICAL[16:], "the header's CRC-32"),
    ],
)
def test_corrupt_canonical_snapshots_are_refused(blob: bytes, message: str) -> None:
    with pytest.raises(CorruptSnapshotError) as info:
        HashMapKeyedStateBackend.restore([blob], 128, FULL)
    assert message in str(info.value)


# ----------------------------------------------------------------------------- legacy SPKS


def _blob(payload: Any, header: bytes = b"SPKS\x01") -> bytes:
    return header + pickle.dumps(payload, protocol=5)


GOOD = {
    "max_parallelism": 128,
    "key_group_range": (0, 127),
    "states": {"count": "value"},
    "groups": {55: {"count": {"a": 1}}},
}


def test_legacy_snapshot_still_restores(backend: HashMapKeyedStateBackend) -> None:
    keys: list[Any] = [f"app-{i}" for i in range(100)] + list(range(50)) + [None, (1, "x")]
    fill(backend, keys)
    backend.channel_watermarks = {0: 500}
    legacy = snapshot_format.encode_snapshot(
        contents(backend), backend.states, 128, FULL, backend.channel_watermarks
    )
    assert legacy[:5] == b"SPKS\x01"  # the pickled layout of earlier versions
    restored = HashMapKeyedStateBackend.restore([legacy], 128, FULL)
    assert contents(restored) == contents(backend)
    assert restored.state_infos == {
        name: StateInfo(name, kind, "pickle") for name, kind in backend.states.items()
    }
    assert restored.channel_watermarks == {0: 500}
    restored.set_current_key("app-4")
    assert restored.get_state(COUNT).value() == 5
    assert restored.get_state(EVENTS).get() == [4, "4"]
    low = HashMapKeyedStateBackend.restore([legacy], 128, KeyGroupRange(0, 50))
    assert low.table("count") == {
        k: v for k, v in backend.table("count").items() if key_group_for(k) <= 50
    }
    # Restored once, a legacy snapshot's state is written canonically from then on.
    again = HashMapKeyedStateBackend.restore([snapshot_blob(restored)], 128, FULL)
    assert contents(again) == contents(backend)


def test_legacy_and_canonical_snapshots_restore_together() -> None:
    legacy = _blob({**GOOD, "key_group_range": (0, 63), "groups": {15: {"count": {"c": 3}}}})
    upper = HashMapKeyedStateBackend(128, KeyGroupRange(64, 127))
    upper.get_state(COUNT)
    upper.table("count")[2] = 4  # key group 94
    upper.channel_watermarks = {0: 70}
    restored = HashMapKeyedStateBackend.restore([legacy, snapshot_blob(upper)], 128, FULL)
    assert restored.table("count") == {"c": 3, 2: 4}
    assert restored.channel_watermarks == {}  # the legacy one has no watermarks: no channel
    # One key group in a legacy and a canonical snapshot is refused as well.
    with pytest.raises(CorruptSnapshotError, match="key group 55 is in snapshots 0 and 1"):
        HashMapKeyedStateBackend.restore([_blob(GOOD), CANONICAL], 128, FULL)


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (
            _blob(GOOD, b"SPKS\x02"),
            "snapshot 0 has format version 2; this version of Sparkpoint reads version 1",
        ),
        (_blob(GOOD)[:-3], "snapshot 0 cannot be decoded"),
        (b"SPKS\x01not a pickle", "snapshot 0 cannot be decoded (17 bytes)"),
        (_blob([1, 2]), "snapshot 0 is malformed: payload is a list, expected a dict"),
        (_blob({**GOOD, "groups": None}), "snapshot 0 is malformed: groups is not a mapping"),
        (
            _blob({k: v for k, v in GOOD.items() if k != "states"}),
            "snapshot 0 is malformed: missing states",
        ),
        (
            _blob({**GOOD, "states": {"count": "tree"}}),
            "snapshot 0 is malformed: states is not a mapping",
        ),
        (
            _blob({**GOOD, "key_group_range": (0, 10)}),
            "snapshot 0 of key group range [0, 10] holds key group 55",
        ),
        (
            _blob({**GOOD, "groups": {55: {"sum": {"a": 1}}}}),
            "key group 55 holds undeclared or malformed state 'sum'",
        ),
    ],
)
def test_corrupt_legacy_snapshots_are_refused(blob: bytes, message: str) -> None:
    with pytest.raises(CorruptSnapshotError) as info:
        HashMapKeyedStateBackend.restore([blob], 128, FULL)
    assert message in str(info.value)


def test_legacy_snapshot_with_another_max_parallelism_is_refused() -> None:
    with pytest.raises(ConfigurationError) as info:
        HashMapKeyedStateBackend.restore([_blob({**GOOD, "max_parallelism": 256})], 128, FULL)
    assert str(info.value) == (
        "snapshot 0 was taken with max_parallelism 256; it cannot be restored with "
        "max_parallelism 128 (every key would change key group)"
    )


def test_conflicting_state_kinds_across_legacy_snapshots_are_refused() -> None:
    other = _blob({**GOOD, "states": {"count": "list"}, "groups": {}})
    with pytest.raises(CorruptSnapshotError) as info:
        HashMapKeyedStateBackend.restore([_blob(GOOD), other], 128, FULL)
    assert str(info.value) == (
        "snapshot 1: keyed state 'count' is a value state; it cannot be used as a list state"
    )
