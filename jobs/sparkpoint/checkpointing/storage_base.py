"""The checkpoint storage interface and the helpers its implementations share.

:class:`CheckpointStorage` is what the runtime writes snapshot state and checkpoint metadata
through; :mod:`sparkpoint.checkpointing.filesystem_storage` and
:mod:`sparkpoint.checkpointing.jobmanager_storage` implement it. The helpers here check job ids,
state names and checkpoint ids, make and verify state handles (size and SHA-256 checksum) and
encode and decode ``_metadata`` JSON.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import errno
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import fsspec
import fsspec.config
import orjson

from sparkpoint.checkpointing.shared_state import metadata_handles
from sparkpoint.errors import (
    CheckpointError,
    ConfigurationError,
    CorruptSnapshotError,
    StorageLocationError,
    error_text,
)
from sparkpoint.protocol import SharedFileModel, StateHandleModel
from sparkpoint.state.key_groups import KeyGroupRange

log = logging.getLogger(__name__)
#: A full filesystem or quota: the place is right but has no room now, not a wrong setting.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})

_GLOB_CHARS = frozenset("*?[]")
#: Filesystems with an atomic rename whose listings show every write at once. Any other
#: protocol (``s3``, ``gs``, ``abfs``...) is an object store: no rename, a put is atomic.
RENAMING_PROTOCOLS = frozenset(
    {"file", "local", "memory", "hdfs", "arrow_hdfs", "webhdfs", "viewfs"}
)


class StateTooLargeError(CheckpointError):
    """A snapshot is above the inline size limit of jobmanager checkpoint storage."""


class NativeSnapshotUnsupportedError(StateTooLargeError, ConfigurationError):
    """Native (incremental) snapshots need filesystem checkpoint storage (Flink's rule too).

    A :class:`StateTooLargeError`, so that a subtask declines the checkpoint with the reason,
    and a :class:`ConfigurationError`, so that a check at start-up can refuse the options.
    """


class CheckpointStorage(abc.ABC):
    """Writes and reads the state handles and the metadata of checkpoints."""

    #: Whether it stores native snapshots (a RocksDB checkpoint's own files, see
    #: :meth:`write_native`); a backend takes canonical snapshots into one that does not.
    native_snapshots = False

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
            verify_state(data, handle, "inline state")
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

    def write_native(
        self,
        job_id: str,
        checkpoint_id: int,
        name: str,
        private: Mapping[str, str],
        shared: Mapping[str, str],
        reused: Sequence[SharedFileModel],
        *,
        key_group_range: KeyGroupRange | None,
        fmt: str,
    ) -> StateHandleModel:
        """Store a native (incremental) snapshot: its own files, each uploaded at most once.

        Args:
            job_id: the job.
            checkpoint_id: the checkpoint (>= 1); it becomes part of new shared files' names.
            name: the state's name within the checkpoint (as for :meth:`write_state`).
            private: file name -> local path of files only this checkpoint keeps.
            shared: file name -> local path of new immutable files that later checkpoints may
                reuse (uploaded to the job's ``shared/`` directory).
            reused: shared files an earlier checkpoint of this job uploaded, referenced again
                without an upload.
            key_group_range: the key groups the snapshot covers.
            fmt: the snapshot's format, recorded in the handle (``"rocksdb-native-v1"``).

        Returns:
            The handle of the snapshot's manifest, listing in ``shared`` every shared file
            it references (new and reused).

        Raises:
            NativeSnapshotUnsupportedError: this storage keeps state inline.
            StorageLocationError: a reused file outside this job's ``shared/`` directory.
        """
        raise self._native_unsupported(name)

    def fetch_native(self, handle: StateHandleModel, dest_dir: str) -> None:
        """Download every file of a native snapshot into the local directory ``dest_dir``.

        Raises:
            CorruptSnapshotError: the manifest or a file is missing or altered (the message
                names the file and the manifest).
            StorageLocationError: a path outside this storage's base directory.
        """
        raise self._native_unsupported(handle.path or "inline state")

    def _native_unsupported(self, what: str) -> NativeSnapshotUnsupportedError:
        return NativeSnapshotUnsupportedError(
            f"{type(self).__name__} keeps state inline in the checkpoint metadata: the "
            f"incremental (native) snapshot of {what} needs a filesystem checkpoint storage "
            "(--checkpoint-storage filesystem --checkpoint-dir URL)"
        )

    def verify_handles(self, handles: Iterable[StateHandleModel]) -> None:
        """Check, before a restore, that the files of ``handles`` are there and intact.

        Inline state and files up to a small limit are checked in full; larger files (and the
        files of a native snapshot's ``shared/`` directory) by their size: their checksum is
        verified when they are read.

        Raises:
            CorruptSnapshotError: a missing or altered file, named.
            StorageLocationError: a path outside this storage's base directory.
        """
        for handle in handles:
            self.read_state(handle)

    def verify_checkpoint(self, job_id: str, checkpoint_id: int) -> None:
        """:meth:`verify_handles` of every handle in a completed checkpoint's ``_metadata``.

        Raises:
            CheckpointNotFoundError: the checkpoint has no metadata here.
            CorruptSnapshotError: a missing or altered file, or invalid metadata.
        """
        meta = self.read_checkpoint_metadata(job_id, checkpoint_id)
        where = f"checkpoint {checkpoint_id} of job {job_id}"
        try:
            self.verify_handles(metadata_handles(meta, where))
        except CorruptSnapshotError as err:
            raise CorruptSnapshotError(f"{where}: {err}") from err

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

    def check_writable(self, job_id: str, local_dir: str | None = None) -> None:
        """Check, before the first epoch, that the job can write where it keeps state.

        Steps: (1) this storage's directory for the job (storage that keeps everything in
        memory has none), (2) the job's local working-state directory under ``local_dir``.
        A job that cannot write there would fail every epoch and restart without end.

        Raises:
            ConfigurationError: one line naming the directory and the error (for example the
                OS error: permission denied, not a directory).
        """
        # Step 1
        self._check_job_directory(job_id)
        # Step 2
        if local_dir is not None:
            check_segment(job_id, "job id", forbid_glob=True)
            probe_directory(
                fsspec.filesystem("file"), os.path.join(local_dir, job_id), "--local-dir", local_dir
            )

    def _check_job_directory(self, job_id: str) -> None:  # noqa: B027 - in-memory: nothing
        """Create the job's directory in this storage and write a file there (see
        :meth:`check_writable`)."""

    @abc.abstractmethod
    def discard(self, job_id: str, checkpoint_id: int) -> None:
        """Delete everything of a checkpoint; nothing happens when it is already gone."""

    def write_working_state(self, job_id: str, name: str, tag: str, data: bytes) -> str:
        """Write a durable copy of a subtask's working state (filesystem storage only)."""
        raise ConfigurationError(
            f"{type(self).__name__} cannot keep durable working state; use --checkpoint-dir"
        )

    def read_working_state(self, url: str) -> bytes | None:
        """The bytes of a durable working-state copy, or None when it is not there."""
        return None

    def discard_working_state(  # noqa: B027 - storage without durable copies has none
        self, job_id: str, urls: Iterable[str] | None = None
    ) -> None:
        """Delete durable working-state copies (the given ones, or all of the job's)."""

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


# ----------------------------------------------------------------------------- helpers


def check_segment(
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


def probe_directory(fs: fsspec.AbstractFileSystem, path: str, option: str, url: str) -> None:
    """Create ``path`` on ``fs``, write a probe file there and delete it again.

    A filesystem that is full (or over quota) is not a wrong setting: a warning says so and
    the job starts; what it writes there fails, and is retried under the failure policy,
    until there is room again (a driver restarting while the disk is full must not end the
    job as misconfigured).

    Raises:
        ConfigurationError: ``cannot write to OPTION URL: ERROR`` on one line.
    """
    probe = f"{path.rstrip('/')}/.sparkpoint-probe-{uuid.uuid4().hex}"
    try:
        fs.makedirs(path, exist_ok=True)
        fs.pipe_file(probe, b"sparkpoint")
        fs.rm(probe)
    except Exception as err:  # OSError locally; object stores raise their own errors too
        detail = error_text(err)
        if isinstance(err, OSError) and err.errno in _FULL:
            with contextlib.suppress(Exception):
                fs.rm(probe)
            log.warning(
                "%s %s has no room now (%s); starting anyway: what is written there fails "
                "and is retried until there is room",
                option,
                url,
                detail,
            )
            return
        raise ConfigurationError(f"cannot write to {option} {url}: {detail}") from err


def is_object_store(protocols: Iterable[str]) -> bool:
    """Whether a filesystem with these fsspec protocols is an object store (no rename)."""
    return not RENAMING_PROTOCOLS.intersection(protocols)


def shipped_storage_options(
    fs_class: type[fsspec.AbstractFileSystem], storage_options: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The storage options of an object store as Spark executors must use them.

    The driver's fsspec configuration for the protocol (``FSSPEC_S3_ENDPOINT_URL``,
    ``fsspec.config.conf["s3"]``: endpoint, credentials) is captured here, on the driver, so
    that executors, whose environment may differ, talk to the same store the same way (as
    Spark ships its Hadoop configuration); explicit ``storage_options`` win. The listing cache
    is off: other processes (executors, the driver, a fork) write the same prefixes, and a
    cached listing would hide their objects.
    """
    options: dict[str, Any] = {"use_listings_cache": False}
    options.update(fsspec.config.apply_config(fs_class, {}))
    options.update(storage_options or {})
    return options


def check_checkpoint_id(checkpoint_id: Any) -> int:
    """Refuse a checkpoint id that is not an int >= 1."""
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 1:
        raise StorageLocationError(f"checkpoint id must be an int >= 1, got {checkpoint_id!r}")
    return checkpoint_id


def _checksum(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def state_handle(
    data: bytes,
    key_group_range: KeyGroupRange | None,
    *,
    path: str | None = None,
    inline: str | None = None,
) -> StateHandleModel:
    """The handle of ``data``: its size and checksum, and where the bytes are."""
    return StateHandleModel(
        path=path,
        inline=inline,
        size=len(data),
        checksum=_checksum(data),
        key_group_start=None if key_group_range is None else key_group_range.start,
        key_group_end=None if key_group_range is None else key_group_range.end,
    )


def verify_state(data: bytes, handle: StateHandleModel, where: str) -> None:
    """Refuse ``data`` unless it has the size and checksum ``handle`` records."""
    if len(data) != handle.size:
        raise CorruptSnapshotError(
            f"{where} is {len(data)} bytes, expected {handle.size} bytes (truncated or altered)"
        )
    actual = _checksum(data)
    if actual != handle.checksum:
        raise CorruptSnapshotError(
            f"{where} has checksum {actual}, expected {handle.checksum} (altered)"
        )


def encode_metadata(metadata: Mapping[str, Any], job_id: str, checkpoint_id: int) -> bytes:
    """``metadata`` as JSON bytes; raises :class:`CheckpointError` when it is not JSON.

    orjson writes it, a tenth of the standard library's time (47 against 4 µs for the
    ``_metadata`` of four subtasks' acknowledgements; the control plane writes one per
    completed checkpoint). orjson writes NaN and the infinities as ``null`` where the standard
    library refuses them, so an output with ``null`` in it (rare: a checkpoint's
    acknowledgements leave their None fields out, see
    :func:`~sparkpoint.checkpointing.pending.checkpoint_metadata`; a string that holds the
    word) goes through the standard library, as does what
    orjson cannot write (an int beyond 64 bits); that writes it or says why not.
    """
    try:
        raw = orjson.dumps(dict(metadata), option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # orjson.JSONEncodeError
        raw = b"null"
    if b"null" not in raw:
        return raw
    try:
        return json.dumps(dict(metadata), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"metadata of checkpoint {checkpoint_id} of job {job_id} is not JSON: {err}"
        ) from err


def decode_metadata(raw: bytes, where: str) -> dict[str, Any]:
    """The JSON object in ``raw``; raises :class:`CorruptSnapshotError` for anything else."""
    try:
        metadata = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise CorruptSnapshotError(f"{where} is not valid JSON: {err}") from err
    if not isinstance(metadata, dict):
        raise CorruptSnapshotError(
            f"{where} holds a JSON {type(metadata).__name__}, expected an object"
        )
    return metadata


def format_size(size: int) -> str:
    """``size`` bytes for a message: bytes, KiB or MiB."""
    if size >= 1 << 20:
        return f"{size / (1 << 20):.1f} MiB"
    if size >= 1 << 10:
        return f"{size / (1 << 10):.1f} KiB"
    return f"{size} bytes"
