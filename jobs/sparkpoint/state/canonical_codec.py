"""How canonical snapshot bodies are written and read: column-wise, and entry by entry.

The fast path of :mod:`sparkpoint.state.canonical`: :func:`encode_body` and
:func:`block_columns` / :func:`decode_columns` do the work on whole columns (the keys of a
state encoded at once, one numpy sort of every entry, the blocks assembled in numpy by
:mod:`sparkpoint.state.msgpack_rows`) and give up -- return None -- on anything they do not
take and on any error. The caller then runs
the reference code (:func:`reference_body`, :func:`encoded_entries`; for reading,
``CanonicalSnapshot._block``), which goes entry by entry as the format was first written and
names the first problem: the bytes written and the errors raised are always the reference's."""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice, pairwise, repeat
from operator import itemgetter
from typing import Any

import msgpack
import numpy as np

from sparkpoint.errors import ConfigurationError
from sparkpoint.state.backend import DELETED, StateInfo
from sparkpoint.state.column_codec import (
    decode_keys,
    decode_values,
    encode_keys,
    encode_values,
    str_keys_fixed,
)
from sparkpoint.state.key_groups import KeyGroupOutOfRangeError, KeyGroupRange
from sparkpoint.state.msgpack_rows import concatenated, pack_blocks
from sparkpoint.state.serializers import (
    TypeSerializer,
    decode_key,
    encode_key,
    encode_value,
)

#: A raw entry: (key group, state name, key bytes, value bytes or None for a tombstone).
RawEntry = tuple[int, str, bytes, bytes | None]
#: ``(blocks, key group table, entries per state, bytes per state)`` of a body.
Body = tuple[list[bytes], list[list[int]], list[int], list[int]]

_NONE_TYPE = type(None)
# A numpy sort of the encoded keys takes a fixed-width copy of them: up to this many bytes.
_SORT_COPY_LIMIT = 256 << 20


# ----------------------------------------------------------------------------- encoding


class EntryColumns:
    """The entries of dict-like tables as columns, for :func:`encode_body` to take whole.

    Iterating gives ``(key group, state, key, value)`` like any entries, state by state;
    ``key_groups`` computes the key group of every key of a table (a list) at once.
    """

    def __init__(
        self,
        tables: Mapping[str, Mapping[Any, Any]],
        key_groups: Callable[[list[Any]], list[int]],
    ) -> None:
        self._tables = {name: table for name, table in tables.items() if table}
        self._key_groups = key_groups

    @property
    def tables(self) -> dict[str, Mapping[Any, Any]]:
        """The non-empty tables, by state name."""
        return self._tables

    def __iter__(self) -> Iterator[tuple[int, str, Any, Any]]:
        for name, table in self._tables.items():
            keys = list(table)
            groups = self._key_groups(keys)
            yield from zip(groups, repeat(name), keys, table.values(), strict=False)

    def columns(self) -> tuple[list[int], list[str], list[Any], list[Any]]:
        """Key groups, state names, keys and values, in the order of iteration."""
        key_groups: list[int] = []
        names: list[str] = []
        keys: list[Any] = []
        values: list[Any] = []
        for name, table in self._tables.items():
            table_keys = list(table)
            key_groups.extend(self._key_groups(table_keys))
            names.extend([name] * len(table_keys))
            keys.extend(table_keys)
            values.extend(table.values())
        return key_groups, names, keys, values


def encode_body(
    codecs: dict[str, tuple[str, TypeSerializer]],
    names: list[str],
    entries: Sequence[Any] | EntryColumns,
    start: int,
    end: int,
    *,
    changelog: bool,
    encoded: bool,
) -> Body | None:
    """The blocks of ``entries`` (``(key group, state, key, value)``; already bytes when
    ``encoded``, a tombstone being None, else objects, a tombstone being ``DELETED``), or None
    when the reference code must write them (an unusual entry, or any error)."""
    try:
        return _encode_body(codecs, names, entries, start, end, changelog, encoded)
    except Exception:  # the reference path raises the error, naming the entry
        return None


