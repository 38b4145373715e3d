"""Checkpoint storage: where snapshot state and checkpoint metadata are written and read back.

Flink's ``CheckpointStorage``, with its two kinds:

- :class:`FileSystemCheckpointStorage`: state files and ``_metadata`` under any fsspec URL
  (``file://``, plain local paths, ``s3://``, ``hdfs://``, ``memory://`` in tests), laid out as
  ``<base>/<job-id>/chk-<n>/<name>`` and ``<base>/<job-id>/chk-<n>/_metadata``;
  ``<base>/<job-id>/shared/`` is reserved for incremental state.
- :class:`JobManagerCheckpointStorage`: state inline (base64) in its handle, so in the
  completed checkpoint's metadata, up to a size limit.

Every handle carries the state's size and SHA-256 checksum, and :meth:`CheckpointStorage.
read_state` verifies both. Storage objects are shipped to Spark executors: they hold plain
strings and ints and create their fsspec filesystem lazily.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import hashlib
import json
import posixpath
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec
from fsspec.core import split_protocol

from sparkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    CorruptSnapshotError,
    StorageLocationError,
)
from sparkpoint.protocol import StateHandleModel
from sparkpoint.state.key_groups import KeyGroupRange

METADATA_FILE = "_metadata"
SHARED_DIR = "shared"
_CHECKPOINT_PREFIX = "chk-"
_GLOB_CHARS = frozenset("*?[]")


class StateTooLargeError(CheckpointError):
    """A snapshot is above the inline size limit of jobmanager checkpoint storage."""


class CheckpointStorage(abc.ABC):
    """Writes and reads the state handles and the metadata of checkpoints."""

    @abc.abstractmethod
    def write_state(
        self,
        job_id: str,
        checkpoint_id: int,
        name: str,
        data: bytes,
        *,
        key_group_range: KeyGroupRange | None = None,
    ) -> StateHandleModel:
        """Store one piece of snapshot state and return its handle (size and checksum).

        Args:
            job_id: the job.
            checkpoint_id: the checkpoint (>= 1).
            name: the state's name within the checkpoint, unique per operator and subtask
                (for example ``"pv-0"``); not empty, no path separators, not starting with
                ``_`` (reserved for the storage's own files).
            data: the bytes.
            key_group_range: the key groups the state covers, recorded in the handle.
        """

    def read_state(self, handle: StateHandleModel) -> bytes:
        """The bytes of a handle, after checking their size and checksum.

        Raises:
            CorruptSnapshotError: missing, truncated or altered state (the message names the
                file, or ``inline state``, with the expected and actual size or checksum).
            StorageLocationError: a handle path outside this storage's base directory.
        """
        if handle.inline is not None:
            try:
                data = base64.b64decode(handle.inline, validate=True)
            except ValueError as err:
                raise CorruptSnapshotError(f"inline state is not valid base64: {err}") from err
            _verify(data, handle, "inline state")
            return data
        if handle.path is None:
            raise CorruptSnapshotError(
                f"state handle ({handle.size} bytes, {handle.checksum}) has neither a path nor "
                "inline bytes"
            )
        return self._read_file(handle)

    def _read_file(self, handle: StateHandleModel) -> bytes:
        raise CorruptSnapshotError(
            f"{type(self).__name__} cannot read state file {handle.path}: "
            "it keeps state inline and has no filesystem to read it from"
        )

    @abc.abstractmethod
    def write_metadata(
        self, job_id: str, checkpoint_id: int, metadata: Mapping[str, Any]
    ) -> str | None:
        """Write a completed checkpoint's ``_metadata`` (JSON) atomically.

        Returns:
            The checkpoint's external path (its ``chk-<n>`` directory), or None when the
            metadata is kept in memory.
        """

    @abc.abstractmethod
    def read_metadata(self, path: str) -> dict[str, Any]:
        """The metadata of the checkpoint at ``path`` (its directory or its ``_metadata`` file).

        Raises:
            CheckpointNotFoundError: no ``_metadata`` there.
            CorruptSnapshotError: ``_metadata`` is not a JSON object.
        """

    @abc.abstractmethod
    def read_checkpoint_metadata(self, job_id: str, checkpoint_id: int) -> dict[str, Any]:
        """The metadata of checkpoint ``checkpoint_id`` of ``job_id`` in this storage.

        Raises:
            CheckpointNotFoundError: the checkpoint has no metadata here.
        """

    @abc.abstractmethod
    def discard(self, job_id: str, checkpoint_id: int) -> None:
        """Delete everything of a checkpoint; nothing happens when it is already gone."""

    @abc.abstractmethod
    def cleanup_incomplete(self, job_id: str, *, keep: Iterable[int] = ()) -> list[int]:
        """Delete the checkpoints of ``job_id`` that have no ``_metadata``, except ``keep``.

        Returns:
            The ids of the deleted checkpoints, sorted.
        """

    @abc.abstractmethod
    def completed_checkpoint_ids(self, job_id: str) -> list[int]:
        """The ids of the checkpoints of ``job_id`` that have metadata, sorted."""

    @abc.abstractmethod
    def checkpoint_path(self, job_id: str, checkpoint_id: int) -> str | None:
        """The external path (``chk-<n>`` directory) of a checkpoint, or None when it has none."""


# ----------------------------------------------------------------------------- filesystem


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
        _check_segment(job_id, "job id", forbid_glob=True)
        return f"{self._root}/{job_id}"

    def _checkpoint_dir(self, job_id: str, checkpoint_id: int) -> str:
        return f"{self._job_dir(job_id)}/{_CHECKPOINT_PREFIX}{_check_checkpoint_id(checkpoint_id)}"

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
        _check_segment(name, "state name", reserved_prefix="_")
        data = bytes(data)
        directory = self._checkpoint_dir(job_id, checkpoint_id)
        path = f"{directory}/{name}"
        self.fs.makedirs(directory, exist_ok=True)
        self.fs.pipe_file(path, data)
        return _handle(data, key_group_range, path=self._url(path))

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
        _verify(data, handle, f"state file {handle.path}")
        return bytes(data)

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
        raw = _encode_metadata(metadata, job_id, checkpoint_id)
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
        return _decode_metadata(raw, where)

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


# ----------------------------------------------------------------------------- jobmanager


class JobManagerCheckpointStorage(CheckpointStorage):
    """State inline in its handle (base64), up to ``max_state_size`` bytes per handle.

    Args:
        max_state_size: the largest state one handle may carry inline, in bytes.
        metadata_url: where to write ``_metadata`` (same layout as
            :class:`FileSystemCheckpointStorage`); None keeps the metadata in this object.
    """

    def __init__(self, max_state_size: int = 1 << 20, metadata_url: str | None = None) -> None:
        if isinstance(max_state_size, bool) or not isinstance(max_state_size, int):
            raise ConfigurationError(
                f"max_state_size of jobmanager checkpoint storage must be an int, "
                f"got {max_state_size!r}"
            )
        if max_state_size < 0:
            raise ConfigurationError(
                f"max_state_size of jobmanager checkpoint storage must be >= 0, "
                f"got {max_state_size}"
            )
        self.max_state_size = max_state_size
        self.metadata_url = metadata_url
        self._files = FileSystemCheckpointStorage(metadata_url) if metadata_url else None
        self._metadata: dict[tuple[str, int], str] = {}  # (job id, checkpoint id) -> JSON

    def __repr__(self) -> str:
        return (
            f"JobManagerCheckpointStorage(max_state_size={self.max_state_size}, "
            f"metadata_url={self.metadata_url!r})"
        )

    def write_state(
        self,
        job_id: str,
        checkpoint_id: int,
        name: str,
        data: bytes,
        *,
        key_group_range: KeyGroupRange | None = None,
    ) -> StateHandleModel:
        _check_segment(job_id, "job id", forbid_glob=True)
        _check_segment(name, "state name", reserved_prefix="_")
        checkpoint_id = _check_checkpoint_id(checkpoint_id)
        data = bytes(data)
        if len(data) > self.max_state_size:
            raise StateTooLargeError(
                f"state of {name} for checkpoint {checkpoint_id} is {_format_size(len(data))}, "
                f"above the {_format_size(self.max_state_size)} limit of jobmanager checkpoint "
                "storage; use --checkpoint-storage filesystem"
            )
        inline = base64.b64encode(data).decode("ascii")
        return _handle(data, key_group_range, inline=inline)

    def _read_file(self, handle: StateHandleModel) -> bytes:
        if self._files is None:
            return super()._read_file(handle)
        return self._files.read_state(handle)

    def write_metadata(
        self, job_id: str, checkpoint_id: int, metadata: Mapping[str, Any]
    ) -> str | None:
        if self._files is not None:
            return self._files.write_metadata(job_id, checkpoint_id, metadata)
        _check_segment(job_id, "job id", forbid_glob=True)
        checkpoint_id = _check_checkpoint_id(checkpoint_id)
        raw = _encode_metadata(metadata, job_id, checkpoint_id)
        self._metadata[(job_id, checkpoint_id)] = raw.decode("utf-8")
        return None

    def read_metadata(self, path: str) -> dict[str, Any]:
        if self._files is not None:
            return self._files.read_metadata(path)
        raise CheckpointNotFoundError(
            f"no checkpoint at {path}: jobmanager checkpoint storage without a metadata URL "
            "keeps metadata in memory only"
        )

    def read_checkpoint_metadata(self, job_id: str, checkpoint_id: int) -> dict[str, Any]:
        if self._files is not None:
            return self._files.read_checkpoint_metadata(job_id, checkpoint_id)
        raw = self._metadata.get((job_id, checkpoint_id))
        if raw is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of job {job_id} has no metadata in jobmanager "
                "checkpoint storage"
            )
        return _decode_metadata(raw.encode("utf-8"), f"checkpoint {checkpoint_id} metadata")

    def discard(self, job_id: str, checkpoint_id: int) -> None:
        if self._files is not None:
            self._files.discard(job_id, checkpoint_id)
        self._metadata.pop((job_id, checkpoint_id), None)

    def cleanup_incomplete(self, job_id: str, *, keep: Iterable[int] = ()) -> list[int]:
        if self._files is not None:
            return self._files.cleanup_incomplete(job_id, keep=keep)
        return []  # state is inline: an incomplete checkpoint leaves nothing behind

    def completed_checkpoint_ids(self, job_id: str) -> list[int]:
        if self._files is not None:
            return self._files.completed_checkpoint_ids(job_id)
        return sorted(cid for job, cid in self._metadata if job == job_id)

    def checkpoint_path(self, job_id: str, checkpoint_id: int) -> str | None:
        if self._files is not None:
            return self._files.checkpoint_path(job_id, checkpoint_id)
        return None


def checkpoint_storage_from_options(
    kind: str, url: str | None, max_inline_bytes: int
) -> CheckpointStorage:
    """The checkpoint storage that the job options name.

    Args:
        kind: ``"filesystem"`` or ``"jobmanager"``.
        url: the checkpoint directory (required for ``filesystem``; for ``jobmanager`` where
            ``_metadata`` is written, None to keep it in memory).
        max_inline_bytes: the inline state limit of ``jobmanager`` storage.

    Raises:
        ConfigurationError: an unknown kind, or ``filesystem`` without a URL.
    """
    if kind == "filesystem":
        if not url:
            raise ConfigurationError(
                "checkpoint storage 'filesystem' needs a checkpoint directory (--checkpoint-dir)"
            )
        return FileSystemCheckpointStorage(url)
    if kind == "jobmanager":
        return JobManagerCheckpointStorage(max_state_size=max_inline_bytes, metadata_url=url)
    raise ConfigurationError(
        f"unknown checkpoint storage {kind!r}: expected 'filesystem' or 'jobmanager'"
    )


# ----------------------------------------------------------------------------- helpers


def _check_segment(
    value: Any, what: str, *, forbid_glob: bool = False, reserved_prefix: str | None = None
) -> str:
    """Refuse a job id or state name that is not one plain path segment."""
    if not isinstance(value, str) or not value:
        raise StorageLocationError(f"{what} must be a non-empty str, got {value!r}")
    problem = None
    if value in (".", ".."):
        problem = "is a relative path"
    elif "/" in value or "\\" in value:
        problem = "contains a path separator"
    elif "\x00" in value:
        problem = "contains a NUL character"
    elif value != value.strip():
        problem = "starts or ends with whitespace"
    elif "://" in value:
        problem = "is a URL"
    elif forbid_glob and _GLOB_CHARS & set(value):
        problem = "contains a glob character (* ? [ ])"
    elif reserved_prefix and value.startswith(reserved_prefix):
        problem = f"starts with {reserved_prefix!r}, reserved for the storage's own files"
    if problem:
        raise StorageLocationError(
            f"{what} {value!r} {problem}: it must be a single name under the checkpoint directory"
        )
    return value


def _check_checkpoint_id(checkpoint_id: Any) -> int:
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 1:
        raise StorageLocationError(f"checkpoint id must be an int >= 1, got {checkpoint_id!r}")
    return checkpoint_id


def _checksum(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _handle(
    data: bytes,
    key_group_range: KeyGroupRange | None,
    *,
    path: str | None = None,
    inline: str | None = None,
) -> StateHandleModel:
    return StateHandleModel(
        path=path,
        inline=inline,
        size=len(data),
        checksum=_checksum(data),
        key_group_start=None if key_group_range is None else key_group_range.start,
        key_group_end=None if key_group_range is None else key_group_range.end,
    )


def _verify(data: bytes, handle: StateHandleModel, where: str) -> None:
    if len(data) != handle.size:
        raise CorruptSnapshotError(
            f"{where} is {len(data)} bytes, expected {handle.size} bytes (truncated or altered)"
        )
    actual = _checksum(data)
    if actual != handle.checksum:
        raise CorruptSnapshotError(
            f"{where} has checksum {actual}, expected {handle.checksum} (altered)"
        )


def _encode_metadata(metadata: Mapping[str, Any], job_id: str, checkpoint_id: int) -> bytes:
    try:
        return json.dumps(dict(metadata), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"metadata of checkpoint {checkpoint_id} of job {job_id} is not JSON: {err}"
        ) from err


def _decode_metadata(raw: bytes, where: str) -> dict[str, Any]:
    try:
        metadata = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise CorruptSnapshotError(f"{where} is not valid JSON: {err}") from err
    if not isinstance(metadata, dict):
        raise CorruptSnapshotError(
            f"{where} holds a JSON {type(metadata).__name__}, expected an object"
        )
    return metadata


def _format_size(size: int) -> str:
    if size >= 1 << 20:
        return f"{size / (1 << 20):.1f} MiB"
    if size >= 1 << 10:
        return f"{size / (1 << 10):.1f} KiB"
    return f"{size} bytes"
