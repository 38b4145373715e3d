"""Working-state versions of the ``rocksdb`` backend on the executor's disk, and the process's
cache of live databases.

A version is a RocksDB native checkpoint in ``<local_dir>/versions/<tag>``: hard links to the
live database's SST files (immutable) and copies of its small metadata files, so saving one
costs what the epoch wrote, not the size of the state. A version is never opened for writing:
opening one clones it (hard links again) into a fresh ``<local_dir>/live/<id>`` directory.

:class:`LiveDatabases` keeps, per process, the live backend saved at the latest tag of each
local directory, so the next epoch in the same Python worker goes on with it without
reopening anything. Handing a backend out removes it from the cache: if that epoch fails, the
retry misses the cache, the handed-out backend (with writes beyond its version) is closed and
the version is opened from disk. So the cache never returns a database at another tag.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import shutil
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from rocksdict import Rdict

from sparkpoint.errors import ConfigurationError
from sparkpoint.state.rocksdb_snapshot import create_checkpoint

if TYPE_CHECKING:
    from sparkpoint.state.rocksdb import RocksDBKeyedStateBackend
    from sparkpoint.state.snapshot_contracts import (
        VersionStore,
    )

#: A temporary directory older than this is a dead process's leftover (in seconds).
STALE_TEMP_SECONDS = 6 * 3600
#: A live database directory nobody has open is only deleted once older than this (in
#: seconds): another worker may have just made it and not opened it yet.
LIVE_GRACE_SECONDS = 60
VERSIONS = "versions"
LIVE = "live"
RECORD_SUFFIX = ".uploads"  # versions/<tag>.uploads: the upload record after the version
CHANGELOG = "changelog"


def version_dir(local_dir: str, tag: str) -> str:
    """The directory of version ``tag`` under a subtask's local directory."""
    if not tag or "/" in tag or tag.startswith("."):
        raise ValueError(f"invalid working-state version tag {tag!r}")
    return os.path.join(local_dir, VERSIONS, tag)


def publish_version(db: Rdict, local_dir: str, tag: str) -> str:
    """Checkpoint ``db`` (flushed by the caller) as version ``tag``, replacing an older copy
    of that tag (a retried epoch's); its directory. The version appears atomically."""
    final = version_dir(local_dir, tag)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    path = create_checkpoint(db, os.path.dirname(final), f".{tag}.")
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(path, final)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return final


def _record_path(local_dir: str, tag: str) -> str:
    return version_dir(local_dir, tag) + RECORD_SUFFIX


def write_upload_record(local_dir: str, tag: str, record: Any) -> None:
    """Keep ``record`` (the SST files the latest native snapshot uploaded) beside version
    ``tag``: an upload that ends after the version was published still reaches the epoch that
    opens it. Best effort: without it the next snapshot uploads files again."""
    path = _record_path(local_dir, tag)
    with contextlib.suppress(OSError):
        with open(path + ".tmp", "wb") as fh:
            pickle.dump(record, fh, protocol=5)
        os.replace(path + ".tmp", path)


def read_upload_record(local_dir: str, tag: str) -> Any:
    """The record :func:`write_upload_record` kept beside version ``tag`` (None: none, or
    unreadable)."""
    try:
        with open(_record_path(local_dir, tag), "rb") as fh:
            return pickle.load(fh)
    except Exception:
        return None


def new_bytes(path: str, previous: str | None) -> int:
    """The bytes of the files in ``path`` that are not hard links of files in ``previous``."""
    known: set[tuple[int, int]] = set()
    if previous is not None and os.path.isdir(previous):
        for entry in os.scandir(previous):
            stat = entry.stat()
            known.add((stat.st_dev, stat.st_ino))
    total = 0
    for entry in os.scandir(path):
        stat = entry.stat()
        if (stat.st_dev, stat.st_ino) not in known:
            total += stat.st_size
    return total


def new_live_dir(local_dir: str) -> str:
    """The path of a new (absent) live database directory under ``local_dir``."""
    os.makedirs(os.path.join(local_dir, LIVE), exist_ok=True)
    return os.path.join(local_dir, LIVE, uuid.uuid4().hex)


