"""The write-back tables of the ``rocksdb`` keyed state backend: a dict cache over RocksDB.

:class:`RocksDBStateTable` implements the :class:`~sparkpoint.state.backend.StateTable`
protocol for one state: every key read is loaded into the cache and counts as changed (the
caller may mutate the value in place), writes go to the cache, and
:meth:`RocksDBStateTable.flush` writes the dirty entries in one ``WriteBatch`` (the key layout is
in :mod:`sparkpoint.state.rocksdb_store`) and empties the cache, or keeps it clean for a
snapshot. :meth:`RocksDBStateTable.put_many`, the vectorized
operators' write, goes through to RocksDB at once and leaves its values cached *clean*, so a
snapshot's synchronous part has only what was read key by key left to write;
:meth:`RocksDBStateTable.add_many` (a count or sum of an ``int64``/``float64`` state) reads,
adds and writes through in numpy, with no Python value per key. A value handed
out stays the cache's until the next call on the same table, which may flush the cache when
it holds more than ``cache_entries`` keys: mutate a value before touching the table again.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from itertools import repeat
from typing import Any

import numpy as np
from rocksdict import Rdict, WriteBatch

from sparkpoint.records import DictColumn
from sparkpoint.state.backend import DELETED, StateInfo, key_outside_range
from sparkpoint.state.column_codec import (
    ascii_strings,
    encode_keys,
    encode_values,
    tagged_str_keys,
)
from sparkpoint.state.key_groups import KeyGroupRange, key_groups_of, stable_hash
from sparkpoint.state.rocksdb_store import (
    get_sorted,
    iter_raw,
    multi_get,
    state_prefix,
    successor,
)
from sparkpoint.state.serializers import (
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    serializer_named,
)
from sparkpoint.state.slot_table import refused_value

DEFAULT_CACHE_ENTRIES = 100_000
# Value states whose serializer writes a fixed-width number (little endian), as numpy reads it.
_NUMBERS = {"int64": np.dtype("<i8"), "float64": np.dtype("<f8")}
#: put_many writes a batch per this many bytes of keys and values.
WRITE_BATCH_BYTES = 1 << 20

_NOT_FOUND: Any = object()  # cached: the key has no entry in RocksDB (nothing to write)
_ABSENT: Any = object()  # cached: the entry was removed (a delete to write)
_UNCACHED: Any = object()


class RocksDBStateTable:
    """The :class:`~sparkpoint.state.backend.StateTable` of one state: a write-back cache
    over RocksDB (see the module docstring).

    Args:
        db: the subtask's database.
        info: the state.
        max_parallelism: the number of key groups.
        key_group_range: the backend's key groups; a key of another one is refused.
        cache_entries: the cache is flushed before an access when it holds more keys.
    """

    def __init__(
        self,
        db: Rdict,
        info: StateInfo,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
    ) -> None:
        self._db = db
        self.info = info
        self._kind = info.kind
        self._serializer = serializer_named(info.serializer, f"keyed state {info.name!r}")
        self._prefix = state_prefix(info.name)
        self._max_parallelism = max_parallelism
        self._range = key_group_range
        self._limit = cache_entries
        self._cache: dict[Any, Any] = {}  # key -> value, _ABSENT or _NOT_FOUND
        self._db_keys: dict[Any, bytes] = {}  # key -> its RocksDB key, for cached keys
        self._clean: set[Any] = set()  # cached keys whose value RocksDB has (put_many)
        self.touched: set[Any] = set()  # keys read or written since take_touched()
        # False while no durable changelog will ask for the touched keys (a single machine):
        # a batch of a million keys then costs no set of them.
        self.track_touched = True
        self._heads: list[bytes] | None = None  # key group -> its RocksDB key prefix

    def __repr__(self) -> str:
        return f"RocksDBStateTable({self.info.name!r}, cached={len(self._cache)})"

    # ------------------------------------------------------------------------- keys

    def db_key(self, key: Any) -> bytes:
        """The RocksDB key of ``key`` in this state.

        Raises:
            KeyGroupOutOfRangeError: the key's key group is not in the backend's range.
        """
        key_group = stable_hash(key) % self._max_parallelism
        if not self._range.start <= key_group <= self._range.end:
            raise key_outside_range(
                key, key_group, self._range, self._max_parallelism, self.info.name
            )
        return key_group.to_bytes(2, "big") + self._prefix + encode_key(key)

    def db_keys_of(self, keys: list[Any]) -> list[bytes]:
        """:meth:`db_key` of every key of ``keys``, at once (key groups hashed in numpy, str
        keys encoded in one pass).

        Raises:
            KeyGroupOutOfRangeError: for the first key whose key group is not in the range.
        """
        if not keys:
            return []
        array = np.fromiter(keys, dtype=object, count=len(keys))
        groups = self._checked_groups(keys, key_groups_of(array, self._max_parallelism))
        head_of = map(self._key_group_heads().__getitem__, groups.tolist())
        return list(map(bytes.__add__, head_of, encode_keys(keys)))

    def _db_key_array(self, keys: list[Any], array: np.ndarray | None = None) -> np.ndarray | None:
        """:meth:`db_keys_of` of ASCII str keys as one fixed-width bytes array (no element
        ends in NUL, so each is its key's bytes); None for other keys. ``array``: the keys
        as a ``U`` array already.

        Raises:
            KeyGroupOutOfRangeError: as :meth:`db_keys_of`.
        """
        strings = ascii_strings(keys, array)
        if strings is None:
            return None
        # The keys are distinct: hashed one by one as a DictColumn's values, with no sort.
        distinct = DictColumn._of(np.arange(len(keys)), strings)
        groups = self._checked_groups(keys, key_groups_of(distinct, self._max_parallelism))
        heads = np.frombuffer(b"".join(self._key_group_heads()), dtype=np.uint8)
        heads = heads.reshape(len(self._key_group_heads()), -1)
        encoded = tagged_str_keys(strings)
        rows = np.concatenate(
            [heads[groups], encoded.view(np.uint8).reshape(len(keys), -1)], axis=1
        )
        return rows.view(f"S{rows.shape[1]}").reshape(-1)

    def _checked_groups(self, keys: list[Any], groups: np.ndarray) -> np.ndarray:
        """The key groups of ``keys`` as offsets into the backend's range.

        Raises:
            KeyGroupOutOfRangeError: for the first key whose key group is not in the range.
        """
        start, end = self._range.start, self._range.end
        outside = np.flatnonzero((groups < start) | (groups > end))
        if len(outside):
            first = int(outside[0])
            raise key_outside_range(
                keys[first], int(groups[first]), self._range, self._max_parallelism, self.info.name
            )
        return groups - start

    def _key_group_heads(self) -> list[bytes]:
        """The prefix of each key group of the range (its 2 bytes and the state's)."""
        if self._heads is None:
            start, end = self._range.start, self._range.end
            self._heads = [g.to_bytes(2, "big") + self._prefix for g in range(start, end + 1)]
        return self._heads

    def _db_keys_cached(self, keys: list[Any]) -> list[bytes]:
        """:meth:`db_keys_of`, taking the RocksDB keys of cached keys from the cache."""
        known: list[Any] = list(map(self._db_keys.get, keys))
        unknown = [i for i, db_key in enumerate(known) if db_key is None]
        computed = self.db_keys_of([keys[i] for i in unknown])
        for i, db_key in zip(unknown, computed, strict=True):
            known[i] = db_key
        return known

    def decode(self, data: bytes) -> Any:
        """A stored value of this state, decoded."""
        return decode_value(self._kind, self._serializer, data)

    def _load(self, key: Any) -> Any:
        """The cached value of ``key``, loading it (counts as touched)."""
        value = self._cache.get(key, _UNCACHED)
        if value is _UNCACHED:
            db_key = self.db_key(key)
            data = self._db.get(db_key)
            value = _NOT_FOUND if data is None else self.decode(data)
            self._cache[key] = value
            self._db_keys[key] = db_key
        else:
            self._clean.discard(key)  # handed out: it may be mutated in place
        if self.track_touched:
            self.touched.add(key)
        return value

    def _maybe_flush(self) -> None:
        if len(self._cache) > self._limit:
            self.flush()

    # ------------------------------------------------------------------------- dict API

    def get(self, key: Any, default: Any = None) -> Any:
        self._maybe_flush()
        value = self._load(key)
        return default if value is _NOT_FOUND or value is _ABSENT else value

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, _UNCACHED)
        if value is _UNCACHED:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return self.get(key, _UNCACHED) is not _UNCACHED

    def __setitem__(self, key: Any, value: Any) -> None:
        self._maybe_flush()
        if key not in self._db_keys:
            self._db_keys[key] = self.db_key(key)
        self._cache[key] = _ABSENT if value is None else value
        self._clean.discard(key)
        if self.track_touched:
            self.touched.add(key)

    def __delitem__(self, key: Any) -> None:
        if self.get(key, _UNCACHED) is _UNCACHED:
            raise KeyError(key)
        self._cache[key] = _ABSENT

    def pop(self, key: Any, default: Any = None) -> Any:
        value = self.get(key, _UNCACHED)
        if value is _UNCACHED:
            return default
        self._cache[key] = _ABSENT
        return value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        value = self.get(key, _UNCACHED)
        if value is _UNCACHED:
            self[key] = default
            return default
        return value

    def get_many(self, keys: list[Any], default: Any) -> list[Any]:
        """The value of every key of ``keys`` (``default`` where absent), in order; the
        uncached keys are read with one multi-get."""
        self._maybe_flush()
        cache = self._cache
        missing = [key for key in dict.fromkeys(keys) if key not in cache]
        if missing:
            db_keys = self.db_keys_of(missing)
            stored = multi_get(self._db, db_keys)
            for key, db_key, data in zip(missing, db_keys, stored, strict=True):
                cache[key] = _NOT_FOUND if data is None else self.decode(data)
                self._db_keys[key] = db_key
        if self.track_touched:
            self.touched.update(keys)
        if self._clean:
            self._clean.difference_update(keys)
        values = [cache[key] for key in keys]
        return [default if v is _NOT_FOUND or v is _ABSENT else v for v in values]

    def put_many(self, keys: list[Any], values: list[Any]) -> None:
        """Set ``keys[i]`` to ``values[i]`` for every i: written to RocksDB now, in batches of
        about :data:`WRITE_BATCH_BYTES` (RocksDB switches to a new memtable between batches, so
        full ones are flushed in the background while the rest is encoded), and cached clean
        (a later read hands the value out and makes it dirty again). Every key is checked and
        every value encoded before anything is written."""
        if len(keys) != len(values):
            raise ValueError(
                f"put_many on keyed state {self.info.name!r}: {len(keys)} keys, "
                f"{len(values)} values"
            )
        self._maybe_flush()
        db_keys, cache = self._db_keys, self._cache
        kind, serializer = self._kind, self._serializer
        encoded_keys = self._db_keys_cached(keys)
        if any(map(operator.is_, values, repeat(None))):
            datas = [None if v is None else encode_value(kind, serializer, v) for v in values]
        else:
            datas = encode_values(kind, serializer, values)
        batch, size = WriteBatch(raw_mode=True), 0
        for key, db_key, value, data in zip(keys, encoded_keys, values, datas, strict=True):
            db_keys[key] = db_key
            if data is None:
                batch.delete(db_key)
                cache[key] = _NOT_FOUND
                size += len(db_key)
            else:
                batch.put(db_key, data)
                cache[key] = value
                size += len(db_key) + len(data)
            if size >= WRITE_BATCH_BYTES:
                self._db.write(batch)
                batch, size = WriteBatch(raw_mode=True), 0
        if size:
            self._db.write(batch)
        self._clean.update(keys)
        if self.track_touched:
            self.touched.update(keys)

    def add_many(
        self,
        keys: list[Any],
        deltas: np.ndarray,
        strings: np.ndarray | None = None,
        hashes: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """Add ``deltas[i]`` to the number of ``keys[i]`` (0 when absent), for distinct
        ``keys`` of an ``int64`` or ``float64`` value state: one read of the batch in key
        order (:func:`~sparkpoint.state.rocksdb_store.get_sorted`), the sums in numpy
        and the writes through to RocksDB as :meth:`put_many` does, with no Python value per
        key; the new values. A sum that leaves ``int64`` is refused (naming its key) before
        anything is written. None for any other state: the caller reads and writes.
        ``strings``: the keys as a ``U`` array, when they are str (not made again); ``hashes``
        (their hashes, for a table that finds keys by them) are not needed here."""
        dtype = _NUMBERS.get(self.info.serializer) if self._kind == "value" else None
        if dtype is None or not keys:
            return None
        self.flush()  # what was cached key by key is RocksDB's before the read
        # Read and written in key order where the keys allow: RocksDB finds neighbours faster.
        fixed = self._db_key_array(keys, strings)
        order = None if fixed is None else _bytewise_order(fixed)
        if fixed is None:
            db_keys = self.db_keys_of(keys)
            stored = multi_get(self._db, db_keys)
        else:
            in_order = fixed[order]
            db_keys = in_order.tolist()
            stored = get_sorted(self._db, in_order, db_keys)
        base = self._numbers(stored, dtype)
        if order is not None:
            base[order] = base.copy()
        totals = base + deltas.astype(dtype, copy=False)
        if dtype.kind == "i":
            wrapped = np.flatnonzero(((base ^ totals) & (deltas ^ totals)) < 0)
            if len(wrapped):
                first = int(wrapped[0])
                value = int(base[first]) + int(deltas[first])
                raise refused_value(self.info.name, self.info.serializer, keys[first], value)
        width = dtype.itemsize
        # Each number's bytes (little-endian, as the serializer writes them); a void view
        # keeps trailing zero bytes, which a bytes ("S") view would drop.
        written = np.ascontiguousarray(totals if order is None else totals[order], dtype=dtype)
        values = written.view(f"V{width}").tolist()
        step = max(1, WRITE_BATCH_BYTES // (len(db_keys[0]) + width))
        for a in range(0, len(keys), step):
            batch = WriteBatch(raw_mode=True)
            for _ in map(batch.put, db_keys[a : a + step], values[a : a + step]):
                pass
            self._db.write(batch)
        if self.track_touched:
            self.touched.update(keys)
        return totals

    def _numbers(self, stored: list[bytes | None], dtype: np.dtype[Any]) -> np.ndarray:
        """The stored numbers (0 where absent): decoded at once when every one has the
        serializer's width, else one by one (a damaged value raises its own error)."""
        present = np.fromiter(
            map(operator.is_not, stored, repeat(None)), dtype=bool, count=len(stored)
        )
        found = [data for data in stored if data is not None]
        joined = b"".join(found)
        numbers = np.zeros(len(stored), dtype=dtype)
        if len(joined) == len(found) * dtype.itemsize:
            numbers[present] = np.frombuffer(joined, dtype=dtype)
        else:
            numbers[present] = [self.decode(data) for data in found]
        return numbers

    def __len__(self) -> int:
        """The number of keys with a value (flushes, then counts in RocksDB)."""
        self.flush()
        return sum(1 for _ in self._raw_items())

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, value)`` of this state (flushes first). The values are copies:
        mutating one changes nothing, write it back with ``table[key] = value``."""
        self.flush()
        for key, data in self._raw_items():
            yield decode_key(key), self.decode(data)

    def _raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        for key_group in self._range:
            lower = key_group.to_bytes(2, "big") + self._prefix
            for db_key, data in iter_raw(self._db, lower, successor(lower)):
                yield db_key[len(lower) :], data

    # ------------------------------------------------------------------------- write-back

    def flush(self, *, evict: bool = True) -> int:
        """Write every dirty cached entry to RocksDB in one batch; the number of puts and
        deletes written. With ``evict`` the cache is emptied; without, it keeps every entry,
        clean (a snapshot's synchronous part: nothing to do for the entries ``put_many`` wrote
        through, however many)."""
        if not self._cache:
            return 0
        cache, clean = self._cache, self._clean
        written = 0
        if len(clean) < len(cache):  # some entry is dirty or known absent
            batch = WriteBatch(raw_mode=True)
            kind, serializer, db_keys = self._kind, self._serializer, self._db_keys
            dirty = []
            for key, value in cache.items():
                if value is _NOT_FOUND or key in clean:
                    continue
                dirty.append(key)
                if value is _ABSENT:
                    batch.delete(db_keys[key])
                else:
                    batch.put(db_keys[key], encode_value(kind, serializer, value))
            written = len(batch)
            if written:
                self._db.write(batch)
            if not evict:
                for key in dirty:
                    if cache[key] is _ABSENT:
                        cache[key] = _NOT_FOUND
                    else:
                        clean.add(key)
        if evict:
            cache.clear()
            self._db_keys.clear()
            clean.clear()
        return written

    def current_values(self, keys: set[Any]) -> dict[Any, Any]:
        """Each key's value in RocksDB (after a :meth:`flush`), ``DELETED`` where absent."""
        ordered = list(keys)
        stored = multi_get(self._db, [self.db_key(key) for key in ordered])
        return {
            key: DELETED if data is None else self.decode(data)
            for key, data in zip(ordered, stored, strict=True)
        }

    def take_touched(self) -> set[Any]:
        """The keys read or written since the last call (then forgotten)."""
        touched, self.touched = self.touched, set()
        return touched


def _bytewise_order(fixed: np.ndarray) -> np.ndarray:
    """The permutation that sorts a fixed-width bytes array as RocksDB orders keys (bytewise;
    no element ends in NUL, so the NUL padding orders a prefix first, as RocksDB does):
    a numeric sort of its big-endian 8-byte words, faster than comparing strings."""
    width = fixed.dtype.itemsize
    padded = np.zeros((len(fixed), width + -width % 8), dtype=np.uint8)
    padded[:, :width] = fixed.view(np.uint8).reshape(len(fixed), width)
    words = padded.view(">u8").astype(np.uint64)
    return np.lexsort(words.T[::-1])
