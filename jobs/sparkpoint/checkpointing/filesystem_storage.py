"""Filesystem checkpoint storage: state files and ``_metadata`` under any fsspec URL.

Flink's ``FileSystemCheckpointStorage``. The base directory may be ``file://``, a plain local
path, ``s3://``, ``hdfs://``, ``memory://`` in tests... Layout: ``<base>/<job-id>/chk-<n>/<name>``
for state and ``<base>/<job-id>/chk-<n>/_metadata`` for a completed checkpoint's metadata;
``<base>/<job-id>/shared/`` is reserved for incremental state; ``<base>/<job-id>/working/``
holds the durable copies of working state between epochs. The storage is shipped to Spark
executors: it holds plain strings and creates its fsspec filesystem lazily.
"""

from __future__ import annotations

import contextlib
import posixpath
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec
from fsspec.core import split_protocol

from sparkpoint.checkpointing.storage_base import (
    CheckpointStorage,
    check_checkpoint_id,
    check_segment,
    decode_metadata,
    encode_metadata,
    state_handle,
    verify_state,
)
from sparkpoint.errors import CheckpointNotFoundError, CorruptSnapshotError, StorageLocationError
from sparkpoint.protocol import StateHandleModel
from sparkpoint.state.key_groups import KeyGroupRange

METADATA_FILE = "_metadata"
SHARED_DIR = "shared"
WORKING_DIR = "working"
_CHECKPOINT_PREFIX = "chk-"