def clone_version(path: str, local_dir: str) -> str:
    """A new live database directory holding version ``path``: SST files hard-linked (copied
    across file systems), the others copied (RocksDB appends to them); its path."""
    target = new_live_dir(local_dir)
    live_root = os.path.dirname(target)
    staging = tempfile.mkdtemp(prefix=".clone-", dir=live_root)
    try:
        for entry in os.scandir(path):
            destination = os.path.join(staging, entry.name)
            if entry.name.endswith(".sst"):
                try:
                    os.link(entry.path, destination)
                except OSError:  # another file system: copy
                    shutil.copy2(entry.path, destination)
            else:
                shutil.copy2(entry.path, destination)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _unlocked(db_dir: str) -> bool:
    """Whether no process holds the RocksDB lock of ``db_dir`` (never call it for a database
    this process has open: closing our descriptor would drop RocksDB's own lock)."""
    lock = os.path.join(db_dir, "LOCK")
    if not os.path.exists(lock):
        return True
    with open(lock, "a") as handle:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.lockf(handle, fcntl.LOCK_UN)
    return True


def prune(local_dir: str, keep: set[str], in_use: set[str]) -> None:
    """Delete the versions of ``local_dir`` other than ``keep``; live directories that
    neither this process (``in_use``) nor another one (RocksDB's lock) has open; and
    temporary directories (``.``-prefixed: snapshot checkpoints, restores, clones) that a
    dead process left, older than :data:`STALE_TEMP_SECONDS`."""
    versions = os.path.join(local_dir, VERSIONS)
    live = os.path.join(local_dir, LIVE)
    used = {os.path.realpath(p) for p in in_use}
    now = time.time()
    stale_before, live_before = now - STALE_TEMP_SECONDS, now - LIVE_GRACE_SECONDS
    for root in (local_dir, versions, live):
        if not os.path.isdir(root):
            continue
        for entry in os.scandir(root):
            if root == versions and entry.name.endswith((RECORD_SUFFIX, RECORD_SUFFIX + ".tmp")):
                if entry.name.split(RECORD_SUFFIX)[0] not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(entry.path)
                continue
            try:
                remove = _prunable(
                    entry, root, (versions, live), keep, used, (stale_before, live_before)
                )
            except FileNotFoundError:  # removed meanwhile (an upload thread's capture, ...)
                continue
            if remove:
                shutil.rmtree(entry.path, ignore_errors=True)


def _prunable(
    entry: os.DirEntry[str],
    root: str,
    dirs: tuple[str, str],
    keep: set[str],
    used: set[str],
    before: tuple[float, float],
) -> bool:
    """Whether :func:`prune` deletes ``entry`` (``dirs``: the versions and live directories;
    ``before``: the modification times under which temporary and live directories are
    stale). A live directory must be older than :data:`LIVE_GRACE_SECONDS`: another worker
    may have just made it and not opened it yet (RocksDB's lock comes with the open)."""
    versions, live = dirs
    if not entry.is_dir(follow_symlinks=False):
        return False
    if entry.name.startswith("."):
        return entry.stat().st_mtime < before[0]
    if root == versions:
        return entry.name not in keep
    if root == live:
        return (
            os.path.realpath(entry.path) not in used
            and entry.stat().st_mtime < before[1]
            and _unlocked(entry.path)
        )
    return False


class ChangelogStore:
    """The :class:`~sparkpoint.state.backend.VersionStore` of the durable changelog chain
    (:mod:`sparkpoint.state.changelog`): its local files in ``<local_dir>/changelog``, its
    durable ones through the subtask's store."""

    def __init__(self, store: VersionStore) -> None:
        self.store = store
        self.local_dir = os.path.join(store.local_dir, CHANGELOG)
        self.durable = store.durable
        self.durable_url: str | None = store.durable_url

    def write_durable(self, name: str, data: bytes) -> str | None:
        return self.store.write_durable(name, data)

    def read_durable(self, url: str) -> bytes | None:
        return self.store.read_durable(url)