def _encode_body(
    codecs: dict[str, tuple[str, TypeSerializer]],
    names: list[str],
    entries: Sequence[Any] | EntryColumns,
    start: int,
    end: int,
    changelog: bool,
    encoded: bool,
) -> Body | None:
    # Step 1: columns, checked: int key groups in the range, known states.
    if isinstance(entries, EntryColumns):
        kgs, state_names, keys, values = entries.columns()
    else:
        if set(map(len, entries)) != {4}:
            return None
        kgs, state_names, keys, values = (list(map(itemgetter(i), entries)) for i in range(4))
    n = len(kgs)
    if n == 0:
        return None
    if set(map(type, kgs)) != {int}:
        return None
    kg = np.array(kgs, dtype=np.int64)
    if kg.min() < start or kg.max() > end:
        return None
    index = {name: i for i, name in enumerate(names)}
    present = set(state_names)
    if not present <= index.keys():
        return None
    # Step 2: entries by state (stable), each state's keys and values encoded at once.
    if len(present) == 1:
        si = np.full(n, index[next(iter(present))], dtype=np.int64)
    else:
        si = np.fromiter(map(index.__getitem__, state_names), dtype=np.int64, count=n)
        by_state = np.argsort(si, kind="stable")
        kg, si, positions = kg[by_state], si[by_state], by_state.tolist()
        keys = list(map(keys.__getitem__, positions))
        values = list(map(values.__getitem__, positions))
    # The keys of each state as bytes objects, or as one fixed-width array (ASCII str keys).
    key_parts: list[list[bytes] | np.ndarray] = []
    value_bytes: list[Any] = []  # bytes, None for a tombstone
    bounds = np.flatnonzero(np.diff(si)) + 1
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), n], strict=True):
        kind, serializer = codecs[names[int(si[a])]]
        part_keys, part_values = keys[a:b], values[a:b]
        if encoded:
            if set(map(type, part_keys)) != {bytes}:
                return None
            if not set(map(type, part_values)) <= {bytes, _NONE_TYPE}:
                return None
            key_parts.append(part_keys)
            value_bytes.extend(part_values)
        else:
            fixed = str_keys_fixed(part_keys)
            key_parts.append(encode_keys(part_keys) if fixed is None else fixed)
            value_bytes.extend(encode_values(kind, serializer, part_values))
    tombstones = None in set(map(type, value_bytes))
    if tombstones and not changelog:
        return None
    # Step 3: sort by key group, state, key bytes; equal neighbours (a key twice) give up.
    key_fixed = _fixed_keys(key_parts)
    ordered: tuple[np.ndarray, np.ndarray | None] | None
    if key_fixed is not None:
        key_lengths = np.strings.str_len(key_fixed).astype(np.int64)
        key_bytes: list[bytes] = []  # listed only if a fallback below needs them
        ordered = _order_fixed(kg, si, key_fixed)
    else:
        key_bytes = [key for part in key_parts for key in _listed(part)]
        key_lengths = np.fromiter(map(len, key_bytes), dtype=np.int64, count=n)
        ordered = _order(kg, si, key_bytes, key_lengths)
    if ordered is None:
        return None
    order, sorted_keys = ordered
    # Step 4: counts and bytes per state, one msgpack array per key group (the rows of a
    # block are made for it and dropped after it: a million live tuples slow the collector).
    value_lengths = np.fromiter(
        (0 if v is None else len(v) for v in value_bytes) if tombstones else map(len, value_bytes),
        dtype=np.int64,
        count=n,
    )
    counts = np.bincount(si, minlength=len(names)).tolist()
    weights = key_lengths + value_lengths
    sizes = [round(s) for s in np.bincount(si, weights=weights, minlength=len(names))]
    kg, si = kg[order], si[order]
    positions = order.tolist()
    cuts = [0, *(np.flatnonzero(np.diff(kg)) + 1).tolist(), n]
    nil = np.zeros(n, dtype=bool)
    if tombstones:
        nil = np.fromiter(map(operator.is_, value_bytes, repeat(None)), dtype=bool, count=n)
    lengths = (key_lengths[order], value_lengths[order], nil[order])
    blocks = pack_blocks(
        cuts,
        si,
        _gathered(key_bytes, positions, sorted_keys, lengths[0]),
        _gathered(value_bytes, positions, None, lengths[1]),
        lengths,
    )
    if blocks is None:
        key_bytes = key_bytes or [key for part in key_parts for key in _listed(part)]
        blocks = _packed_one_by_one(cuts, si.tolist(), positions, key_bytes, value_bytes)
    table: list[list[int]] = []
    offset = 0
    for a, b, block in zip(cuts[:-1], cuts[1:], blocks, strict=True):
        table.append([int(kg[a]), offset, len(block), b - a])
        offset += len(block)
    return blocks, table, counts, sizes


def _gathered(
    items: list[Any], positions: list[int], fixed: np.ndarray | None, lengths: np.ndarray
) -> bytes:
    """The bytes of ``items[p]`` for ``p`` in ``positions`` one after the other (None adds
    none): from ``fixed`` (the items, sorted, fixed-width) when given, else through a
    fixed-width copy when that stays small (numpy gathers it), else object by object."""
    if fixed is not None:
        return concatenated(fixed, lengths)
    width = int(lengths.max()) if len(lengths) else 0
    if None not in items and width > 0 and width * len(items) <= _SORT_COPY_LIMIT:
        return concatenated(np.array(items, dtype=f"S{width}")[positions], lengths)
    return b"".join(filter(None, map(items.__getitem__, positions)))


