"""Native (incremental) snapshots in filesystem checkpoint storage; the lifetime of shared files.

A native snapshot (RocksDB's own files) is uploaded as: its private files under
``<chk-n>/<name>/``, its new shared files (immutable SST files) once to
``<job>/shared/<name>-c<n>-<file>`` (``n``, the uploader checkpoint, is what the sweep reads
back), and a manifest ``<chk-n>/<name>/_manifest.json`` listing every file of the snapshot:
``{"files": {file name: {path, size, checksum, shared}}}``. The snapshot's handle points at the
manifest and lists in ``shared`` every shared file it references, new or reused.

Shared files are reference-counted from what is on disk, never from memory, so that a restart
of the control plane or of a standalone driver keeps the counts right: :func:`sweepable` takes
the references of every remaining checkpoint and names the files no one needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

import fsspec

from sparkpoint.errors import CorruptSnapshotError, StorageLocationError
from sparkpoint.protocol import StateHandleModel

MANIFEST_FILE = "_manifest.json"
MANIFEST_FORMAT = "sparkpoint-native-manifest/1"
#: Files up to this size are read in full (checksum) when a restore point is verified; larger
#: ones only have their size checked (their checksum is verified when they are downloaded).
VERIFY_CHECKSUM_LIMIT = 1 << 20
_CHUNK = 1 << 20
_UPLOADER = re.compile(r"-c([0-9]+)-")


@dataclass(frozen=True)
class ManifestEntry:
    """One file of a native snapshot: where it is, its size and checksum, whether shared."""

    path: str
    size: int
    checksum: str
    shared: bool


# ----------------------------------------------------------------------------- names


def check_native_name(name: str) -> str:
    """Refuse a state name that would make the uploader id of its shared files ambiguous."""
    if _UPLOADER.search(f"{name}-"):
        raise StorageLocationError(
            f"state name {name!r} contains '-c<digits>', which names the uploader checkpoint "
            "of shared files; choose another name"
        )
    return name


def shared_file_name(name: str, checkpoint_id: int, file_name: str) -> str:
    """``<name>-c<checkpoint id>-<file name>``: the name of a shared file in ``shared/``."""
    return f"{name}-c{checkpoint_id}-{file_name}"


def split_shared_name(base_name: str) -> tuple[int, str] | None:
    """(uploader checkpoint id, file name) of a shared file's name; None if not one of ours."""
    match = _UPLOADER.search(base_name)
    if match is None or match.start() == 0 or match.end() == len(base_name):
        return None
    return int(match.group(1)), base_name[match.end() :]


# ----------------------------------------------------------------------------- manifests


def is_manifest(path: str) -> bool:
    """Whether a handle's path is a native snapshot's manifest."""
    return path.rstrip("/").rsplit("/", 1)[-1] == MANIFEST_FILE


def encode_manifest(fmt: str, entries: Mapping[str, ManifestEntry]) -> bytes:
    """The manifest of a native snapshot as JSON bytes (files sorted by name)."""
    files = {
        file_name: {"path": e.path, "size": e.size, "checksum": e.checksum, "shared": e.shared}
        for file_name, e in sorted(entries.items())
    }
    return json.dumps({"format": MANIFEST_FORMAT, "snapshot_format": fmt, "files": files}).encode()


