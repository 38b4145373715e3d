"""The working state's columnar epoch deltas: what is written reads back exactly, damage is
refused by name, and a delta of the earlier (canonical) format still reopens."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state import canonical, changelog
from sparkpoint.state.backend import DELETED, StateInfo
from sparkpoint.state.changelog_delta import decode_delta, encode_delta
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import KeyGroupRange, key_group_for
from sparkpoint.state.slot_table import SlotTable

from .conftest import COUNT, FULL, KEYS, copy_of_tables, filled_hashmap
from .test_hashmap_versions import MemoryVersionStore

STATES = {
    "count": StateInfo("count", "value", "int64"),
    "ratio": StateInfo("ratio", "value", "float64"),
    "events": StateInfo("events", "list", "pickle"),
    "seen": StateInfo("seen", "map", "json"),
    "unused": StateInfo("unused", "value", "pickle"),
}


def _roundtrip(changes: dict[str, dict[Any, Any]], key_groups: KeyGroupRange = FULL) -> Any:
    blob = encode_delta(
        STATES, changes, max_parallelism=128, key_group_range=FULL, watermarks={0: 7, 1: 9}
    )
    delta = decode_delta(blob, "the delta")
    assert delta.max_parallelism == 128 and delta.key_group_range == FULL
    assert delta.watermarks == {0: 7, 1: 9} and delta.states == STATES
    read: dict[str, dict[Any, Any]] = {}
    for group, name, key, value in delta.entries(key_groups):
        assert group == key_group_for(key, 128) and group in key_groups
        read.setdefault(name, {})[key] = value
    return read


def test_every_kind_of_key_and_value_reads_back_with_its_removals() -> None:
    changes = {
        "count": {key: i for i, key in enumerate(KEYS)},  # str, int, None and tuple keys
        "ratio": {f"r{i}": i / 3 for i in range(50)},
        "events": {"a": [1, "x"], "b": DELETED, 3: []},
        "seen": {"k": {"page": 1.5}, "gone": DELETED},
    }
    assert _roundtrip(changes) == changes


def test_int64_values_of_another_type_or_too_large_go_through_the_serializer() -> None:
    assert _roundtrip({"count": {"a": 1, "b": DELETED}}) == {"count": {"a": 1, "b": DELETED}}
    with pytest.raises(ConfigurationError):  # the serializer's own refusal, not a truncation
        _roundtrip({"count": {"a": 1.5}})
    with pytest.raises(ConfigurationError):
        _roundtrip({"count": {"a": 2**70}})


def test_entries_are_those_of_the_asked_key_groups() -> None:
    changes = {"count": {f"k{i}": i for i in range(300)}}
    low = KeyGroupRange(0, 63)
    expected = {k: v for k, v in changes["count"].items() if key_group_for(k, 128) in low}
    assert 0 < len(expected) < 300
    assert _roundtrip(changes, low) == {"count": expected}


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda b: b[:10], "shorter than the 18-byte prefix"),
        (lambda b: b[:-1], "the body is"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "CRC-32 does not match"),
        (lambda b: b"SPKV" + b[4:], "expected b'SPCD' 1"),
    ],
)
def test_a_damaged_delta_is_refused_with_where_and_what(damage: Any, problem: str) -> None:
    blob = encode_delta(
        STATES, {"count": {"a": 1}}, max_parallelism=128, key_group_range=FULL, watermarks={}
    )
    with pytest.raises(CorruptSnapshotError, match=r"/x/v2\.delta is not a valid") as info:
        decode_delta(damage(blob), "/x/v2.delta")
    assert problem in str(info.value)


def _checksummed(document: dict[str, Any]) -> bytes:
    body = msgpack.packb(document)
    return struct.pack(">4sHQI", b"SPCD", 1, len(body), zlib.crc32(body)) + body


def test_a_well_checksummed_delta_of_the_wrong_structure_is_refused() -> None:
    with pytest.raises(CorruptSnapshotError, match="malformed document: KeyError"):
        decode_delta(_checksummed({"max_parallelism": 128, "states": []}), "d")
    two_keys_one_value = {
        "max_parallelism": 128,
        "key_group_range": [0, 127],
        "watermarks": [],
        "states": [["count", "value", "int64", True, ["a", "b"], "<i8", bytes(8)]],
    }
    with pytest.raises(CorruptSnapshotError, match=r"state 'count' do not decode.*2 keys but 1"):
        list(decode_delta(_checksummed(two_keys_one_value), "d").entries(FULL))


def test_a_chain_written_by_an_earlier_version_still_reopens(tmp_path: Path) -> None:
    """Chains written before this format (a canonical base and canonical changelogs) rebuild
    as they did; a chain may mix them with columnar deltas written since."""
    store = MemoryVersionStore(tmp_path / "local")
    backend = filled_hashmap(100)
    common: dict[str, Any] = {"max_parallelism": 128, "key_group_range": FULL}
    old_base = canonical.encode_snapshot(
        backend.state_infos, backend.entries(), **common, watermarks={}, backend="hashmap"
    )
    backend.take_changes()
    for i in range(5):
        backend.set_current_key(f"k{i}")
        backend.get_state(COUNT).update(-i)
    backend.set_current_key("k7")
    backend.get_state(COUNT).clear()
    changes = backend.take_changes()
    entries = [
        (key_group_for(key, 128), name, key, value)
        for name, table in changes.changes.items()
        for key, value in table.items()
    ]
    old_delta = canonical.encode_snapshot(
        changes.states, entries, **common, watermarks={0: 300}, backend="hashmap", changelog=True
    )
    backend.set_current_key("k9")
    backend.get_state(COUNT).update(99)
    new_delta = encode_delta(
        backend.state_infos, backend.take_changes().changes, **common, watermarks={0: 400}
    )
    files = {"v1.base": old_base, "v2.delta": old_delta, "v3.delta": new_delta}
    Path(store.local_dir).mkdir(parents=True)
    for name, blob in files.items():
        Path(store.local_dir, name).write_bytes(blob)
    chain = {"base_bytes": 1, "delta_bytes": 1, "tag": "v3"}
    chain["files"] = [{"name": name, "durable": None} for name in files]
    Path(store.local_dir, "v3.chain").write_text(json.dumps(chain))
    changelog._LIVE.clear()
    reopened = HashMapKeyedStateBackend.open_version(store, "v3", 128, FULL)
    assert reopened is not None
    assert copy_of_tables(reopened) == copy_of_tables(backend)
    assert reopened.channel_watermarks == {0: 400}
    reopened.set_current_key("k7")
    assert reopened.get_state(COUNT).value() == 0  # cleared by the canonical changelog


@pytest.mark.parametrize("serializer", ["int64", "float64"])
def test_a_slot_tables_number_column_is_written_as_the_same_buffer(serializer: str) -> None:
    table = SlotTable("total", serializer)
    keys = [f"k{i}" for i in range(1000)]
    table.put_many(keys, [i * 3 if serializer == "int64" else i / 4 for i in range(1000)])
    changes = table.take_changes(DELETED)
    assert changes.number_column() is not None  # nothing removed: the numbers stay an array
    states = {"total": StateInfo("total", "value", serializer)}
    common: dict[str, Any] = {"max_parallelism": 128, "key_group_range": FULL, "watermarks": {}}
    from_array = encode_delta(states, {"total": changes}, **common)
    as_dict = dict(zip(changes.keys(), changes.values(), strict=True))
    assert from_array == encode_delta(states, {"total": as_dict}, **common)
    table.pop("k5")
    table["k6"] = 1
    removed = table.take_changes(DELETED)
    assert removed.number_column() is None and dict(removed.items()) == {"k5": DELETED, "k6": 1}