def _packed_one_by_one(
    cuts: list[int],
    state_of: list[int],
    positions: list[int],
    key_bytes: list[bytes],
    value_bytes: list[Any],
) -> list[bytes]:
    """The blocks through ``msgpack`` (for state indexes past a fixint)."""
    blocks = []
    for a, b in pairwise(cuts):
        # itemgetter(*positions): the fastest gather of scattered objects (a cache miss each).
        gather = itemgetter(*positions[a:b]) if b - a > 1 else _one(positions[a])
        rows = list(zip(state_of[a:b], gather(key_bytes), gather(value_bytes), strict=True))
        blocks.append(msgpack.packb(rows, use_bin_type=True))
    return blocks


def _one(position: int) -> Callable[[list[Any]], tuple[Any]]:
    return lambda items: (items[position],)


def _listed(part: list[bytes] | np.ndarray) -> list[bytes]:
    return part.tolist() if isinstance(part, np.ndarray) else part


def _fixed_keys(parts: list[list[bytes] | np.ndarray]) -> np.ndarray | None:
    """The keys of every state as one fixed-width array, when each state's keys are one and
    the copy stays small; else None."""
    if not all(isinstance(part, np.ndarray) for part in parts):
        return None
    arrays = [part for part in parts if isinstance(part, np.ndarray)]
    width = max(array.dtype.itemsize for array in arrays)
    if width * sum(map(len, arrays)) > _SORT_COPY_LIMIT:
        return None
    return np.concatenate(arrays).astype(f"S{width}", copy=False)


