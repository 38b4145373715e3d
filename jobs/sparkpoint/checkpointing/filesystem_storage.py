"""Filesystem checkpoint storage: state files and ``_metadata`` under any fsspec URL.

Flink's ``FileSystemCheckpointStorage``. The base directory may be ``file://``, a plain local
path, ``s3://``, ``hdfs://``, ``memory://`` in tests... Layout: ``<base>/<job-id>/chk-<n>/<name>``
for state and ``<base>/<job-id>/chk-<n>/_metadata`` for a completed checkpoint's metadata;
``<base>/<job-id>/shared/`` holds the shared files of native (incremental) snapshots
(:mod:`~sparkpoint.checkpointing.shared_state`); ``<base>/<job-id>/working/``
holds the durable copies of working state between epochs. The storage is shipped to Spark
executors: it holds plain strings and creates its fsspec filesystem lazily.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import fsspec
from fsspec.core import split_protocol

from sparkpoint.checkpointing.file_ops import FileOps, file_ops_for
from sparkpoint.checkpointing.shared_state import (
    MANIFEST_FILE,
    VERIFY_CHECKSUM_LIMIT,
    ManifestEntry,
    check_file,
    check_native_name,
    decode_manifest,
    download,
    encode_manifest,
    is_manifest,
    metadata_handles,
    shared_file_name,
    split_shared_name,
    sweepable,
    upload,
)
from sparkpoint.checkpointing.storage_base import (
    CheckpointStorage,
    check_checkpoint_id,
    check_segment,
    decode_metadata,
    encode_metadata,
    is_object_store,
    probe_directory,
    shipped_storage_options,
    state_handle,
    verify_state,
)
from sparkpoint.errors import CheckpointNotFoundError, CorruptSnapshotError, StorageLocationError
from sparkpoint.protocol import SharedFileModel, StateHandleModel
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

    native_snapshots = True

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
        self._object_store = is_object_store(self._protocols)
        self._storage_options: dict[str, Any] = (
            shipped_storage_options(fs_class, storage_options)
            if self._object_store
            else dict(storage_options or {})
        )
        self._fs: fsspec.AbstractFileSystem | None = None  # created on first use, not pickled
        self._file_ops: FileOps | None = None  # likewise

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_file_ops": None}

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

    @property
    def _files(self) -> FileOps:
        if self._file_ops is None:
            self._file_ops = file_ops_for(self.fs, self._object_store)
        return self._file_ops

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

    def _check_job_directory(self, job_id: str) -> None:
        probe_directory(self.fs, self._job_dir(job_id), "--checkpoint-dir", self.base_url)

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

    # ------------------------------------------------------------------------- native snapshots

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
        """Store a native snapshot (see :meth:`CheckpointStorage.write_native`).

        Steps: (1) check the names and that reused files are this job's shared files, (2)
        upload the private files to ``chk-<n>/<name>/``, (3) upload the new shared files to
        ``shared/<name>-c<n>-<file>``, (4) write the manifest ``chk-<n>/<name>/_manifest.json``
        atomically, (5) return its handle. Uploads stream and hash in one read of each file.
        """
        # Step 1
        check_segment(name, "state name", reserved_prefix="_")
        check_native_name(name)
        directory = f"{self._checkpoint_dir(job_id, checkpoint_id)}/{name}"
        shared_dir = f"{self._job_dir(job_id)}/{SHARED_DIR}"
        reused_entries = self._reused_entries(shared_dir, reused)
        names = [*private, *shared, *(file_name for file_name, _ in reused_entries)]
        for file_name in names:
            check_segment(file_name, f"file name of native snapshot {name}", reserved_prefix="_")
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise StorageLocationError(
                f"native snapshot {name} of checkpoint {checkpoint_id} names files {twice} more "
                "than once (private, shared and reused files must have distinct names)"
            )
        entries = dict(reused_entries)
        # Step 2
        for file_name, local in sorted(private.items()):
            entries[file_name] = self._upload(local, f"{directory}/{file_name}", shared=False)
        # Step 3
        for file_name, local in sorted(shared.items()):
            remote = f"{shared_dir}/{shared_file_name(name, checkpoint_id, file_name)}"
            entries[file_name] = self._upload(local, remote, shared=True)
        # Step 4
        raw = encode_manifest(fmt, entries)
        manifest = f"{directory}/{MANIFEST_FILE}"
        self._files.write_atomically(manifest, raw)
        # Step 5
        refs = [
            SharedFileModel(path=e.path, size=e.size, checksum=e.checksum)
            for _, e in sorted(entries.items())
            if e.shared
        ]
        handle = state_handle(raw, key_group_range, path=self._url(manifest))
        return handle.model_copy(update={"format": fmt, "shared": refs})

    def _reused_entries(
        self, shared_dir: str, reused: Sequence[SharedFileModel]
    ) -> list[tuple[str, ManifestEntry]]:
        """(file name, entry) of each reused file, refused unless in ``shared_dir``."""
        out = []
        for ref in reused:
            path = self._inside_base(ref.path)
            parts = split_shared_name(posixpath.basename(path))
            if posixpath.dirname(path) != shared_dir or parts is None:
                raise StorageLocationError(
                    f"reused shared file {ref.path} is not a shared file of this job "
                    f"(expected <name>-c<id>-<file> in {self._url(shared_dir)})"
                )
            out.append((parts[1], ManifestEntry(self._url(path), ref.size, ref.checksum, True)))
        return out

    def _upload(self, local: str, remote: str, *, shared: bool) -> ManifestEntry:
        size, checksum = upload(self.fs, local, remote)
        return ManifestEntry(self._url(remote), size, checksum, shared)

    def fetch_native(self, handle: StateHandleModel, dest_dir: str) -> None:
        """Download a native snapshot into ``dest_dir``, checking every file as it streams.

        Steps: (1) read the manifest (checked against the handle), (2) download each file,
        (3) refuse one whose size or checksum differs from the manifest's (and remove it).
        """
        # Step 1
        manifest = self._manifest(handle)
        listed = {self._inside_base(ref.path) for ref in handle.shared}
        os.makedirs(dest_dir, exist_ok=True)
        for file_name, e in sorted(manifest.items()):
            source = self._inside_base(e.path)
            what = f"state file {e.path} of native snapshot {handle.path}"
            if e.shared and source not in listed:
                raise CorruptSnapshotError(f"{what} is shared but not in the handle's references")
            # Steps 2 and 3
            download(self.fs, source, os.path.join(dest_dir, file_name), e, what)

    def _manifest(self, handle: StateHandleModel) -> dict[str, ManifestEntry]:
        """The files of a native snapshot, from its manifest checked against ``handle``."""
        if handle.path is None or not is_manifest(handle.path):
            raise CorruptSnapshotError(
                f"state handle {handle.path or 'inline state'} is not a native snapshot's "
                f"manifest ({MANIFEST_FILE})"
            )
        entries = decode_manifest(self.read_state(handle), handle.path)
        for file_name in entries:
            check_segment(file_name, f"file name in manifest {handle.path}", reserved_prefix="_")
        return entries

    def verify_handles(
        self, handles: Iterable[StateHandleModel], *, checksum_limit: int = VERIFY_CHECKSUM_LIMIT
    ) -> None:
        """Check the files of ``handles`` (see :meth:`CheckpointStorage.verify_handles`); files
        up to ``checksum_limit`` bytes are read in full, shared files never."""
        for handle in handles:
            if handle.path is None:
                self.read_state(handle)
            elif is_manifest(handle.path):
                for e in self._manifest(handle).values():
                    full = not e.shared and e.size <= checksum_limit
                    what = f"state file {e.path} of native snapshot {handle.path}"
                    check_file(self.fs, self._inside_base(e.path), e, full, what)
            else:
                e = ManifestEntry(handle.path, handle.size, handle.checksum, False)
                full = handle.size <= checksum_limit
                check_file(self.fs, self._inside_base(e.path), e, full, f"state file {e.path}")

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
        """Delete durable working-state copies: the given ones, or all of the job's. A
        deletion that fails is logged, not raised (as in :meth:`discard`): no epoch fails."""
        what = f"job {job_id}: working state"
        if urls is None:
            self._files.remove_or_log(f"{self._job_dir(job_id)}/{WORKING_DIR}", what, True)
        for url in urls or ():
            self._files.remove_or_log(self._inside_base(url), what)

    # ------------------------------------------------------------------------- metadata

    def write_metadata(self, job_id: str, checkpoint_id: int, metadata: Mapping[str, Any]) -> str:
        """Write ``_metadata`` of a checkpoint.

        1. encode the metadata as JSON;
        2. write it under a temporary name in the checkpoint's directory;
        3. rename it to ``_metadata`` (atomic on local and HDFS filesystems). On an object
           store steps 2 and 3 are one put of ``_metadata``: a put is atomic, and a reader
           never sees a partial object.
        """
        directory = self._checkpoint_dir(job_id, checkpoint_id)
        # Step 1: encode.
        raw = encode_metadata(metadata, job_id, checkpoint_id)
        # Steps 2 and 3
        self._files.write_atomically(f"{directory}/{METADATA_FILE}", raw)
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
        """Delete a checkpoint's directory, then the shared files no checkpoint needs any more
        (:meth:`sweep_shared`): the standalone authority and the control plane both discard
        through here. A deletion that fails (a filesystem error, or writers that keep adding
        files) leaves garbage, never wrong state: it is logged, not raised, so that no job
        fails over for it."""
        directory = self._checkpoint_dir(job_id, checkpoint_id)
        what = f"job {job_id}: checkpoint {checkpoint_id}"
        if self._files.remove_or_log(directory, what, recursive=True):
            self.sweep_shared(job_id)

    def cleanup_incomplete(self, job_id: str, *, keep: Iterable[int] = ()) -> list[int]:
        kept = set(keep)
        removed = []
        for checkpoint_id, directory in self._checkpoint_dirs(job_id):
            if checkpoint_id in kept or self.fs.exists(f"{directory}/{METADATA_FILE}"):
                continue
            self._files.remove_quietly(directory, recursive=True)
            removed.append(checkpoint_id)
        self.sweep_shared(job_id)
        return sorted(removed)

    def sweep_shared(self, job_id: str) -> list[str]:
        """Delete the files of the job's ``shared/`` directory that no checkpoint needs.

        Steps: (1) list ``shared/``, (2) collect the references of every remaining completed
        checkpoint (the ``shared`` lists of the handles in its ``_metadata``) and of every
        checkpoint in flight (the manifests in a ``chk-*`` without ``_metadata``), (3) delete
        the files :func:`~sparkpoint.checkpointing.shared_state.sweepable` names. The counts
        are rebuilt from storage every time, so a restarted authority keeps them right.

        Returns:
            The URLs of the deleted files. Nothing is deleted when a ``_metadata`` or a
            manifest cannot be read: its references are unknown.
        """
        # Step 1
        shared_dir = f"{self._job_dir(job_id)}/{SHARED_DIR}"
        try:
            listing = self.fs.ls(shared_dir, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        files = [posixpath.normpath(e["name"]) for e in listing if e.get("type") == "file"]
        if not files:
            return []
        # Step 2
        referenced: set[str] = set()
        latest = 0
        for checkpoint_id, directory in self._checkpoint_dirs(job_id):
            try:
                refs, completed = self._references(directory)
            except FileNotFoundError:
                continue  # discarded meanwhile: its references are gone with it
            except (CorruptSnapshotError, OSError):
                return []
            if completed:
                latest = max(latest, checkpoint_id)
            for ref in refs:
                with contextlib.suppress(StorageLocationError):
                    referenced.add(self._inside_base(ref))
        # Step 3
        doomed = sweepable(files, referenced, latest)
        for path in doomed:
            self._files.remove_quietly(path)
        return [self._url(path) for path in doomed]

    def _references(self, directory: str) -> tuple[list[str], bool]:
        """The shared files a ``chk-*`` directory references, and whether it is completed."""
        metadata = f"{directory}/{METADATA_FILE}"
        if self.fs.exists(metadata):
            where = self._url(metadata)
            meta = decode_metadata(self.fs.cat_file(metadata), where)
            return [ref.path for h in metadata_handles(meta, where) for ref in h.shared], True
        refs: list[str] = []
        for manifest in self.fs.glob(f"{directory}/*/{MANIFEST_FILE}"):
            raw = self.fs.cat_file(manifest)
            entries = decode_manifest(raw, self._url(str(manifest)))
            refs.extend(e.path for e in entries.values() if e.shared)
        return refs, False

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
        except (FileNotFoundError, NotADirectoryError):  # a file on the way: no such directory
            return []
        found = []
        for entry in entries:
            name = posixpath.basename(str(entry).rstrip("/"))
            suffix = name[len(_CHECKPOINT_PREFIX) :]
            if name.startswith(_CHECKPOINT_PREFIX) and suffix.isdigit() and int(suffix) >= 1:
                found.append((int(suffix), f"{job_dir}/{name}"))
        return found
