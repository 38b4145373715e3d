"""The keyed state backends by name (Flink's ``state.backend.type``): create, restore, reopen.

The runtime asks this module for a backend by the name the job chose (``--state-backend``) and
never names a concrete class. A restore accepts the snapshots of either backend: canonical
snapshots (savepoints, full checkpoints, the ``hashmap`` backend's) restore into both, and a
``rocksdb`` native snapshot restores into ``hashmap`` through an export of its entries.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any, Protocol

from sparkpoint.errors import ConfigurationError
from sparkpoint.protocol import StateHandleModel
from sparkpoint.state.backend import (
    KeyedStateBackend,
)
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.state.snapshot_contracts import (
    VersionStore,
)

BACKEND_NAMES = ("hashmap", "rocksdb")


class HandleReader(Protocol):
    """Reads snapshot handles (a checkpoint storage)."""

    def read_state(self, handle: StateHandleModel) -> bytes: ...

    def fetch_native(self, handle: StateHandleModel, dest_dir: str) -> None: ...


def _rocksdb() -> Any:
    from sparkpoint.state import rocksdb

    return rocksdb.RocksDBKeyedStateBackend


def backend_class(name: str) -> type[KeyedStateBackend]:
    """The backend class called ``name``.

    Raises:
        ConfigurationError: an unknown name.
    """
    if name == "hashmap":
        return HashMapKeyedStateBackend
    if name == "rocksdb":
        cls: type[KeyedStateBackend] = _rocksdb()
        return cls
    raise ConfigurationError(
        f"unknown state backend {name!r}; use one of {', '.join(BACKEND_NAMES)}"
    )


def db_dir(local_dir: str) -> str:
    """Where a subtask's live RocksDB lives under its local directory."""
    return os.path.join(local_dir, "db")


def create_backend(
    name: str, max_parallelism: int, key_group_range: KeyGroupRange, *, local_dir: str
) -> KeyedStateBackend:
    """An empty backend for a subtask whose local directory is ``local_dir``."""
    cls = backend_class(name)
    if name == "rocksdb":
        backend: KeyedStateBackend = cls(  # type: ignore[call-arg]
            max_parallelism, key_group_range, db_dir=db_dir(local_dir)
        )
        return backend
    return cls(max_parallelism, key_group_range)


def restore_backend(
    name: str,
    handles: Sequence[StateHandleModel],
    reader: HandleReader,
    max_parallelism: int,
    key_group_range: KeyGroupRange,
    *,
    local_dir: str,
    own: bool = False,
) -> KeyedStateBackend:
    """A backend for ``key_group_range`` holding those key groups of ``handles`` (the
    snapshots of every old subtask that overlap the range, in any format either backend
    writes). ``own``: the handles are a checkpoint of this job in its own storage, whose
    shared files the next incremental checkpoint may reference instead of uploading them.

    Raises:
        CorruptSnapshotError: a damaged or missing snapshot file (named).
        ConfigurationError: another max parallelism.
    """
    if name == "rocksdb":
        restored: KeyedStateBackend = _rocksdb().restore(
            list(handles),
            max_parallelism,
            key_group_range,
            db_dir=db_dir(local_dir),
            fetch=reader.read_state,
            fetch_native=reader.fetch_native,
            claim=own,
        )
        return restored
    # A reader may hand out its own handle objects (a test's in-memory blobs): canonical.
    if not any(getattr(h, "is_native", False) for h in handles):
        return HashMapKeyedStateBackend.restore(
            [reader.read_state(h) for h in handles], max_parallelism, key_group_range
        )
    # A rocksdb native snapshot into hashmap: restore it into a scratch RocksDB, export.
    scratch = tempfile.mkdtemp(prefix="restore-", dir=_ensure(local_dir))
    try:
        db = _rocksdb().restore(
            list(handles),
            max_parallelism,
            key_group_range,
            db_dir=os.path.join(scratch, "db"),
            fetch=reader.read_state,
            fetch_native=reader.fetch_native,
        )
        backend = HashMapKeyedStateBackend(max_parallelism, key_group_range)
        for info in db.state_infos.values():
            backend.register(info)
        backend.load(db.entries())
        backend.channel_watermarks = dict(db.channel_watermarks)
        backend.take_changes()
        db.close()
        return backend
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def open_version(
    name: str, store: VersionStore, tag: str, max_parallelism: int, key_group_range: KeyGroupRange
) -> KeyedStateBackend | None:
    """Working-state version ``tag`` of a subtask, None when neither this executor nor the
    durable copy has it."""
    return backend_class(name).open_version(store, tag, max_parallelism, key_group_range)


def _ensure(directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    return directory