class FileSystemCheckpointStorage(CheckpointStorage):
    """State files and metadata under a base directory given as an fsspec URL.

    Args:
        base_url: ``file:///tmp/x``, ``/tmp/x``, ``s3://bucket/x``, ``memory://x``... A relative
            local path is made absolute here, so that executors see the same directory.
        storage_options: keyword arguments for the fsspec filesystem (plain values only).

    Raises:
        StorageLocationError: when ``base_url`` is empty or its protocol is unknown to fsspec.
    """

    def __init__(self, base_url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(base_url, str) or not base_url.strip():
            raise StorageLocationError(f"checkpoint storage needs a base URL, got {base_url!r}")
        protocol, _ = split_protocol(base_url)
        try:
            fs_class = fsspec.get_filesystem_class(protocol or "file")
        except (ValueError, ImportError) as err:
            raise StorageLocationError(
                f"cannot use checkpoint directory {base_url}: {err}"
            ) from err
        protocols = fs_class.protocol
        self._protocols: tuple[str, ...] = (
            (protocols,) if isinstance(protocols, str) else tuple(protocols)
        )
        self._root: str = posixpath.normpath(fs_class._strip_protocol(base_url)).rstrip("/")
        if self._root == ".":
            self._root = ""
        self._storage_options: dict[str, Any] = dict(storage_options or {})
        self._fs: fsspec.AbstractFileSystem | None = None  # created on first use, not pickled

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}

    def __repr__(self) -> str:
        return f"FileSystemCheckpointStorage({self.base_url!r})"

    @property
    def base_url(self) -> str:
        """The canonical URL of the base directory."""
        return self._url(self._root or "/")

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            self._fs = fsspec.filesystem(self._protocols[0], **self._storage_options)
        return self._fs

    def _url(self, path: str) -> str:
        return f"{self._protocols[0]}://{path}"

    # ------------------------------------------------------------------------- layout

    def _job_dir(self, job_id: str) -> str:
        check_segment(job_id, "job id", forbid_glob=True)
        return f"{self._root}/{job_id}"

    def _checkpoint_dir(self, job_id: str, checkpoint_id: int) -> str:
        return f"{self._job_dir(job_id)}/{_CHECKPOINT_PREFIX}{check_checkpoint_id(checkpoint_id)}"

    def checkpoint_path(self, job_id: str, checkpoint_id: int) -> str:
        return self._url(self._checkpoint_dir(job_id, checkpoint_id))

    def shared_path(self, job_id: str) -> str:
        """The directory reserved for state shared between checkpoints (incremental)."""
        return self._url(f"{self._job_dir(job_id)}/{SHARED_DIR}")

    def _inside_base(self, url: str) -> str:
        """The filesystem path of ``url`` if it lies under the base directory."""
        protocol, _ = split_protocol(url)
        if protocol is not None and protocol not in self._protocols:
            raise StorageLocationError(
                f"state file {url} is not on this checkpoint storage ({self.base_url})"
            )
        path = posixpath.normpath(self.fs._strip_protocol(url))
        if not path.startswith(self._root + "/"):
            raise StorageLocationError(
                f"state file {url} lies outside the checkpoint directory {self.base_url}"
            )
        return path

    # ------------------------------------------------------------------------- state

    def write_state(
        self,
        job_id: str,
        checkpoint_id: int,
        name: str,
        data: bytes,
        *,
        key_group_range: KeyGroupRange | None = None,
    ) -> StateHandleModel:
        check_segment(name, "state name", reserved_prefix="_")
        data = bytes(data)
        directory = self._checkpoint_dir(job_id, checkpoint_id)
        path = f"{directory}/{name}"
        self.fs.makedirs(directory, exist_ok=True)
        self.fs.pipe_file(path, data)
        return state_handle(data, key_group_range, path=self._url(path))

    def _read_file(self, handle: StateHandleModel) -> bytes:
        assert handle.path is not None
        path = self._inside_base(handle.path)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError as err:
            raise CorruptSnapshotError(
                f"state file {handle.path} is missing (expected {handle.size} bytes, "
                f"{handle.checksum})"
            ) from err
        verify_state(data, handle, f"state file {handle.path}")
        return bytes(data)

    # ------------------------------------------------------------------------- working state

    def write_working_state(self, job_id: str, name: str, tag: str, data: bytes) -> str:
        """Write the durable copy of a subtask's working state; returns its URL.

        Layout ``<base>/<job-id>/working/<name>/<tag>.state``: a subtask that lands on an
        executor without the local copy reads this one instead of failing the epoch.
        """
        check_segment(name, "working state name")
        check_segment(tag, "working state version")
        directory = f"{self._job_dir(job_id)}/{WORKING_DIR}/{name}"
        self.fs.makedirs(directory, exist_ok=True)
        path = f"{directory}/{tag}.state"
        self.fs.pipe_file(path, bytes(data))
        return self._url(path)

    def read_working_state(self, url: str) -> bytes | None:
        """The bytes of a durable working-state copy, or None when it is not there."""
        try:
            return bytes(self.fs.cat_file(self._inside_base(url)))
        except FileNotFoundError:
            return None

    def discard_working_state(self, job_id: str, urls: Iterable[str] | None = None) -> None:
        """Delete durable working-state copies: the given ones, or all of the job's."""
        if urls is None:
            self._remove_quietly(f"{self._job_dir(job_id)}/{WORKING_DIR}", recursive=True)
            return
        for url in urls:
            self._remove_quietly(self._inside_base(url))

    # ------------------------------------------------------------------------- metadata

    def write_metadata(self, job_id: str, checkpoint_id: int, metadata: Mapping[str, Any]) -> str:
        """Write ``_metadata`` of a checkpoint.

        1. encode the metadata as JSON;
        2. write it under a temporary name in the checkpoint's directory;
        3. rename it to ``_metadata`` (atomic on local and HDFS filesystems; on object
           stores the single upload of step 2 is what makes it all-or-nothing).
        """
        directory = self._checkpoint_dir(job_id, checkpoint_id)
        # Step 1: encode.
        raw = encode_metadata(metadata, job_id, checkpoint_id)
        # Step 2: temporary file.
        temp = f"{directory}/{METADATA_FILE}.tmp-{uuid.uuid4().hex}"
        self.fs.makedirs(directory, exist_ok=True)
        self.fs.pipe_file(temp, raw)
        # Step 3: rename.
        try:
            self.fs.mv(temp, f"{directory}/{METADATA_FILE}")
        except BaseException:
            self._remove_quietly(temp)
            raise
        return self._url(directory)

    def read_metadata(self, path: str) -> dict[str, Any]:
        protocol, _ = split_protocol(path)
        same_fs = (protocol or "file") in self._protocols
        fs, fs_path = fsspec.core.url_to_fs(path, **(self._storage_options if same_fs else {}))
        fs_path = fs_path.rstrip("/")
        if posixpath.basename(fs_path) != METADATA_FILE:
            fs_path = f"{fs_path}/{METADATA_FILE}"
        where = fs.unstrip_protocol(fs_path)
        try:
            raw = fs.cat_file(fs_path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as err:
            raise CheckpointNotFoundError(
                f"no checkpoint at {path}: {where} does not exist"
            ) from err
        return decode_metadata(raw, where)

    def read_checkpoint_metadata(self, job_id: str, checkpoint_id: int) -> dict[str, Any]:
        return self.read_metadata(self.checkpoint_path(job_id, checkpoint_id))

    # ------------------------------------------------------------------------- lifecycle

    def discard(self, job_id: str, checkpoint_id: int) -> None:
        self._remove_quietly(self._checkpoint_dir(job_id, checkpoint_id), recursive=True)

    def cleanup_incomplete(self, job_id: str, *, keep: Iterable[int] = ()) -> list[int]:
        kept = set(keep)
        removed = []
        for checkpoint_id, directory in self._checkpoint_dirs(job_id):
            if checkpoint_id in kept or self.fs.exists(f"{directory}/{METADATA_FILE}"):
                continue
            self._remove_quietly(directory, recursive=True)
            removed.append(checkpoint_id)
        return sorted(removed)

    def completed_checkpoint_ids(self, job_id: str) -> list[int]:
        return sorted(
            checkpoint_id
            for checkpoint_id, directory in self._checkpoint_dirs(job_id)
            if self.fs.exists(f"{directory}/{METADATA_FILE}")
        )

    def _checkpoint_dirs(self, job_id: str) -> list[tuple[int, str]]:
        """(id, path) of every ``chk-<n>`` directory of a job."""
        job_dir = self._job_dir(job_id)
        try:
            entries = self.fs.ls(job_dir, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            name = posixpath.basename(str(entry).rstrip("/"))
            suffix = name[len(_CHECKPOINT_PREFIX) :]
            if name.startswith(_CHECKPOINT_PREFIX) and suffix.isdigit() and int(suffix) >= 1:
                found.append((int(suffix), f"{job_dir}/{name}"))
        return found

    def _remove_quietly(self, path: str, recursive: bool = False) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(path, recursive=recursive)
