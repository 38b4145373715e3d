"""Restoring the ``rocksdb`` keyed state backend from canonical and native state handles.

Used by :meth:`sparkpoint.state.rocksdb.RocksDBKeyedStateBackend.restore`, which documents the
steps. A handle is *native* when its format (``format`` or ``fmt``, attribute or key) is
:data:`~sparkpoint.state.rocksdb_store.NATIVE_FORMAT`; its key group range is read from
``key_group_start`` and ``key_group_end`` when present, and always checked against the
metadata inside the downloaded database. Anything else is fetched as bytes and decoded as a
``hashmap`` checkpoint (:mod:`sparkpoint.state.changelog_delta`) or a canonical snapshot
(:mod:`sparkpoint.state.canonical`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rocksdict import WriteBatch

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state import canonical, changelog_delta
from sparkpoint.state.backend import StateInfo
from sparkpoint.state.canonical_codec import encoded_entries
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.state.restoring import full_check
from sparkpoint.state.rocksdb_snapshot import UploadRecord, database_files, shared_file_name
from sparkpoint.state.rocksdb_store import (
    NATIVE_FORMAT,
    DBMeta,
    copy_range,
    open_db,
    read_meta,
    state_prefix,
)
from sparkpoint.state.serializers import TypeSerializer, serializer_named
from sparkpoint.watermarks import merge_channel_watermarks

if TYPE_CHECKING:
    from sparkpoint.state.rocksdb import RocksDBKeyedStateBackend

_BATCH_BYTES = 8 << 20


def _field(handle: Any, name: str) -> Any:
    if isinstance(handle, dict):
        return handle.get(name)
    return getattr(handle, name, None)


@dataclass
class Source:
    """One state handle to restore from, with its position in the list (for messages)."""

    index: int
    handle: Any

    @property
    def native(self) -> bool:
        fmt = _field(self.handle, "format") or _field(self.handle, "fmt")
        return fmt == NATIVE_FORMAT

    @property
    def where(self) -> str:
        path = _field(self.handle, "path")
        return f"state handle {self.index}" + (f" ({path})" if path else "")

    @property
    def key_group_range(self) -> KeyGroupRange | None:
        start, end = _field(self.handle, "key_group_start"), _field(self.handle, "key_group_end")
        if isinstance(start, int) and isinstance(end, int) and 0 <= start <= end:
            return KeyGroupRange(start, end)
        return None


class _Restore:
    """The state of one restore: claimed key groups and the watermarks seen."""

    def __init__(self, max_parallelism: int, key_group_range: KeyGroupRange) -> None:
        self.max_parallelism = max_parallelism
        self.range = key_group_range
        self.owner: dict[int, int] = {}  # key group -> index of the full snapshot holding it
        self.full_watermarks: list[dict[int, int]] = []
        self.later_watermarks: dict[int, int] = {}  # from changelogs, in order

    def check_max_parallelism(self, source: Source, max_parallelism: int) -> None:
        if max_parallelism != self.max_parallelism:
            raise ConfigurationError(
                f"{source.where} was taken with max_parallelism {max_parallelism}; it cannot "
                f"be restored with max_parallelism {self.max_parallelism} (every key would "
                "change key group)"
            )

    def claim(self, source: Source, snapshot_range: KeyGroupRange) -> KeyGroupRange | None:
        """The key groups of ``snapshot_range`` in the new range (None: none), claimed for
        ``source``.

        Raises:
            CorruptSnapshotError: a key group already claimed by another full snapshot.
        """
        start = max(snapshot_range.start, self.range.start)
        end = min(snapshot_range.end, self.range.end)
        if start > end:
            return None
        for key_group in range(start, end + 1):
            previous = self.owner.setdefault(key_group, source.index)
            if previous != source.index:
                raise CorruptSnapshotError(
                    f"key group {key_group} is in state handles {previous} and {source.index}; "
                    "the snapshots of one checkpoint have disjoint key group ranges"
                )
        return KeyGroupRange(start, end)

    def watermarks(self) -> dict[int, int]:
        merged = merge_channel_watermarks(self.full_watermarks)
        merged.update(self.later_watermarks)
        return merged


def _register(backend: RocksDBKeyedStateBackend, infos: dict[str, StateInfo], where: str) -> None:
    """Register the states of a restored snapshot.

    Raises:
        CorruptSnapshotError: a state of the same name and another kind or serializer.
    """
    for info in infos.values():
        try:
            backend.register(info)
        except ConfigurationError as err:
            raise CorruptSnapshotError(f"{where}: {err}") from err


def _native_meta(path: str, source: Source) -> DBMeta:
    """The metadata of a downloaded native snapshot (opened read-only, then closed)."""
    db = open_db(path, read_only=True, what=f"the native snapshot of {source.where}")
    try:
        meta = read_meta(db, source.where)
    finally:
        db.close()
    if meta is None:
        raise CorruptSnapshotError(f"{source.where} is a RocksDB database without state metadata")
    return meta


def restore_into(
    sources: list[Source],
    make: Callable[[], RocksDBKeyedStateBackend],
    max_parallelism: int,
    key_group_range: KeyGroupRange,
    *,
    db_dir: str,
    fetch: Callable[[Any], bytes],
    fetch_native: Callable[[Any, str], None] | None,
    claim: bool,
) -> tuple[RocksDBKeyedStateBackend, dict[int, int], UploadRecord | None]:
    """The restored backend, its channel watermarks and its upload record (the steps are in
    :meth:`~sparkpoint.state.rocksdb.RocksDBKeyedStateBackend.restore`)."""
    if any(s.native for s in sources) and fetch_native is None:
        raise ConfigurationError(
            "restoring native RocksDB state handles needs fetch_native(handle, dest_dir)"
        )
    state = _Restore(max_parallelism, key_group_range)
    # Step 1: one native snapshot of exactly this range: its files are the database.
    if len(sources) == 1 and sources[0].native and sources[0].key_group_range == key_group_range:
        source = sources[0]
        os.makedirs(db_dir, exist_ok=True)
        assert fetch_native is not None
        fetch_native(source.handle, db_dir)
        meta = _native_meta(db_dir, source)
        state.check_max_parallelism(source, meta.max_parallelism)
        if meta.key_group_range != key_group_range:
            raise CorruptSnapshotError(
                f"{source.where} says key group range {key_group_range}; its database holds "
                f"{meta.key_group_range}"
            )
        backend = make()
        record = _claimed(source, db_dir) if claim else None
        return backend, dict(meta.watermarks), record
    # Step 2: copy the key groups of the range from every handle.
    backend = make()
    try:
        for source in sources:
            if source.native:
                assert fetch_native is not None
                _copy_native(backend, source, state, fetch_native)
            else:
                _copy_canonical(backend, source, state, fetch)
    except BaseException:
        backend.discard()
        raise
    # Step 3: the watermarks.
    return backend, state.watermarks(), None


def _claimed(source: Source, db_dir: str) -> UploadRecord:
    """The upload record of a claimed native snapshot: its shared files, by local name."""
    names = [n for n in database_files(db_dir) if n.endswith(".sst")]
    files = {}
    for ref in _field(source.handle, "shared") or ():
        name = shared_file_name(ref, names)
        if name is not None:
            files[name] = ref
    return UploadRecord(checkpoint_id=-1, files=files)


def _copy_native(
    backend: RocksDBKeyedStateBackend,
    source: Source,
    state: _Restore,
    fetch_native: Callable[[Any, str], None],
) -> None:
    holder = tempfile.mkdtemp(prefix=".restore-", dir=os.path.dirname(backend.db_dir))
    try:
        path = os.path.join(holder, "db")
        os.makedirs(path)
        fetch_native(source.handle, path)
        db = open_db(path, read_only=True, what=f"the native snapshot of {source.where}")
        try:
            meta = read_meta(db, source.where)
            if meta is None:
                raise CorruptSnapshotError(
                    f"{source.where} is a RocksDB database without state metadata"
                )
            state.check_max_parallelism(source, meta.max_parallelism)
            declared = source.key_group_range
            if declared is not None and declared != meta.key_group_range:
                raise CorruptSnapshotError(
                    f"{source.where} says key group range {declared}; its database holds "
                    f"{meta.key_group_range}"
                )
            _register(backend, meta.states, source.where)
            shared = state.claim(source, meta.key_group_range)
            if shared is not None:
                copy_range(db, backend.db, shared, source.where)
            state.full_watermarks.append(meta.watermarks)
        finally:
            db.close()
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def _copy_canonical(
    backend: RocksDBKeyedStateBackend,
    source: Source,
    state: _Restore,
    fetch: Callable[[Any], bytes],
) -> None:
    blob = fetch(source.handle)
    if changelog_delta.is_delta(blob):  # a hashmap checkpoint: its tables' columns
        _copy_columns(backend, source, state, changelog_delta.decode_delta(blob, source.where))
        return
    snapshot = canonical.decode_snapshot(blob, source.where)
    state.check_max_parallelism(source, snapshot.max_parallelism)
    _register(backend, snapshot.states, source.where)
    if snapshot.changelog:
        shared: KeyGroupRange | None = snapshot.key_group_range
        state.later_watermarks.update(snapshot.watermarks)
    else:
        shared = state.claim(source, snapshot.key_group_range)
        state.full_watermarks.append(snapshot.watermarks)
    if shared is not None:
        _write_raw(backend, snapshot.raw_entries(state.range))


def _copy_columns(
    backend: RocksDBKeyedStateBackend, source: Source, state: _Restore, snap: changelog_delta.Delta
) -> None:
    """The key groups of the new range from a ``hashmap`` checkpoint (columns format)."""
    full_check(snap.full, source.where)
    state.check_max_parallelism(source, snap.max_parallelism)
    _register(backend, snap.states, source.where)
    shared = state.claim(source, snap.key_group_range)
    state.full_watermarks.append(snap.watermarks)
    if shared is not None:
        codecs: dict[str, tuple[str, TypeSerializer]] = {
            n: (i.kind, serializer_named(i.serializer)) for n, i in snap.states.items()
        }
        _write_raw(backend, encoded_entries(codecs, snap.states, snap.entries(shared)))


def _write_raw(
    backend: RocksDBKeyedStateBackend, entries: Iterable[tuple[int, str, bytes, bytes | None]]
) -> None:
    """Write encoded ``(key group, state, key, value)`` entries (None deletes) in batches."""
    prefixes: dict[str, bytes] = {}
    batch, size = WriteBatch(raw_mode=True), 0
    for key_group, name, key, value in entries:
        prefix = prefixes.get(name)
        if prefix is None:
            prefix = prefixes[name] = state_prefix(name)
        db_key = key_group.to_bytes(2, "big") + prefix + key
        if value is None:
            batch.delete(db_key)
        else:
            batch.put(db_key, value)
            size += len(value)
        size += len(db_key)
        if size >= _BATCH_BYTES:
            backend.db.write(batch)
            batch, size = WriteBatch(raw_mode=True), 0
    backend.db.write(batch)
