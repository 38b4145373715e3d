"""Snapshots of the ``rocksdb`` keyed state backend: the captured checkpoint and its upload.

The synchronous part of a snapshot makes a RocksDB native checkpoint: a directory of hard links
to the database's immutable SST files and copies of its small metadata files. The asynchronous
part, :meth:`RocksDBSnapshotCapture.materialize`, reads only that directory, never the live
database, and either

- exports the entries in the canonical format (:mod:`sparkpoint.state.canonical`), copying
  the stored key and value bytes without decoding them, or
- uploads the files themselves (:data:`~sparkpoint.state.rocksdb_store.NATIVE_FORMAT`): SST
  files are immutable, so in an incremental checkpoint those the previous native snapshot of
  this subtask uploaded are passed as ``reused`` references instead of being uploaded again.

**The upload record** (:class:`UploadRecord`): SST file name -> the shared reference that the
storage returned for it, from the previous native snapshot. A reference is matched to its
file by its ``name`` attribute (or key), else by the last component of its ``path``; a
reference whose ``size`` differs from the local file's is not reused.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rocksdict import Checkpoint, Rdict

from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state import canonical
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.state.rocksdb_store import NATIVE_FORMAT, open_db, raw_entries, read_meta
from sparkpoint.state.snapshot_contracts import (
    SnapshotCapture,
    SnapshotTarget,
)

if TYPE_CHECKING:
    from sparkpoint.protocol import StateHandleModel

_EXPORT_CACHE_BYTES = 8 << 20  # block cache of the read-only copy an export reads


@dataclass
class UploadRecord:
    """The SST files a native snapshot uploaded or reused: file name -> shared reference."""

    checkpoint_id: int
    files: dict[str, Any] = field(default_factory=dict)


def create_checkpoint(db: Rdict, parent_dir: str, prefix: str) -> str:
    """A RocksDB native checkpoint of ``db`` in a new directory under ``parent_dir`` (which
    must be on the database's file system, for hard links); its path.

    The caller deletes ``os.path.dirname(path)`` when done.
    """
    holder = tempfile.mkdtemp(prefix=prefix, dir=parent_dir)
    path = os.path.join(holder, "db")
    try:
        Checkpoint(db).create_checkpoint(path)
    except BaseException:
        shutil.rmtree(holder, ignore_errors=True)
        raise
    return path


def database_files(path: str) -> dict[str, str]:
    """The files of a checkpoint directory: name -> path (lock and info logs excluded)."""
    files = {}
    for name in sorted(os.listdir(path)):
        if name == "LOCK" or name.startswith("LOG"):
            continue
        full = os.path.join(path, name)
        if os.path.isfile(full):
            files[name] = full
    return files


def sst_size(path: str) -> int:
    """The bytes of the SST files in a database directory (the state as stored)."""
    return sum(
        os.path.getsize(full) for name, full in database_files(path).items() if _is_sst(name)
    )


def _is_sst(name: str) -> bool:
    return name.endswith(".sst")


def _field(ref: Any, name: str) -> Any:
    if isinstance(ref, dict):
        return ref.get(name)
    return getattr(ref, name, None)


def shared_file_name(ref: Any, names: Iterable[str]) -> str | None:
    """The local file name (one of ``names``) that shared reference ``ref`` stands for."""
    candidates = set(names)
    name = _field(ref, "name")
    if isinstance(name, str) and name in candidates:
        return name
    path = _field(ref, "path")
    if isinstance(path, str):
        base = path.replace("\\", "/").rsplit("/", 1)[-1]
        if base in candidates:
            return base
        for candidate in candidates:  # a storage that prefixes names (uuid-000012.sst)
            if base.endswith(candidate) and not base[-len(candidate) - 1].isalnum():
                return candidate
    return None


def split_files(
    files: dict[str, str], record: UploadRecord | None, incremental: bool
) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """``(private, shared, reused)`` of a checkpoint's files: without ``incremental`` all are
    private; with it, SST files are shared, or reused (name -> reference) when ``record``
    has a reference of the same name and size."""
    private: dict[str, str] = {}
    shared: dict[str, str] = {}
    reused: dict[str, Any] = {}
    for name, path in files.items():
        if not (incremental and _is_sst(name)):
            private[name] = path
            continue
        ref = None if record is None else record.files.get(name)
        size = None if ref is None else _field(ref, "size")
        if ref is not None and (size is None or size == os.path.getsize(path)):
            reused[name] = ref
        else:
            shared[name] = path
    return private, shared, reused


class RocksDBSnapshotCapture(SnapshotCapture):
    """A native checkpoint of one subtask's database, waiting to be materialized.

    Args:
        checkpoint_id: the checkpoint.
        path: the checkpoint directory (its parent is deleted by :meth:`release`).
        native: upload the files (True) or export the canonical format (False).
        record: gives the current upload record (read when materializing).
        on_uploaded: receives the record of a native upload.
    """

    def __init__(
        self,
        checkpoint_id: int,
        path: str,
        *,
        native: bool,
        record: Callable[[], UploadRecord | None],
        on_uploaded: Callable[[UploadRecord], None],
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.path = path
        self.native = native
        self._record = record
        self._on_uploaded = on_uploaded
        self.state_size = sst_size(path)
        self.uploaded_bytes = 0  # what the last materialize wrote (files or blob)

    def __repr__(self) -> str:
        kind = "native" if self.native else "canonical"
        return f"RocksDBSnapshotCapture({self.checkpoint_id}, {kind}, {self.path!r})"

    def materialize(self, target: SnapshotTarget) -> list[StateHandleModel]:
        """Write the checkpoint's state for ``target`` (canonical export or native upload).

        Raises:
            CorruptSnapshotError: the checkpoint directory cannot be read.
        """
        if self.native:
            return [self._upload(target)]
        return [self._export(target)]

    def _export(self, target: SnapshotTarget) -> StateHandleModel:
        where = f"the RocksDB checkpoint of checkpoint {self.checkpoint_id} in {self.path}"
        db = open_db(self.path, read_only=True, block_cache_bytes=_EXPORT_CACHE_BYTES, what=where)
        try:
            meta = read_meta(db, where)
            if meta is None:
                raise CorruptSnapshotError(f"{where} has no state metadata")
            kg_range: KeyGroupRange = target.key_group_range
            blob = canonical.encode_snapshot_raw(
                meta.states,
                raw_entries(db, kg_range, where),
                max_parallelism=meta.max_parallelism,
                key_group_range=kg_range,
                watermarks=meta.watermarks,
                backend="rocksdb",
            )
        finally:
            db.close()
        self.uploaded_bytes = len(blob)
        return target.write(blob, fmt=canonical.FORMAT_ID)

    def _upload(self, target: SnapshotTarget) -> StateHandleModel:
        files = database_files(self.path)
        record = self._record()
        private, shared, reused = split_files(files, record, target.incremental)
        handle = target.write_native(private, shared, list(reused.values()), fmt=NATIVE_FORMAT)
        self.uploaded_bytes = sum(os.path.getsize(p) for p in [*private.values(), *shared.values()])
        if target.incremental:
            uploaded = dict(reused)
            for ref in _field(handle, "shared") or ():
                name = shared_file_name(ref, shared)
                if name is not None:
                    uploaded[name] = ref
            self._on_uploaded(UploadRecord(self.checkpoint_id, uploaded))
        return handle

    def release(self) -> None:
        """Delete the checkpoint directory."""
        shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)