class LiveDatabases:
    """The process-wide cache of live backends by (local directory, saved tag)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._saved: dict[tuple[str, str], RocksDBKeyedStateBackend] = {}
        self._known: dict[str, list[RocksDBKeyedStateBackend]] = {}  # local dir -> backends
        self._open: dict[str, RocksDBKeyedStateBackend] = {}  # real path of db_dir -> backend

    def remember(self, local_dir: str, tag: str, backend: RocksDBKeyedStateBackend) -> None:
        """``backend`` was just saved as version ``tag`` of ``local_dir``."""
        local_dir = os.path.realpath(local_dir)
        with self._lock:
            for key in [k for k, b in self._saved.items() if b is backend]:
                del self._saved[key]
            self._saved[(local_dir, tag)] = backend
            known = self._known.setdefault(local_dir, [])
            if not any(b is backend for b in known):
                known.append(backend)

    def take(self, local_dir: str, tag: str) -> RocksDBKeyedStateBackend | None:
        """The live backend saved at ``tag`` (then no longer cached), or None; on a miss every
        backend of ``local_dir`` in this process (saved at another tag, handed out to an
        epoch that did not save, or restored into a directory under it) is discarded."""
        local_dir = os.path.realpath(local_dir)
        with self._lock:
            backend = self._saved.pop((local_dir, tag), None)
            if backend is not None and not backend.closed:
                return backend
            stale = self._known.pop(local_dir, [])
            stale += [b for p, b in self._open.items() if p.startswith(local_dir + os.sep)]
            for key in [k for k in self._saved if k[0] == local_dir]:
                del self._saved[key]
        for other in stale:
            other.discard()
        return None

    def handed_out(self, local_dir: str, backend: RocksDBKeyedStateBackend) -> None:
        """``backend`` was opened from a version of ``local_dir`` for an epoch."""
        with self._lock:
            self._known.setdefault(os.path.realpath(local_dir), []).append(backend)

    def opened(self, backend: RocksDBKeyedStateBackend) -> None:
        """``backend`` opened its database."""
        with self._lock:
            self._open[os.path.realpath(backend.db_dir)] = backend

    def forget(self, backend: RocksDBKeyedStateBackend) -> None:
        """``backend`` was closed."""
        with self._lock:
            real = os.path.realpath(backend.db_dir)
            if self._open.get(real) is backend:
                del self._open[real]
            for key in [k for k, b in self._saved.items() if b is backend]:
                del self._saved[key]
            for known in self._known.values():
                known[:] = [b for b in known if b is not backend]

    def open_in(self, db_dir: str) -> RocksDBKeyedStateBackend | None:
        """This process's open backend whose database is in ``db_dir``, if any."""
        with self._lock:
            return self._open.get(os.path.realpath(db_dir))

    def open_dirs(self) -> set[str]:
        """The database directories this process has open (real paths)."""
        with self._lock:
            return set(self._open)


LIVE_DATABASES = LiveDatabases()


def remove_quietly(path: str) -> None:
    """Delete a directory tree, ignoring one that is already gone."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


_ROCKSDB_NAMES = ("CURRENT", "IDENTITY", "LOCK", "LOG", "MANIFEST-", "OPTIONS-", "rocksdict")


def clear_db_dir(path: str) -> None:
    """Empty a database directory before a new database is made in it.

    Raises:
        ConfigurationError: ``path`` holds files that are not a RocksDB database's (it is
            then left alone: the runtime gave a wrong directory).
    """
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return
    foreign = [
        n
        for n in names
        if not (n.startswith(_ROCKSDB_NAMES) or n.endswith((".sst", ".log", ".tmp")))
    ]
    if foreign:
        raise ConfigurationError(
            f"the state database directory {path} holds {', '.join(sorted(foreign)[:5])}, "
            "which are not RocksDB files; refusing to delete them"
        )
    remove_quietly(path)
