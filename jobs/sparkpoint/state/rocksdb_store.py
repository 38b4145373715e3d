"""How the ``rocksdb`` keyed state backend lays out state in RocksDB, and opens and reads it.

**Key layout.** One RocksDB instance holds every state of one keyed subtask. An entry's key is

``key group (2 bytes, big endian) + len(name) (1 byte) + name (UTF-8) + encode_key(key)``

and its value :func:`~sparkpoint.state.serializers.encode_value` of the value by the state's
kind and serializer, so the entries of a key group range are one contiguous run of keys (a
seek to the 2-byte prefix) that an export copies without decoding, and the entries of one
state in one key group are a run too. Keys starting with :data:`META_PREFIX` (``0xFFFF``,
above every key group since max parallelism is at most 32768) hold the backend's metadata:
the registered states, the channel watermarks, and the record of SST files uploaded by the
previous native snapshot (see :mod:`sparkpoint.state.rocksdb_snapshot`).

The write-back tables over this layout are in :mod:`sparkpoint.state.rocksdb_tables`.
"""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    DBCompactionStyle,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state.backend import StateInfo
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.state.serializers import serializer_named

#: Keys of the backend's metadata start with this (above every key group).
META_PREFIX = b"\xff\xff"
_META_KEY = META_PREFIX + b"meta"
_UPLOADED_KEY = META_PREFIX + b"uploaded"
#: The ``fmt`` of the handles of a native snapshot (RocksDB's own files).
NATIVE_FORMAT = "rocksdb-native-v1"
_BATCH_BYTES = 8 << 20  # a copy writes a WriteBatch per this many bytes
#: Size of one memtable (see :func:`db_options`).
DEFAULT_WRITE_BUFFER_BYTES = 4 << 20


# ----------------------------------------------------------------------------- key layout


def state_prefix(name: str) -> bytes:
    """The bytes that follow the key group in every key of state ``name``.

    Raises:
        ConfigurationError: a name longer than 255 bytes in UTF-8.
    """
    encoded = name.encode("utf-8")
    if len(encoded) > 255:
        raise ConfigurationError(
            f"keyed state name {name[:40]!r}... is {len(encoded)} bytes in UTF-8; the rocksdb "
            "state backend allows at most 255"
        )
    return bytes([len(encoded)]) + encoded


def split_db_key(db_key: bytes) -> tuple[int, str, bytes]:
    """``(key group, state name, encode_key bytes)`` of a key in the layout above.

    Raises:
        CorruptSnapshotError: a key too short for its declared state name.
    """
    if len(db_key) < 4 or len(db_key) < 3 + db_key[2]:
        raise CorruptSnapshotError(f"a RocksDB key {db_key[:40]!r} is not a keyed state key")
    end = 3 + db_key[2]
    return int.from_bytes(db_key[:2], "big"), db_key[3:end].decode("utf-8"), db_key[end:]


def successor(prefix: bytes) -> bytes:
    """The smallest key above every key that starts with ``prefix`` (not all 0xFF)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1])


# ----------------------------------------------------------------------------- opening


_CACHES: dict[int, Cache] = {}  # capacity -> the process's block cache of that capacity
_CACHES_LOCK = threading.Lock()


def block_cache(capacity: int) -> Cache:
    """The process's block cache of ``capacity`` bytes, shared by every database opened with
    that capacity (as Flink shares managed memory): several subtasks' databases in one
    Python worker stay within one cap."""
    with _CACHES_LOCK:
        cache = _CACHES.get(capacity)
        if cache is None:
            cache = _CACHES[capacity] = Cache(capacity)
        return cache


#: Memtables of a state database (one active, the rest flushing in the background).
MAX_WRITE_BUFFERS = 4
#: Sorted runs (L0 files and levels) before a universal compaction is considered.
SORTED_RUNS_TRIGGER = 10


def db_options(block_cache_bytes: int, write_buffer_bytes: int) -> Options:
    """RocksDB options of a state database: raw bytes, a capped block cache shared in the
    process (index and filter blocks charged to it too, so memory stays bounded however large
    the state is), at most :data:`MAX_WRITE_BUFFERS` memtables of ``write_buffer_bytes``.

    **Small memtables.** A snapshot's synchronous part flushes what the memtables hold. With
    memtables of a few MB, those an epoch fills are flushed in the background while it goes
    on, and the barrier finds at most one partly full memtable (plus any whose background
    flush has not ended), whatever the epoch wrote: measured at 1 GB with 1 % of the keys
    changed (10 MB) per checkpoint, on a loaded machine, the flush at the barrier took a
    median 45 ms with 4 MB memtables against 197 ms with one 16 MB memtable holding the epoch.

    **Universal compaction, merged in wide steps.** Keys are spread uniformly (the key group
    prefix is a hash), so with leveled compaction every L0 compaction of a state under a few
    hundred MB rewrites the whole base level, and the next incremental snapshot uploads all of
    it again (measured at 100 MB with 1 % of keys changed per snapshot: 11 MB per snapshot on
    average and 101 MB at worst, against 3.2 MB and 16 MB with universal compaction; random
    reads are ~20 % slower). Universal compaction starts only once there are
    :data:`SORTED_RUNS_TRIGGER` sorted runs: with RocksDB's default of 4, every checkpoint
    found one run over the limit, and the "fewer sorted runs" fallback merged the newest
    flush into the same growing run each time (uploaded: 10 MB more every checkpoint until a
    larger merge, median 41 MB and mean 75 MB per 10 MB changed at 1 GB); with 10 runs, runs
    of similar size are merged by size ratio, several at once, and most checkpoints upload
    only the epoch's flushed files (median 22 MB, mean 35 MB over 40 checkpoints). Point
    reads look in more runs (each behind its bloom filter). Versions between epochs (hard
    links) gain the same way."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(write_buffer_bytes)
    options.set_max_write_buffer_number(MAX_WRITE_BUFFERS)
    options.set_compaction_style(DBCompactionStyle.universal())
    options.set_level_zero_file_num_compaction_trigger(SORTED_RUNS_TRIGGER)
    options.set_level_zero_slowdown_writes_trigger(4 * SORTED_RUNS_TRIGGER)
    options.set_level_zero_stop_writes_trigger(6 * SORTED_RUNS_TRIGGER)
    table = BlockBasedOptions()
    table.set_block_cache(block_cache(block_cache_bytes))
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    options.set_keep_log_file_num(2)
    return options