def _order_fixed(
    kg: np.ndarray, si: np.ndarray, fixed: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_order` of keys given as a fixed-width array (none ending in a zero byte)."""
    order = np.lexsort((fixed, si, kg))
    fixed, kg, si = fixed[order], kg[order], si[order]
    tie = (fixed[1:] == fixed[:-1]) & (si[1:] == si[:-1]) & (kg[1:] == kg[:-1])
    return None if tie.any() else (order, fixed)


def _order(
    kg: np.ndarray, si: np.ndarray, key_bytes: list[bytes], lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The permutation that sorts by (key group, state, key bytes) and the keys in that
    order as a fixed-width array (None when too large to copy); None when two neighbours tie
    (a key twice, or keys that differ only in trailing zero bytes, which a numpy bytes array
    does not tell apart: the reference code sorts those)."""
    width = max(int(lengths.max()), 1)
    if width * len(key_bytes) <= _SORT_COPY_LIMIT:
        return _order_fixed(kg, si, np.array(key_bytes, dtype=f"S{width}"))
    triples = list(zip(kg.tolist(), si.tolist(), key_bytes, strict=True))
    positions = sorted(range(len(triples)), key=triples.__getitem__)
    ordered = list(map(triples.__getitem__, positions))
    if any(map(operator.eq, ordered, islice(ordered, 1, None))):
        return None
    return np.array(positions, dtype=np.int64), None


# ----------------------------------------------------------------------------- reference
# Entry by entry, as the format was first written: what the column-wise path falls back on.


def listed_entries(entries: Iterable[Any], reference: Callable[[list[Any]], Any]) -> list[Any]:
    """``entries`` as a list; when iterating them fails, the entries before the failure go
    through ``reference`` first, so that a problem among them is named as it was found
    entry by entry."""
    listed: list[Any] = []
    try:
        listed.extend(entries)
    except Exception:
        reference(listed)
        raise
    return listed


def encoded_entries(
    codecs: dict[str, tuple[str, TypeSerializer]],
    states: Mapping[str, StateInfo],
    entries: Iterable[tuple[int, str, Any, Any]],
) -> Iterator[RawEntry]:
    """The reference encoding of ``entries``, one by one, naming the first that fails."""
    for key_group, name, key, value in entries:
        codec = codecs.get(name)
        if codec is None:
            raise unknown_state(name, states)
        if value is DELETED:
            yield key_group, name, encode_key(key), None
            continue
        kind, serializer = codec
        try:
            data = encode_value(kind, serializer, value)
        except Exception as err:
            raise ConfigurationError(
                f"the value of key {key!r} of keyed state {name!r} cannot be written with "
                f"serializer {serializer.name!r}: {err!r}"
            ) from err
        yield key_group, name, encode_key(key), data


def reference_body(
    states: Mapping[str, StateInfo],
    names: list[str],
    raw_entries: Iterable[tuple[int, str, bytes, bytes | None]],
    key_group_range: KeyGroupRange,
    max_parallelism: int,
    changelog: bool,
) -> Body:
    """The reference encoding of the body, entry by entry, naming the first problem."""
    index = {name: i for i, name in enumerate(names)}
    start, end = key_group_range.start, key_group_range.end
    # Step 1: bucket the entries by key group.
    groups: dict[int, list[list[Any]]] = {}
    for key_group, name, key, value in raw_entries:
        state_index = index.get(name)
        if state_index is None:
            raise unknown_state(name, states)
        if not start <= key_group <= end:
            raise KeyGroupOutOfRangeError(
                f"keyed state {name!r} holds key {key_repr(key)} of key group {key_group}, "
                f"outside the key group range {key_group_range} of the snapshot "
                f"(max_parallelism {max_parallelism})"
            )
        if value is None and not changelog:
            raise ConfigurationError(
                f"keyed state {name!r} has a deleted entry (key {key_repr(key)}) in a full "
                "snapshot: tombstones are only allowed in changelogs (changelog=True)"
            )
        entry = [state_index, bytes(key), None if value is None else bytes(value)]
        groups.setdefault(key_group, []).append(entry)
    # Step 2: one sorted block per key group; count entries and bytes per state.
    counts = [0] * len(names)
    sizes = [0] * len(names)
    blocks: list[bytes] = []
    table: list[list[int]] = []
    offset = 0
    for key_group in sorted(groups):
        block_entries = groups[key_group]
        block_entries.sort(key=lambda e: (e[0], e[1]))
        previous: tuple[int, bytes] | None = None
        for state_index, key, value in block_entries:
            if previous == (state_index, key):
                raise ConfigurationError(
                    f"keyed state {names[state_index]!r} has key {key_repr(key)} twice in "
                    f"key group {key_group} of one snapshot"
                )
            previous = (state_index, key)
            counts[state_index] += 1
            sizes[state_index] += len(key) + (0 if value is None else len(value))
        block = msgpack.packb(block_entries, use_bin_type=True)
        blocks.append(block)
        table.append([key_group, offset, len(block), len(block_entries)])
        offset += len(block)
    return blocks, table, counts, sizes


def unknown_state(name: str, states: Mapping[str, StateInfo]) -> ConfigurationError:
    known = ", ".join(sorted(states)) or "none"
    return ConfigurationError(
        f"an entry of keyed state {name!r}, not a state of the snapshot (its states: {known})"
    )


def key_repr(key: Any) -> str:
    """A key for a message: decoded when it is encode_key bytes that decode."""
    if isinstance(key, bytes | bytearray | memoryview):
        try:
            return repr(decode_key(bytes(key)))
        except Exception:
            return f"(encoded) {bytes(key)!r}"
    return repr(key)


# ----------------------------------------------------------------------------- decoding


def block_columns(
    block: memoryview, count: int, state_count: int, changelog: bool
) -> tuple[tuple[int, ...], tuple[bytes, ...], tuple[bytes | None, ...]] | None:
    """The state indices, keys and values of a block whose structure is right, else None
    (the reference code then names what is wrong)."""
    try:
        items = msgpack.unpackb(block, raw=False, use_list=False)
    except Exception:
        return None
    if type(items) is not tuple or len(items) != count or not items:
        return None
    if set(map(type, items)) != {tuple} or set(map(len, items)) != {3}:
        return None
    # Columns by itemgetter, not zip(*items): that makes an iterator per entry, for the collector.
    sis, keys, values = (tuple(map(itemgetter(i), items)) for i in range(3))
    if set(map(type, sis)) != {int} or min(sis) < 0 or max(sis) >= state_count:
        return None
    if set(map(type, keys)) != {bytes}:
        return None
    value_types = set(map(type, values))
    if not value_types <= {bytes, _NONE_TYPE} or (_NONE_TYPE in value_types and not changelog):
        return None
    if min(sis) == max(sis):
        ordered = all(map(operator.lt, keys, islice(keys, 1, None)))
    else:
        pairs = list(zip(sis, keys, strict=True))
        ordered = all(map(operator.lt, pairs, islice(pairs, 1, None)))
    return (sis, keys, values) if ordered else None


def decode_columns(
    sis: tuple[int, ...],
    keys: tuple[bytes, ...],
    values: tuple[bytes | None, ...],
    codecs: Sequence[tuple[str, str, TypeSerializer]],
) -> list[tuple[str, list[Any], list[Any]]] | None:
    """Per run of one state (``codecs[state index]`` is ``(name, kind, serializer)``): its
    name, decoded keys and values (``DELETED`` for a tombstone); None on any error."""
    runs: list[tuple[str, list[Any], list[Any]]] = []
    try:
        a = 0
        while a < len(sis):
            state = sis[a]
            b = bisect_left(sis, state + 1, a)
            name, kind, serializer = codecs[state]
            runs.append(
                (name, decode_keys(keys[a:b]), decode_values(kind, serializer, values[a:b]))
            )
            a = b
    except Exception:  # the reference path raises the error, naming the entry
        return None
    return runs
