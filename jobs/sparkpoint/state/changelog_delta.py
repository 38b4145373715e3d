"""A subtask's working state, or an epoch's changes to it, a column per state: cheap to write.

The changelog (:mod:`sparkpoint.state.changelog`) writes a base and then one delta per epoch
in this format; only the same subtask reads them back (the same key-group range, to rebuild
its working state in another Python worker or after a failed epoch), so they need none of a
snapshot's key-group blocks: each is one msgpack document after a fixed prefix, checked by a
CRC-32::

    "SPCD" | version u16 | body length u64 | body CRC-32 u32 | body (msgpack)

The body holds the writer's max parallelism and key-group range, the channel watermarks, and
per state its kind, its serializer's name and two columns: the keys (msgpack strings when
every key is a ``str``, else :func:`~sparkpoint.state.serializers.encode_key` bytes) and the
values (:func:`~sparkpoint.state.serializers.encode_value` bytes through the state's declared
serializer, nil for a removed entry; a fixed-width serializer's values as one buffer). Nothing
is sorted or hashed when writing: the key groups are computed only when a delta is read.

The ``hashmap`` backend's checkpoints use it too (:data:`FORMAT_ID`, Flink's native
checkpoint format of a heap backend): every entry of the subtask's tables, marked ``full``,
written about seven times faster than a canonical snapshot because nothing is sorted by key
group or hashed. A restore hashes the keys only when the new key-group range does not cover
the file's (rescaling), and either backend restores it. Savepoints stay canonical, and a
delta without ``full`` (an epoch's changes) is never restored as a snapshot.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import msgpack
import numpy as np

from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state.backend import KeyedStateBackend, StateInfo
from sparkpoint.state.canonical_codec import EntryColumns, encoded_entries
from sparkpoint.state.column_codec import decode_keys, decode_values, encode_keys, encode_values
from sparkpoint.state.key_groups import KeyGroupRange, key_groups_of
from sparkpoint.state.serializers import Float64Serializer, Int64Serializer, serializer_named
from sparkpoint.state.slot_table import SlotColumns

MAGIC = b"SPCD"
VERSION = 1
#: The format of a ``hashmap`` checkpoint's state handle: a full table in this format.
FORMAT_ID = "hashmap-columns-v1"
_PREFIX = struct.Struct(">4sHQI")
# Serializers whose values are one fixed-width number: written as one array buffer.
_ARRAYS = {Int64Serializer: "<i8", Float64Serializer: "<f8"}


def is_delta(blob: bytes | bytearray | memoryview) -> bool:
    """Whether ``blob`` starts as a columnar delta does."""
    return bytes(blob[: len(MAGIC)]) == MAGIC


def encode_delta(
    states: Mapping[str, StateInfo],
    changes: Mapping[str, Mapping[Any, Any]],
    *,
    max_parallelism: int,
    key_group_range: KeyGroupRange,
    watermarks: Mapping[int, int],
    full: bool = False,
) -> bytes:
    """The delta of ``changes`` (state name -> key -> value, ``DELETED`` for a removed key)
    to the registered ``states`` (each recorded, changed or not). ``full``: ``changes`` are
    every entry of the states (a base, a checkpoint), not one epoch's changes.

    Raises:
        ConfigurationError: a key or value that its state's serializer cannot write.
    """
    columns = []
    for name, info in states.items():
        table = changes.get(name, {})
        serializer = serializer_named(info.serializer, f"state {name!r}")
        keys = list(table)
        numbers = table.number_column() if isinstance(table, SlotColumns) else None
        dtype, packed = _array_of(info.kind, serializer, numbers)
        if dtype is None:
            values = list(table.values())
            dtype, packed = _array_of(info.kind, serializer, values)
        if dtype is None:
            packed = _encoded_values(states, name, serializer, keys, values)
        as_str = set(map(type, keys)) == {str}
        encoded_keys = keys if as_str else encode_keys(keys)
        columns.append([name, info.kind, info.serializer, as_str, encoded_keys, dtype, packed])
    body = msgpack.packb(
        {
            "max_parallelism": max_parallelism,
            "key_group_range": [key_group_range.start, key_group_range.end],
            "watermarks": [[int(c), int(w)] for c, w in sorted(watermarks.items())],
            "states": columns,
            "full": full,
        },
        use_bin_type=True,
    )
    return _PREFIX.pack(MAGIC, VERSION, len(body), zlib.crc32(body)) + body


def tables_of(entries: Iterable[tuple[int, str, Any, Any]]) -> Mapping[str, Mapping[Any, Any]]:
    """State name -> key -> value of a backend's :meth:`entries` (a hashmap's own tables
    when they come as columns)."""
    if isinstance(entries, EntryColumns):
        return entries.tables
    tables: dict[str, dict[Any, Any]] = {}
    for _, name, key, value in entries:
        tables.setdefault(name, {})[key] = value
    return tables


def _encoded_values(
    states: Mapping[str, StateInfo], name: str, serializer: Any, keys: list[Any], values: list[Any]
) -> list[Any]:
    """``values`` through the state's serializer; a value it refuses is named (key, state,
    serializer) as a snapshot names it."""
    kind = states[name].kind
    try:
        return encode_values(kind, serializer, values)
    except Exception:
        entries = ((0, name, key, value) for key, value in zip(keys, values, strict=True))
        for _ in encoded_entries({name: (kind, serializer)}, states, entries):
            pass
        raise


def _array_of(
    kind: str, serializer: Any, values: list[Any] | np.ndarray | None
) -> tuple[str | None, Any]:
    """The values of a fixed-width serializer as one buffer (all of exactly its type, none
    removed; or a numpy array of its kind), else ``(None, None)``."""
    dtype = _ARRAYS.get(type(serializer)) if kind == "value" else None
    if dtype is None or values is None:
        return None, None
    if isinstance(values, np.ndarray):
        if values.dtype.kind != np.dtype(dtype).kind:
            return None, None
        return dtype, values.astype(dtype, copy=False).tobytes()
    if set(map(type, values)) != {int if dtype == "<i8" else float}:
        return None, None
    try:
        return dtype, np.array(values, dtype=dtype).tobytes()
    except OverflowError:  # the serializer names the value
        return None, None


@dataclass
class Delta:
    """A checked delta (from :func:`decode_delta`)."""

    max_parallelism: int
    key_group_range: KeyGroupRange
    watermarks: dict[int, int]
    states: dict[str, StateInfo]
    where: str
    full: bool = False  # every entry of the states, not one epoch's changes
    _columns: list[list[Any]] = field(default_factory=list, repr=False)

    def entries(self, key_group_range: KeyGroupRange) -> Iterator[tuple[int, str, Any, Any]]:
        """``(key group, state name, key, value)`` of the keys in ``key_group_range``, a
        removed key's value being :data:`~sparkpoint.state.backend.DELETED`.

        Raises:
            CorruptSnapshotError: keys or values that do not decode (naming the file).
        """
        for name, groups, keys, values in self._columns_in(key_group_range):
            yield from zip(groups, repeat(name), keys, values)

    def sizes(self) -> dict[str, tuple[int, int]]:
        """Per state: its entries and their encoded bytes (keys and values), nothing decoded."""
        out = {}
        for name, _kind, _serializer, _as_str, keys, dtype, packed in self._columns:
            values = len(packed) if dtype is not None else sum(len(v or b"") for v in packed)
            out[name] = (len(keys), sum(map(len, keys)) + values)
        return out

    def head(self, n: int) -> Iterator[tuple[str, Any, Any]]:
        """``(state name, key, value)`` of the first ``n`` entries, only those decoded (a
        sample: a ``pickle`` value is unpickled, which runs code).

        Raises:
            CorruptSnapshotError: a key or value that does not decode.
        """
        for name, kind, serializer_name, as_str, keys, dtype, packed in self._columns:
            if n <= 0:
                return
            try:
                few = list(keys[:n]) if as_str else decode_keys(keys[:n])
                if dtype is not None:
                    values = np.frombuffer(packed, dtype=dtype)[: len(few)].tolist()
                else:
                    serializer = serializer_named(serializer_name, self.where)
                    values = decode_values(kind, serializer, packed[: len(few)])
            except CorruptSnapshotError:
                raise
            except Exception as err:
                raise CorruptSnapshotError(
                    f"{self.where}: the entries of state {name!r} do not decode: {err!r}"
                ) from err
            yield from zip(repeat(name), few, values)
            n -= len(few)

    def load_into(self, backend: KeyedStateBackend) -> None:
        """Load the entries of ``backend``'s key groups into it, a state's column at a time
        (the states registered before).

        Raises:
            CorruptSnapshotError: as :meth:`entries`.
        """
        inside = backend.key_group_range
        if inside.start <= self.key_group_range.start and self.key_group_range.end <= inside.end:
            # Every key of the file is in its own range, so in the backend's: none to hash.
            for name, keys, values in self._decoded():
                backend.load_columns(name, keys, values)
            return
        for name, _groups, keys, values in self._columns_in(inside):
            backend.load_columns(name, keys, values)

    def _columns_in(
        self, key_group_range: KeyGroupRange
    ) -> Iterator[tuple[str, list[int], list[Any], list[Any]]]:
        """Per state: its name and the key groups, keys and values of its keys in
        ``key_group_range``."""
        for name, keys, values in self._decoded():
            try:
                array = np.fromiter(keys, dtype=object, count=len(keys))
                groups = key_groups_of(array, self.max_parallelism)
            except Exception as err:
                raise CorruptSnapshotError(
                    f"{self.where}: the keys of state {name!r} do not hash: {err!r}"
                ) from err
            inside = (groups >= key_group_range.start) & (groups <= key_group_range.end)
            if inside.all():
                yield name, groups.tolist(), keys, values
                continue
            positions = np.flatnonzero(inside).tolist()
            yield (
                name,
                groups[positions].tolist(),
                [keys[i] for i in positions],
                [values[i] for i in positions],
            )

    def _decoded(self) -> Iterator[tuple[str, list[Any], list[Any]]]:
        """Per state: its name, the keys and the values."""
        for name, kind, serializer_name, as_str, keys, dtype, packed in self._columns:
            try:
                serializer = serializer_named(serializer_name, self.where)
                if not as_str:
                    keys = decode_keys(keys)
                if dtype is not None:
                    values = np.frombuffer(packed, dtype=dtype).tolist()
                else:
                    values = decode_values(kind, serializer, packed)
                if len(values) != len(keys):
                    raise ValueError(f"{len(keys)} keys but {len(values)} values")
            except CorruptSnapshotError:
                raise
            except Exception as err:
                raise CorruptSnapshotError(
                    f"{self.where}: the entries of state {name!r} do not decode: {err!r}"
                ) from err
            yield name, keys, values


def decode_delta(blob: bytes | bytearray | memoryview, where: str) -> Delta:
    """Check a delta's prefix and checksum and read its document.

    Raises:
        CorruptSnapshotError: a wrong magic or version, a truncated or altered delta, or a
            document of the wrong structure; the message names ``where`` and the problem.
    """
    view = memoryview(blob).cast("B")

    def corrupt(problem: str) -> CorruptSnapshotError:
        return CorruptSnapshotError(f"{where} is not a valid working-state delta: {problem}")

    if len(view) < _PREFIX.size:
        raise corrupt(f"{len(view)} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, version, size, crc = _PREFIX.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        raise corrupt(f"starts with {magic!r} version {version}, expected {MAGIC!r} {VERSION}")
    body = view[_PREFIX.size :]
    if len(body) != size:
        raise corrupt(f"the body is {len(body)} bytes, the prefix says {size}")
    if zlib.crc32(body) != crc:
        raise corrupt("the body's CRC-32 does not match (altered)")
    try:
        doc = msgpack.unpackb(body, raw=False)
        start, end = doc["key_group_range"]
        columns = [list(column) for column in doc["states"]]
        states = {
            str(name): StateInfo(str(name), kind, str(serializer))
            for name, kind, serializer, *_ in columns
        }
        if any(len(column) != 7 for column in columns):
            raise ValueError("a state's column list is not [name, kind, serializer, ...]")
        return Delta(
            int(doc["max_parallelism"]),
            KeyGroupRange(int(start), int(end)),
            {int(c): int(w) for c, w in doc["watermarks"]},
            states,
            where,
            bool(doc.get("full", False)),
            columns,
        )
    except Exception as err:  # a damaged document can raise several kinds
        raise corrupt(f"malformed document: {err!r}") from err


__all__ = ["FORMAT_ID", "MAGIC", "Delta", "decode_delta", "encode_delta", "is_delta", "tables_of"]