def open_db(
    path: str,
    *,
    read_only: bool = False,
    block_cache_bytes: int = 8 << 20,
    write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES,
    what: str = "a RocksDB state database",
) -> Rdict:
    """Open the RocksDB database in ``path`` (writes skip the WAL: durability comes from
    versions and snapshots, which flush first).

    Raises:
        CorruptSnapshotError: (read-only) the files in ``path`` are not an openable database;
            the message names ``what`` and RocksDB's error, which names the damaged file.
    """
    options = db_options(block_cache_bytes, write_buffer_bytes)
    try:
        if read_only:
            options.create_if_missing(False)
            db = Rdict(path, options, access_type=AccessType.read_only(False))
        else:
            db = Rdict(path, options)
    except Exception as err:
        if read_only:
            raise CorruptSnapshotError(f"{what} in {path} cannot be opened: {err}") from err
        raise
    writes = WriteOptions()
    writes.disable_wal = True  # type: ignore[assignment, method-assign]
    db.set_write_options(writes)
    return db


def multi_get(db: Rdict, keys: list[bytes]) -> list[bytes | None]:
    """The values of ``keys`` (None where absent), in order.

    One point lookup per key: rocksdict's list form of ``get`` (a RocksDB multi-get) measured
    1.4-1.8x slower here than a lookup per key, on present and absent keys alike."""
    values: list[bytes | None] = list(map(db.get, keys))
    return values


#: A sorted batch of keys at least this share of the database's entries is read by one scan.
SCAN_SHARE = 0.25
#: Fewer keys than this are always looked up one by one.
SCAN_MIN_KEYS = 1024


def get_sorted(db: Rdict, keys: np.ndarray, listed: list[bytes]) -> list[bytes | None]:
    """The values of ``keys`` (None where absent), in order: distinct keys in key order, as
    a fixed-width ``S`` array none of whose elements ends in NUL, and as a list.

    A point lookup costs about 2 us here and a scan about a quarter of that per entry, so a
    batch that is at least :data:`SCAN_SHARE` of the database's entries (RocksDB's estimate)
    is read by one scan from its first key to its last and matched in numpy (a stored key
    that an ``S`` array cannot tell from another, one ending in NUL, sends it back to point
    lookups); a smaller one by :func:`multi_get`.
    """
    estimate = db.property_int_value("rocksdb.estimate-num-keys") or 0
    if len(listed) < max(SCAN_MIN_KEYS, SCAN_SHARE * estimate):
        return multi_get(db, listed)
    read = ReadOptions()
    read.set_iterate_upper_bound(listed[-1] + b"\x00")  # just past the last key
    stored_keys = cast(list[bytes], list(db.keys(from_key=listed[0], read_opt=read)))
    stored_values = cast(list[bytes], list(db.values(from_key=listed[0], read_opt=read)))
    stored = np.array(stored_keys, dtype=bytes)
    lengths = np.fromiter(map(len, stored_keys), dtype=np.int64, count=len(stored_keys))
    if (
        len(stored_values) != len(stored)
        or not len(stored)
        or not np.array_equal(np.strings.str_len(stored), lengths)
    ):
        return multi_get(db, listed)
    at = np.minimum(np.searchsorted(stored, keys), len(stored) - 1)
    hits = np.flatnonzero(stored[at] == keys)
    scanned = np.empty(len(stored_values), dtype=object)
    scanned[:] = stored_values
    values = np.full(len(listed), None, dtype=object)
    values[hits] = scanned[at[hits]]
    found: list[bytes | None] = values.tolist()
    return found


