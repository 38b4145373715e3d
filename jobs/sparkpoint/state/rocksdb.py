"""The ``rocksdb`` keyed state backend: state in an embedded RocksDB, larger than memory.

Flink's ``EmbeddedRocksDBStateBackend``. Each keyed subtask keeps its state in one RocksDB
instance under a directory the runtime gives (the executor's local disk); a capped block cache
bounds the memory whatever the size of the state. Reads and writes go through a write-back
cache per state (:mod:`sparkpoint.state.rocksdb_tables`; the key layout is documented in
:mod:`sparkpoint.state.rocksdb_store`), so operators may mutate the values they read in place,
as with the ``hashmap`` backend.

- **Snapshots** (:mod:`sparkpoint.state.rocksdb_snapshot`): the synchronous part is a RocksDB
  native checkpoint (hard links); the asynchronous part exports it in the canonical format or
  uploads its files, incrementally when the target asks.
- **Restore** (:meth:`RocksDBKeyedStateBackend.restore`) takes canonical and native handles of
  any old parallelism with the same max parallelism.
- **Working state between epochs** (:mod:`sparkpoint.state.rocksdb_versions`): versions are
  native checkpoints on the executor's disk; the live database stays open in the Python worker
  between epochs. On clusters each version also writes the epoch's changes durably in the
  changelog chain format the ``hashmap`` backend uses (:mod:`sparkpoint.state.changelog`), from
  which another executor rebuilds the version.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state import changelog
from sparkpoint.state.backend import (
    ChangeSet,
    KeyedStateBackend,
    StateInfo,
    StateTable,
)
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.state.rocksdb_restore import Source, restore_into
from sparkpoint.state.rocksdb_snapshot import (
    RocksDBSnapshotCapture,
    UploadRecord,
    create_checkpoint,
)
from sparkpoint.state.rocksdb_store import (
    DEFAULT_WRITE_BUFFER_BYTES,
    DBMeta,
    open_db,
    raw_entries,
    read_meta,
    read_uploaded,
    state_prefix,
    write_meta,
)
from sparkpoint.state.rocksdb_tables import DEFAULT_CACHE_ENTRIES, RocksDBStateTable
from sparkpoint.state.rocksdb_versions import (
    LIVE_DATABASES,
    ChangelogStore,
    clear_db_dir,
    clone_version,
    new_bytes,
    new_live_dir,
    prune,
    publish_version,
    read_upload_record,
    remove_quietly,
    version_dir,
    write_upload_record,
)
from sparkpoint.state.serializers import decode_key
from sparkpoint.state.snapshot_contracts import (
    SavedVersion,
    VersionStore,
)

__all__ = ["RocksDBKeyedStateBackend"]

_EXACT_COUNT_BELOW = 10_000  # num_keys() counts exactly when RocksDB estimates fewer keys


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one subtask in a RocksDB database in ``db_dir``.

    Args:
        max_parallelism: the operator's max parallelism (number of key groups).
        key_group_range: the key groups this subtask owns.
        db_dir: the database's directory. Whatever it holds is deleted: the backend starts
            empty (an open backend of this process in it is discarded first), unless
            ``reopen``.
        block_cache_bytes: capacity of RocksDB's block cache (data, index and filter blocks),
            shared by the databases of this process opened with the same capacity.
        write_buffer_bytes: size of one memtable (see
            :func:`~sparkpoint.state.rocksdb_store.db_options`).
        cache_entries: per state, the write-back cache is flushed above this many keys.
        reopen: open the database in ``db_dir`` with its states and watermarks (a clone of a
            version, a downloaded native snapshot) instead of starting empty.

    Raises:
        ConfigurationError: the range does not fit in ``[0, max_parallelism)``, or (reopen)
            ``db_dir`` holds the database of another max parallelism or key group range, or
            another backend of this process has it open.
    """

    name = "rocksdb"

    def __init__(
        self,
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        db_dir: str,
        block_cache_bytes: int = 64 << 20,
        write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        reopen: bool = False,
    ) -> None:
        super().__init__(max_parallelism, key_group_range)
        self.db_dir = os.path.abspath(db_dir)
        self.closed = False
        self._cache_entries = cache_entries
        self._tables: dict[str, RocksDBStateTable] = {}
        self._uploaded: UploadRecord | None = None
        self._written: tuple[bytes, UploadRecord | None] | None = None  # last meta written
        self._owns_dir = False  # open_version's clones are deleted on close
        self._record_lock = threading.Lock()  # the upload record against save_version
        self._published: tuple[str, str] | None = None  # (local dir, tag) saved last
        self._publishes = 0  # versions saved by this backend
        stale = LIVE_DATABASES.open_in(self.db_dir)
        if reopen and stale is not None:
            raise ConfigurationError(
                f"the state database in {self.db_dir} is open in another backend of this "
                "process; close it first"
            )
        if not reopen:
            if stale is not None:  # an earlier attempt's backend in this process
                stale.discard()
            clear_db_dir(self.db_dir)
        os.makedirs(self.db_dir, exist_ok=True)
        self._db = open_db(
            self.db_dir, block_cache_bytes=block_cache_bytes, write_buffer_bytes=write_buffer_bytes
        )
        try:
            self._load_meta()
        except BaseException:
            self._db.close()
            raise
        LIVE_DATABASES.opened(self)

    def _load_meta(self) -> None:
        meta = read_meta(self._db, f"the state database in {self.db_dir}")
        if meta is None:
            return
        if (meta.max_parallelism, meta.key_group_range) != (
            self._max_parallelism,
            self._key_group_range,
        ):
            raise ConfigurationError(
                f"the state database in {self.db_dir} holds key group range "
                f"{meta.key_group_range} of max_parallelism {meta.max_parallelism}; it cannot "
                f"be opened as key group range {self._key_group_range} of max_parallelism "
                f"{self._max_parallelism}"
            )
        for info in meta.states.values():
            self.register(info)
        self.channel_watermarks = dict(meta.watermarks)
        record = read_uploaded(self._db)
        self._uploaded = record if isinstance(record, UploadRecord) else None
        self._written = (meta.to_bytes(), self._uploaded)

    # ------------------------------------------------------------------------- tables

    def register(self, info: StateInfo) -> StateTable:
        """Register state ``info`` (see :meth:`KeyedStateBackend.register`).

        Raises:
            ConfigurationError: as there, or a name longer than 255 bytes in UTF-8 (checked
                before anything is registered).
        """
        state_prefix(info.name)
        return super().register(info)

    def _create_table(self, info: StateInfo) -> None:
        self._tables[info.name] = RocksDBStateTable(
            self._db, info, self._max_parallelism, self._key_group_range, self._cache_entries
        )

    def _table(self, name: str) -> StateTable:
        return self._tables[name]

    def flush(self) -> None:
        """Write every state's dirty cached entries and the metadata (states, watermarks,
        upload record) to RocksDB; the caches keep their entries, clean."""
        for table in self._tables.values():
            table.flush(evict=False)
        meta = DBMeta(
            self._max_parallelism, self._key_group_range, self._infos, self.channel_watermarks
        )
        state = (meta.to_bytes(), self._uploaded)
        last = self._written
        if last is None or state[0] != last[0] or state[1] is not last[1]:
            write_meta(self._db, meta, self._uploaded)
            self._written = state

    # ------------------------------------------------------------------------- sizes

    def num_keys(self) -> int:
        """How many distinct keys have some state: exact while RocksDB estimates fewer than
        10,000 entries, above that RocksDB's estimate of the number of entries, which counts a
        key once per state that holds it (and is approximate after deletes)."""
        self.flush()
        estimate = self._db.property_int_value("rocksdb.estimate-num-keys") or 0
        if estimate >= _EXACT_COUNT_BELOW:
            return max(0, estimate - 2)  # the metadata keys
        keys: set[tuple[int, bytes]] = set()
        for key_group, _, key, _ in raw_entries(self._db, self._key_group_range, self.db_dir):
            keys.add((key_group, key))
        return len(keys)

    def state_size(self) -> int:
        """Bytes of the SST files plus the memtables (RocksDB's properties: cheap)."""
        sst = self._db.property_int_value("rocksdb.total-sst-files-size") or 0
        memtables = self._db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        return sst + memtables

    # ------------------------------------------------------------------------- export

    def entries(self) -> Iterator[tuple[int, str, Any, Any]]:
        """Every entry as ``(key group, state name, key, value)``, by key group (flushes
        first; reads an implicit snapshot of the database)."""
        self.flush()
        where = f"the state database in {self.db_dir}"
        for key_group, name, key, data in raw_entries(self._db, self._key_group_range, where):
            table = self._tables.get(name)
            if table is None:
                raise CorruptSnapshotError(f"{where} holds entries of unregistered state {name!r}")
            yield key_group, name, decode_key(key), table.decode(data)

    # ------------------------------------------------------------------------- changes

    def take_changes(self) -> ChangeSet:
        """The entries read or written since the last call, with their current values
        (:data:`~sparkpoint.state.backend.DELETED` where absent)."""
        touched = {name: table.take_touched() for name, table in self._tables.items()}
        self.flush()
        changes: dict[str, Mapping[Any, Any]] = {
            name: self._tables[name].current_values(keys) for name, keys in touched.items() if keys
        }
        return ChangeSet(
            states=self.state_infos, changes=changes, watermarks=dict(self.channel_watermarks)
        )

    def forget_changes(self) -> None:
        """Forget the keys read or written so far without reading them (a version without
        a durable changelog has no use for their values)."""
        for table in self._tables.values():
            table.take_touched()

    # ------------------------------------------------------------------------- snapshots

    def snapshot(self, checkpoint_id: int, *, native: bool) -> RocksDBSnapshotCapture:
        """The synchronous part: a RocksDB native checkpoint of the state.

        1. write the dirty cache entries and the metadata to RocksDB;
        2. flush the memtables to SST files (those the epoch filled are flushed already);
        3. checkpoint the database (hard links) into a directory beside ``db_dir``.

        No write comes between the steps: the checkpoint holds exactly the pre-barrier writes.
        """
        # Step 1: caches and metadata.
        self.flush()
        # Step 2: memtables.
        self._db.flush()
        # Step 3: the checkpoint.
        path = create_checkpoint(
            self._db, os.path.dirname(self.db_dir), f".checkpoint-{checkpoint_id}-"
        )
        return RocksDBSnapshotCapture(
            checkpoint_id,
            path,
            native=native,
            record=lambda: self._uploaded,
            on_uploaded=functools.partial(self._record_upload, taken=self._publishes),
        )

    def _record_upload(self, record: UploadRecord, taken: int | None = None) -> None:
        """Keep the SST files a native snapshot uploaded (from the upload thread): in memory,
        in the metadata at the next flush, and beside the version saved last when that was
        published after the snapshot was taken (``taken``: the number of versions published
        then), since the upload may end after the epoch saved its version. Never beside an
        older version: an epoch retried from it must not reference files of the failed
        attempt, whose SST file numbers the retry reuses for other contents."""
        with self._record_lock:
            current = self._uploaded
            if current is not None and record.checkpoint_id < current.checkpoint_id:
                return
            self._uploaded = record
            if self._published is not None and taken is not None and self._publishes > taken:
                write_upload_record(*self._published, record)

    @classmethod
    def restore(
        cls,
        sources: list[Any],
        max_parallelism: int,
        key_group_range: KeyGroupRange,
        *,
        db_dir: str,
        fetch: Callable[[Any], bytes],
        fetch_native: Callable[[Any, str], None] | None = None,
        claim: bool = False,
        **options: Any,
    ) -> RocksDBKeyedStateBackend:
        """A backend in ``db_dir`` (deleted first) holding the state of ``key_group_range``
        in ``sources``: the state handles of every subtask of one snapshot (any old
        parallelism), canonical or native, optionally followed by canonical changelogs
        applied in order.

        1. a single native handle of exactly this key group range is downloaded into
           ``db_dir`` and opened (no copy);
        2. otherwise each handle in turn: a canonical one is decoded and the raw entries of
           the range are written (tombstones of changelogs delete); a native one is
           downloaded into a temporary directory beside ``db_dir``, opened read-only and the
           keys of the range are copied, then the directory is deleted;
        3. the channel watermarks are merged (per channel the minimum over the full
           snapshots; those of a changelog replace them);
        4. the record of uploaded SST files is reset, so the next incremental snapshot
           uploads every file, unless ``claim`` (the handles are this job's own latest
           checkpoint, Flink's restore mode CLAIM) and step 1 applied: then the restored
           files are referenced, not uploaded again.

        Args:
            sources: the state handles.
            max_parallelism: the operator's max parallelism.
            key_group_range: the key groups of the new subtask.
            db_dir: the new database's directory.
            fetch: ``fetch(handle) -> bytes`` of a canonical handle (checksum verified).
            fetch_native: ``fetch_native(handle, dest_dir)`` downloads a native handle's
                files into ``dest_dir`` (checksums verified); needed for native handles.
            claim: see step 4.
            options: passed to the constructor (``block_cache_bytes``...).

        Raises:
            CorruptSnapshotError: damaged input (naming the handle and file), a key group
                in two full snapshots, or states of conflicting kinds.
            ConfigurationError: a snapshot of another max parallelism, or a native handle
                without ``fetch_native``.
        """
        stale = LIVE_DATABASES.open_in(db_dir)
        if stale is not None:  # an earlier attempt's backend in this process
            stale.discard()
        clear_db_dir(db_dir)

        # Steps 1 to 3 (sparkpoint.state.rocksdb_restore).
        def make() -> RocksDBKeyedStateBackend:
            return cls(max_parallelism, key_group_range, db_dir=db_dir, reopen=True, **options)

        backend, watermarks, record = restore_into(
            [Source(i, handle) for i, handle in enumerate(sources)],
            make,
            max_parallelism,
            key_group_range,
            db_dir=db_dir,
            fetch=fetch,
            fetch_native=fetch_native,
            claim=claim,
        )
        backend.channel_watermarks = watermarks
        # Step 4: the upload record.
        backend._uploaded = record
        backend.flush()
        return backend

    @property
    def db(self) -> Any:
        """The open RocksDB database (for restore and tests)."""
        return self._db

    # ------------------------------------------------------------------------- versions

    def save_version(self, store: VersionStore, tag: str, previous: str | None) -> SavedVersion:
        """Write working-state version ``tag``.

        1. when the store keeps durable copies (clusters), write the epoch's changes through
           :func:`sparkpoint.state.changelog.save` (the chain format the ``hashmap`` backend
           uses: a delta, or now and then a full base), its local files in
           ``<local_dir>/changelog``; else just forget the changes, and track none in the
           next epochs of this backend (which save to the same storage);
        2. write the caches and metadata, flush the memtables and checkpoint the database
           into ``<local_dir>/versions/<tag>`` (hard links: the cost is the new SST files);
        3. keep this live backend in the process cache under ``(local_dir, tag)``.

        Returns:
            The bytes written (new local files and durable ones), the durable chain's URL and
            its files (None and none on a single machine).
        """
        # Step 1: the durable changelog (a full base when the keys were not tracked).
        if store.durable:
            untracked = not all(t.track_touched for t in self._tables.values())
            chained = None if untracked else previous
            durable = changelog.save(self, ChangelogStore(store), tag, chained)
        else:
            self.forget_changes()
            durable = SavedVersion(0)
        for table in self._tables.values():  # the next epochs save to the same storage
            table.track_touched = store.durable
        # Step 2: the local version (an upload record arrives before it or beside it).
        with self._record_lock:
            self.flush()
            self._db.flush()
            path = publish_version(self._db, store.local_dir, tag)
            self._published = (store.local_dir, tag)
            self._publishes += 1
        before = None if previous is None else version_dir(store.local_dir, previous)
        written = new_bytes(path, before) + durable.bytes_written
        # Step 3: the process cache.
        LIVE_DATABASES.remember(store.local_dir, tag, self)
        return SavedVersion(written, durable.durable_url, durable.durable_files)

    @classmethod
    def open_version(
        cls, store: VersionStore, tag: str, max_parallelism: int, key_group_range: KeyGroupRange
    ) -> RocksDBKeyedStateBackend | None:
        """Version ``tag``:

        1. this process's live backend, when it was the last saved at ``tag`` and was not
           handed out since (else every backend of ``local_dir`` here is discarded);
        2. else a clone of ``versions/<tag>`` on this executor's disk;
        3. else rebuilt from the durable changelog chain (another executor wrote it);
        4. else None.
        """
        # Step 1: the process cache.
        cached = LIVE_DATABASES.take(store.local_dir, tag)
        if cached is not None:
            if (cached.max_parallelism, cached.key_group_range) == (
                max_parallelism,
                key_group_range,
            ):
                return cached
            cached.discard()
        # Step 2: the local version.
        path = version_dir(store.local_dir, tag)
        local = os.path.isdir(path)
        live = clone_version(path, store.local_dir) if local else new_live_dir(store.local_dir)
        try:
            backend = cls(max_parallelism, key_group_range, db_dir=live, reopen=local)
        except BaseException:
            remove_quietly(live)
            raise
        backend._owns_dir = True
        LIVE_DATABASES.handed_out(store.local_dir, backend)
        if local:
            later = read_upload_record(store.local_dir, tag)
            if isinstance(later, UploadRecord):
                backend._record_upload(later)
            return backend
        # Step 3: the durable chain.
        chain_store = ChangelogStore(store)
        try:
            rebuilt = changelog.open_version(backend, chain_store, tag)
            if rebuilt is not None and rebuilt is not backend:  # one it kept: closed by now
                rebuilt = changelog.open_version(backend, chain_store, tag)
        except BaseException:
            backend.discard()
            raise
        if rebuilt is None:
            # Step 4: nowhere.
            backend.discard()
            return None
        return backend

    def prune_versions(self, store: VersionStore, keep: set[str]) -> None:
        """Delete local versions and changelog files other than ``keep``'s, and live
        directories that no process has open."""
        prune(store.local_dir, keep, LIVE_DATABASES.open_dirs())
        changelog.prune(ChangelogStore(store), keep)

    # ------------------------------------------------------------------------- closing

    def close(self) -> None:
        """Write the caches and close the database (a clone made by :meth:`open_version` is
        deleted: its version stays)."""
        if self.closed:
            return
        self.flush()
        self._close()

    def discard(self) -> None:
        """Close without writing the caches (an epoch's abandoned state)."""
        if not self.closed:
            self._close()

    def _close(self) -> None:
        self.closed = True
        LIVE_DATABASES.forget(self)
        self._db.close()
        if self._owns_dir:
            remove_quietly(self.db_dir)