def decode_manifest(raw: bytes, where: str) -> dict[str, ManifestEntry]:
    """The files a manifest lists; raises :class:`CorruptSnapshotError` naming ``where``."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not a {MANIFEST_FORMAT} manifest")
        out = {}
        for file_name, e in doc["files"].items():
            size = e["size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"file {file_name!r} has size {size!r}")
            out[file_name] = ManifestEntry(
                str(e["path"]), size, str(e["checksum"]), bool(e["shared"])
            )
        return out
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CorruptSnapshotError(f"manifest {where} is not valid: {err}") from err


def metadata_handles(metadata: Mapping[str, Any], where: str) -> list[StateHandleModel]:
    """Every state handle in a checkpoint's ``_metadata`` (its acknowledgements' handles)."""
    try:
        return [
            StateHandleModel.model_validate(handle)
            for ack in metadata.get("acks") or []
            for handle in ack.get("handles") or []
        ]
    except (ValueError, TypeError, AttributeError) as err:
        raise CorruptSnapshotError(f"{where}: invalid state handles: {err}") from err


# ----------------------------------------------------------------------------- streaming


def copy_hashing(source: IO[bytes], target: IO[bytes]) -> tuple[int, str]:
    """Copy ``source`` to ``target`` in chunks; returns (size, ``sha256:<hex>``) of the bytes."""
    digest = hashlib.sha256()
    size = 0
    while chunk := source.read(_CHUNK):
        digest.update(chunk)
        target.write(chunk)
        size += len(chunk)
    return size, "sha256:" + digest.hexdigest()


def hash_stream(source: IO[bytes]) -> tuple[int, str]:
    """(size, ``sha256:<hex>``) of a stream read in chunks."""
    digest = hashlib.sha256()
    size = 0
    while chunk := source.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return size, "sha256:" + digest.hexdigest()


def upload(fs: fsspec.AbstractFileSystem, local: str, remote: str) -> tuple[int, str]:
    """Stream the local file ``local`` to ``remote`` on ``fs``; returns its (size, checksum)."""
    if not os.path.isfile(local):
        raise FileNotFoundError(f"cannot upload {local} to {remote}: not a file")
    fs.makedirs(posixpath.dirname(remote), exist_ok=True)
    with open(local, "rb") as src, fs.open(remote, "wb") as dst:
        return copy_hashing(src, dst)


def download(
    fs: fsspec.AbstractFileSystem, source: str, target: str, entry: ManifestEntry, what: str
) -> None:
    """Stream ``source`` on ``fs`` to the local file ``target``, checked against ``entry``.

    Raises:
        CorruptSnapshotError: ``source`` is missing, or its size or checksum differs (then
            ``target`` is removed); the message starts with ``what``.
    """
    try:
        with fs.open(source, "rb") as src, open(target, "wb") as dst:
            actual = copy_hashing(src, dst)
    except FileNotFoundError as err:
        raise CorruptSnapshotError(_missing(what, entry)) from err
    if actual != (entry.size, entry.checksum):
        os.remove(target)
        raise CorruptSnapshotError(_altered(what, entry, actual))


def check_file(
    fs: fsspec.AbstractFileSystem, path: str, entry: ManifestEntry, full: bool, what: str
) -> None:
    """Check that ``path`` on ``fs`` has the size (``full``: and the checksum) of ``entry``.

    Raises:
        CorruptSnapshotError: missing, or of another size or checksum; names ``what``.
    """
    try:
        if full:
            with fs.open(path, "rb") as fh:
                actual = hash_stream(fh)
        else:
            actual = (fs.size(path), entry.checksum)
    except FileNotFoundError as err:
        raise CorruptSnapshotError(_missing(what, entry)) from err
    if actual != (entry.size, entry.checksum):
        raise CorruptSnapshotError(_altered(what, entry, actual))


def _missing(what: str, entry: ManifestEntry) -> str:
    return f"{what} is missing (expected {entry.size} bytes, {entry.checksum})"


def _altered(what: str, entry: ManifestEntry, actual: tuple[int, str]) -> str:
    return (
        f"{what} is {actual[0]} bytes with checksum {actual[1]}, expected {entry.size} bytes "
        f"with {entry.checksum} (truncated or altered)"
    )


# ----------------------------------------------------------------------------- lifetime


def sweepable(
    shared_files: Iterable[str], referenced: set[str], latest_completed: int
) -> list[str]:
    """The shared files that may be deleted: referenced by no remaining checkpoint, and
    uploaded by a checkpoint no later than the latest completed one (a file of a checkpoint
    still in flight is never deleted). Files whose name carries no uploader id are kept.

    Args:
        shared_files: paths of the files in the job's ``shared/`` directory.
        referenced: the paths that remaining checkpoints reference.
        latest_completed: the highest id of a remaining completed checkpoint (0: none).
    """
    out = []
    for path in shared_files:
        parts = split_shared_name(path.rsplit("/", 1)[-1])
        if parts is None or path in referenced:
            continue
        if parts[0] <= latest_completed:
            out.append(path)
    return sorted(out)