def iter_raw(db: Rdict, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The ``(key, value)`` entries of ``db`` with ``lower <= key < upper``, in key order."""
    read = ReadOptions()
    read.set_iterate_lower_bound(lower)
    read.set_iterate_upper_bound(upper)
    read.fill_cache(False)  # type: ignore[call-arg]  # an export must not evict working state
    iterator = db.iter(read)
    iterator.seek(lower)
    while iterator.valid():
        yield iterator.key(), iterator.value()
        iterator.next()
    iterator.status()  # raises when the iteration stopped on an error (a damaged file)


def raw_entries(
    db: Rdict, key_group_range: KeyGroupRange, where: str
) -> Iterator[tuple[int, str, bytes, bytes]]:
    """Every entry of ``key_group_range`` as ``(key group, state name, key bytes, value
    bytes)``, by key group, undecoded.

    Raises:
        CorruptSnapshotError: RocksDB reports damaged data (the message names ``where``).
    """
    lower = key_group_range.start.to_bytes(2, "big")
    upper = (key_group_range.end + 1).to_bytes(2, "big")
    try:
        for db_key, value in iter_raw(db, lower, upper):
            key_group, name, key = split_db_key(db_key)
            yield key_group, name, key, value
    except CorruptSnapshotError as err:
        raise CorruptSnapshotError(f"{where}: {err}") from err
    except Exception as err:
        raise CorruptSnapshotError(f"{where} cannot be read: {err}") from err


def copy_range(
    source: Rdict, target: Rdict, key_group_range: KeyGroupRange, where: str
) -> tuple[int, set[int]]:
    """Copy the entries of ``key_group_range`` from ``source`` into ``target`` as they are;
    ``(number of entries, key groups that had entries)``.

    Raises:
        CorruptSnapshotError: the source cannot be read (naming ``where``).
    """
    batch, size, count, groups = WriteBatch(raw_mode=True), 0, 0, set()
    lower = key_group_range.start.to_bytes(2, "big")
    upper = (key_group_range.end + 1).to_bytes(2, "big")
    try:
        for db_key, value in iter_raw(source, lower, upper):
            batch.put(db_key, value)
            groups.add(int.from_bytes(db_key[:2], "big"))
            size += len(db_key) + len(value)
            count += 1
            if size >= _BATCH_BYTES:
                target.write(batch)
                batch, size = WriteBatch(raw_mode=True), 0
    except Exception as err:
        raise CorruptSnapshotError(f"{where} cannot be read: {err}") from err
    target.write(batch)
    return count, groups


# ----------------------------------------------------------------------------- metadata


@dataclass
class DBMeta:
    """What a state database records about itself, outside the key group keyspace."""

    max_parallelism: int
    key_group_range: KeyGroupRange
    states: dict[str, StateInfo] = field(default_factory=dict)
    watermarks: dict[int, int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "max_parallelism": self.max_parallelism,
                "key_group_range": [self.key_group_range.start, self.key_group_range.end],
                "states": {n: [i.kind, i.serializer] for n, i in sorted(self.states.items())},
                "watermarks": [[c, w] for c, w in sorted(self.watermarks.items())],
            },
            separators=(",", ":"),
        ).encode()


def read_meta(db: Rdict, where: str) -> DBMeta | None:
    """The metadata of ``db`` (None for a database without: a new one).

    Raises:
        CorruptSnapshotError: metadata that does not parse (naming ``where``).
    """
    data = db.get(_META_KEY)
    if data is None:
        return None
    try:
        doc = json.loads(data)
        start, end = doc["key_group_range"]
        states = {}
        for name, (kind, serializer) in doc["states"].items():
            if kind not in ("value", "list", "map"):
                raise ValueError(f"state {name!r} has unknown kind {kind!r}")
            serializer_named(serializer, f"{where}, state {name!r},")
            states[name] = StateInfo(name, kind, serializer)
        return DBMeta(
            max_parallelism=int(doc["max_parallelism"]),
            key_group_range=KeyGroupRange(int(start), int(end)),
            states=states,
            watermarks={int(c): int(w) for c, w in doc["watermarks"]},
        )
    except CorruptSnapshotError:
        raise
    except Exception as err:
        raise CorruptSnapshotError(f"{where} has unreadable state metadata: {err!r}") from err


def write_meta(db: Rdict, meta: DBMeta, uploaded: Any = None) -> None:
    """Write ``meta`` and the record of uploaded SST files (pickled; None removes it)."""
    batch = WriteBatch(raw_mode=True)
    batch.put(_META_KEY, meta.to_bytes())
    if uploaded is None:
        batch.delete(_UPLOADED_KEY)
    else:
        batch.put(_UPLOADED_KEY, pickle.dumps(uploaded, protocol=5))
    db.write(batch)


def read_uploaded(db: Rdict) -> Any:
    """The record :func:`write_meta` stored (None when there is none or it is unreadable:
    the next native snapshot then uploads every file, which is always correct)."""
    data = db.get(_UPLOADED_KEY)
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:
        return None
