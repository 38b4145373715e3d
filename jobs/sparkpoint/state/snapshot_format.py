"""The snapshot format of the ``hashmap`` keyed state backend: encoding and checked decoding.

A snapshot groups the state by key group so that
:meth:`~sparkpoint.state.hashmap.HashMapKeyedStateBackend.restore` can merge the snapshots of
every old subtask and keep the key groups of a new one: that is how a checkpoint is restored
with a different parallelism. Snapshot format: ``b"SPKS"``, a version byte, then a pickle
(protocol 5) of ``{"max_parallelism", "key_group_range": (start, end), "states": {name: kind},
"groups": {key_group: {name: {key: value}}}, "watermarks": {channel: watermark}}``, empty
groups omitted (``watermarks``, the operator's event-time state, may be absent). Snapshots
are unpickled by :func:`decode_snapshot`: read them only from checkpoint storage you trust
(its handles carry a checksum that is verified before the bytes get here).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state.descriptors import StateKind
from sparkpoint.state.key_groups import (
    KeyGroupOutOfRangeError,
    KeyGroupRange,
    key_groups_of,
    stable_hash,
)

SNAPSHOT_MAGIC = b"SPKS"
SNAPSHOT_VERSION = 1
_HEADER_LEN = len(SNAPSHOT_MAGIC) + 1
_KINDS: frozenset[str] = frozenset({"value", "list", "map"})


def encode_snapshot(
    tables: Mapping[str, dict[Any, Any]],
    kinds: Mapping[str, StateKind],
    max_parallelism: int,
    key_group_range: KeyGroupRange,
    watermarks: Mapping[int, int] | None = None,
) -> bytes:
    """A snapshot of ``tables`` (state name -> {key: value}), grouped by key group.

    Args:
        tables: the state of a backend, by state name.
        kinds: the kind of every registered state, by name.
        max_parallelism: the backend's max parallelism (number of key groups).
        key_group_range: the key groups the backend owns.
        watermarks: the latest watermark of each input channel (operator state).

    Raises:
        KeyGroupOutOfRangeError: when a table holds a key outside ``key_group_range``.
    """
    groups: dict[int, dict[str, dict[Any, Any]]] = {}
    start, end = key_group_range.start, key_group_range.end
    for name, table in tables.items():
        if not table:
            continue
        keys = list(table)
        key_groups = _key_groups_of_distinct(keys, max_parallelism)
        if min(key_groups) < start or max(key_groups) > end:
            index = next(i for i, kg in enumerate(key_groups) if not start <= kg <= end)
            raise KeyGroupOutOfRangeError(
                f"keyed state {name!r} holds key {keys[index]!r} of key group "
                f"{key_groups[index]}, outside the key group range {key_group_range} "
                f"of this state backend (max_parallelism {max_parallelism})"
            )
        for key, key_group in zip(keys, key_groups, strict=True):
            by_state = groups.get(key_group)
            if by_state is None:
                by_state = groups[key_group] = {}
            entries = by_state.get(name)
            if entries is None:
                entries = by_state[name] = {}
            entries[key] = table[key]
    payload = {
        "max_parallelism": max_parallelism,
        "key_group_range": (start, end),
        "states": dict(kinds),
        "groups": groups,
        "watermarks": dict(watermarks or {}),
    }
    return SNAPSHOT_MAGIC + bytes([SNAPSHOT_VERSION]) + pickle.dumps(payload, protocol=5)


def decode_snapshot(blob: bytes, index: int) -> dict[str, Any]:
    """Check a snapshot's header and structure and return its payload.

    Args:
        blob: the snapshot.
        index: the snapshot's position among those being restored, for error messages.

    Raises:
        CorruptSnapshotError: a wrong magic or version, an undecodable pickle or a payload
            of the wrong structure.
    """
    data = bytes(blob)
    if len(data) < _HEADER_LEN or data[: len(SNAPSHOT_MAGIC)] != SNAPSHOT_MAGIC:
        raise CorruptSnapshotError(
            f"snapshot {index} is not a hashmap state snapshot: it starts with "
            f"{data[:_HEADER_LEN]!r}, expected magic {SNAPSHOT_MAGIC!r}"
        )
    version = data[len(SNAPSHOT_MAGIC)]
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(
            f"snapshot {index} has format version {version}; this version of Sparkpoint "
            f"reads version {SNAPSHOT_VERSION}"
        )
    try:
        payload = pickle.loads(data[_HEADER_LEN:])
    except Exception as err:  # a damaged pickle can raise almost anything
        raise CorruptSnapshotError(
            f"snapshot {index} cannot be decoded ({len(data)} bytes): {err!r}"
        ) from err
    problem = _structure_problem(payload)
    if problem:
        raise CorruptSnapshotError(f"snapshot {index} is malformed: {problem}")
    return payload


def _structure_problem(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return f"payload is a {type(payload).__name__}, expected a dict"
    missing = {"max_parallelism", "key_group_range", "states", "groups"} - set(payload)
    if missing:
        return f"missing {', '.join(sorted(missing))}"
    if not isinstance(payload["max_parallelism"], int):
        return "max_parallelism is not an int"
    kg_range = payload["key_group_range"]
    if not (
        isinstance(kg_range, tuple)
        and len(kg_range) == 2
        and all(isinstance(v, int) for v in kg_range)
    ):
        return f"key_group_range {kg_range!r} is not a (start, end) pair"
    states = payload["states"]
    if not isinstance(states, dict) or not all(
        isinstance(name, str) and kind in _KINDS for name, kind in states.items()
    ):
        return "states is not a mapping of name to value/list/map"
    groups = payload["groups"]
    if not isinstance(groups, dict) or not all(
        isinstance(kg, int) and isinstance(by_state, dict) for kg, by_state in groups.items()
    ):
        return "groups is not a mapping of key group to states"
    marks = payload.get("watermarks", {})
    if not isinstance(marks, dict) or not all(
        isinstance(c, int) and isinstance(w, int) for c, w in marks.items()
    ):
        return "watermarks is not a mapping of channel to watermark"
    return None


def _key_groups_of_distinct(keys: list[Any], max_parallelism: int) -> list[int]:
    """Key groups of distinct keys: vectorized for ints; one hash per key otherwise, since
    sorting distinct values (what ``key_groups_of`` does to deduplicate) gains nothing."""
    if set(map(type, keys)) <= {int, bool}:
        array = np.fromiter(keys, dtype=object, count=len(keys))
        return key_groups_of(array, max_parallelism).tolist()
    return [stable_hash(key) % max_parallelism for key in keys]
