"""Writing a file atomically and deleting a path, as checkpoint storage does on its filesystem.

Chosen once per storage (:func:`file_ops_for`): an object store puts a file in one request (a
put is atomic, a reader never sees part of it); another fsspec filesystem writes under a
temporary name and renames it; a local directory does the same through ``os`` directly, as
fsspec's local calls cost 1.3-1.5x the calls they wrap (the control plane writes a
``_metadata`` and deletes a subsumed checkpoint per completion: 223 against 151 us for the
write, 398 against 297 us for the delete, on a 2-core machine).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import shutil
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem

from sparkpoint.errors import naming_file

log = logging.getLogger(__name__)


class FileOps:
    """Through an fsspec filesystem: a temporary name, then a rename (atomic on local and
    HDFS filesystems)."""

    def __init__(self, fs: fsspec.AbstractFileSystem) -> None:
        self.fs = fs

    def write_atomically(self, path: str, raw: bytes) -> None:
        """Write ``raw`` under a temporary name beside ``path``, then rename it to ``path``."""
        temp = f"{path}.tmp-{uuid.uuid4().hex}"
        self._write(temp, raw)
        try:
            self._rename(temp, path)
        except BaseException:
            self.remove_quietly(temp)
            raise

    def remove_quietly(self, path: str, recursive: bool = False) -> None:
        """Delete ``path`` (a directory only when ``recursive``); gone already is fine."""
        with contextlib.suppress(FileNotFoundError):
            self._remove(path, recursive)

    def remove_or_log(self, path: str, what: str, recursive: bool = False) -> bool:
        """:meth:`remove_quietly`, logging a failure (``what`` left at ``path``) instead of
        raising it: garbage left, never wrong state, and nothing fails for it. Whether it
        went."""
        try:
            self.remove_quietly(path, recursive)
        except OSError as err:
            log.warning("%s left at %s: %s", what, path, err)
            return False
        return True

    def _write(self, path: str, raw: bytes) -> None:
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, raw)

    def _rename(self, source: str, target: str) -> None:
        self.fs.mv(source, target)

    def _remove(self, path: str, recursive: bool) -> None:
        self.fs.rm(path, recursive=recursive)


class ObjectStoreOps(FileOps):
    """An object store: one put of the whole file."""

    def write_atomically(self, path: str, raw: bytes) -> None:
        self.fs.pipe_file(path, raw)


class LocalOps(FileOps):
    """A local directory, through ``os`` (the paths are the filesystem's, protocol stripped)."""

    def _write(self, path: str, raw: bytes) -> None:
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        with naming_file(path), open(path, "wb") as out:
            out.write(raw)

    def _rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def _remove(self, path: str, recursive: bool) -> None:
        if not os.path.isdir(path):
            os.remove(path)
        elif recursive:
            _remove_tree(path)
        else:  # as fsspec's local rm says it
            raise ValueError("Cannot delete directory, set recursive=True")


def write_local_atomically(path: str, data: bytes) -> None:
    """Write a file of a subtask's working state in its local directory: a temporary name,
    then a rename, as :class:`LocalOps` writes checkpoint files, with a fixed temporary name
    (one writer per subtask directory) and without a storage object on the epoch's path.

    Raises:
        OSError: naming the file, also where the system's error does not (a full disk's
            ``[Errno 28] No space left on device`` names none, and the operator must know
            that it is the local directory, not checkpoint storage, that filled up). The
            temporary file is removed, giving back what it took.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    try:
        with naming_file(tmp), open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


#: Times a local tree is deleted again when a file came or went meanwhile.
TREE_ATTEMPTS = 5


def _remove_tree(path: str) -> None:
    """``shutil.rmtree``, again when another thread or process wrote into the tree while it
    was deleted (a task still uploading its part of a checkpoint that failed and is being
    discarded: ``ENOTEMPTY``) or deleted from it (``ENOENT``); the last attempt's error is
    raised. Gone already is done."""
    for attempt in range(TREE_ATTEMPTS):
        try:
            shutil.rmtree(path)
            return
        except OSError as err:
            if not os.path.lexists(path):
                return
            if err.errno not in (errno.ENOTEMPTY, errno.ENOENT) or attempt == TREE_ATTEMPTS - 1:
                raise


def file_ops_for(fs: fsspec.AbstractFileSystem, object_store: bool) -> FileOps:
    """The :class:`FileOps` of ``fs``."""
    if object_store:
        return ObjectStoreOps(fs)
    if isinstance(fs, LocalFileSystem):
        return LocalOps(fs)
    return FileOps(fs)
