"""``sparkpoint savepoint inspect | dispose PATH``: what a savepoint or checkpoint holds, and
deleting one (Flink's ``flink savepoint --dispose``).

PATH is a savepoint or retained checkpoint directory, a local path or a URL (``file://``...),
holding ``_metadata``. :func:`inspect_savepoint` reads the metadata and every state handle
(checking each file's size and checksum) and returns a :class:`SavepointSummary`: per operator
uid and subtask, each handle's format, key group range and size and, for canonical keyed state
(:mod:`sparkpoint.state.canonical`) and ``hashmap`` checkpoints (their columns,
:mod:`sparkpoint.state.changelog_delta`), its states and a sample of decoded entries. Other
handles are listed with their format and size only, and a RocksDB native snapshot also with the
states ``_metadata`` declares for it and its files' size in all (its files are not read).
:func:`~sparkpoint.savepoint_summary.render_text` and :meth:`SavepointSummary.to_json` show a
summary.

Decoding a sample unpickles the values of ``pickle`` states, which runs code: inspect only
savepoints from storage you trust, or pass ``--sample 0``.

:func:`dispose_savepoint` deletes a directory that holds a readable ``_metadata`` and nothing
else. A savepoint is self-contained: all its files are in its directory. A retained incremental
checkpoint also references files in its job's ``shared/`` directory: those are never deleted
here, since later checkpoints of the job may reference them (the job's own checkpoint cleanup
deletes them when no checkpoint does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import posixpath
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkpoint.checkpointing.relocation import relocated_to
from sparkpoint.checkpointing.storage import METADATA_FILE, SHARED_DIR, FileSystemCheckpointStorage
from sparkpoint.checkpointing.storage_base import format_size
from sparkpoint.errors import (
    CheckpointNotFoundError,
    CorruptSnapshotError,
    SparkpointError,
    error_text,
)
from sparkpoint.locations import absolute
from sparkpoint.protocol import SnapshotCompleted, StateHandleModel
from sparkpoint.savepoint_summary import (
    INLINE,
    HandleSummary,
    SampleEntry,
    SavepointSummary,
    StateSummary,
    render_text,
)
from sparkpoint.state import canonical, changelog_delta
from sparkpoint.state.backend import DELETED
from sparkpoint.state.key_groups import key_group_for
from sparkpoint.state.serializers import decode_key, decode_value, serializer_named

COMMANDS = ("inspect", "dispose")
DEFAULT_SAMPLE = 5
REPR_LIMIT = 80
METADATA_FORMAT_PREFIX = "sparkpoint-checkpoint/"
LEGACY_MAGIC = b"SPKS"  # the hashmap backend's snapshots before the canonical format
EXIT_REFUSED = 2


@dataclass(frozen=True)
class DisposeResult:
    """What :func:`dispose_savepoint` deleted and kept."""

    path: str
    checkpoint_id: int | None
    kind: str | None
    files: int
    bytes: int
    shared_kept: int  # shared files (in the job's shared/) the handles referenced, not deleted


# ----------------------------------------------------------------------------- reading


def _open(
    path: str,
) -> tuple[FileSystemCheckpointStorage, dict[str, Any], list[SnapshotCompleted]]:
    """Storage rooted at the directory of ``path``, its metadata and acknowledgements.

    Raises:
        CheckpointNotFoundError: no ``_metadata`` there.
        CorruptSnapshotError: ``_metadata`` that is not a Sparkpoint checkpoint's.
    """
    trimmed = path.rstrip("/")
    if posixpath.basename(trimmed) == METADATA_FILE:
        trimmed = posixpath.dirname(trimmed)
    storage = FileSystemCheckpointStorage(trimmed or "/")
    where = f"{storage.base_url}/{METADATA_FILE}"
    metadata = storage.read_metadata(path)
    fmt = metadata.get("format")
    if not isinstance(fmt, str) or not fmt.startswith(METADATA_FORMAT_PREFIX):
        raise CorruptSnapshotError(
            f"{where} has format {fmt!r}, not a Sparkpoint checkpoint's "
            f"({METADATA_FORMAT_PREFIX}<version>)"
        )
    try:
        acks = [SnapshotCompleted.model_validate(ack) for ack in metadata["acks"]]
    except (KeyError, TypeError, ValueError) as err:
        detail = " ".join(str(err).split())
        raise CorruptSnapshotError(f"{where} has no valid acknowledgements: {detail}") from err
    # A savepoint moved or copied here names the files of where it was written.
    return storage, metadata, relocated_to(storage, path, acks)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 3] + "..."


def _decoded(decode: Any, *args: Any) -> str:
    """The repr of a decoded key or value, or why it does not decode (a missing class...)."""
    try:
        return _short(decode(*args))
    except CorruptSnapshotError as err:
        return _short(f"<does not decode: {err}>")


def _describe_canonical(summary: HandleSummary, data: bytes, where: str, sample: int) -> None:
    snapshot = canonical.decode_snapshot(data, where)
    summary.layout = "canonical"
    summary.backend = snapshot.backend
    summary.max_parallelism = snapshot.max_parallelism
    summary.entries = snapshot.entry_count
    summary.key_groups = len(snapshot.key_groups())
    summary.watermarks = dict(snapshot.watermarks)
    sizes = snapshot.state_sizes()
    summary.states = [
        StateSummary(name, info.kind, info.serializer, *sizes[name])
        for name, info in snapshot.states.items()
    ]
    for key_group, name, key, value in snapshot.raw_entries():
        if len(summary.sample) >= sample:
            break
        info = snapshot.states[name]
        shown = (
            repr(DELETED)
            if value is None
            else _decoded(decode_value, info.kind, serializer_named(info.serializer), value)
        )
        summary.sample.append(SampleEntry(key_group, name, _decoded(decode_key, key), shown))


def _describe_columns(summary: HandleSummary, data: bytes, where: str, sample: int) -> None:
    snapshot = changelog_delta.decode_delta(data, where)
    summary.layout = "columns"
    summary.backend = "hashmap"
    summary.max_parallelism = snapshot.max_parallelism
    sizes = snapshot.sizes()
    summary.entries = sum(entries for entries, _ in sizes.values())
    summary.watermarks = dict(snapshot.watermarks)
    summary.states = [
        StateSummary(name, info.kind, info.serializer, *sizes[name])
        for name, info in snapshot.states.items()
    ]
    try:
        for name, key, value in snapshot.head(sample):
            group = key_group_for(key, snapshot.max_parallelism)
            summary.sample.append(SampleEntry(group, name, _short(key), _short(value)))
    except CorruptSnapshotError as err:
        summary.sample.append(SampleEntry(-1, "?", "?", _short(f"<does not decode: {err}>")))


def _describe_handle(
    storage: FileSystemCheckpointStorage,
    ack: SnapshotCompleted,
    handle: StateHandleModel,
    sample: int,
) -> HandleSummary:
    fmt: str | None = handle.format
    start, end = handle.key_group_start, handle.key_group_end
    summary = HandleSummary(
        operator_id=ack.operator_id,
        subtask=ack.subtask,
        location=handle.path or INLINE,
        format=fmt,
        layout="unknown",
        key_group_range=None if start is None or end is None else (start, end),
        size=handle.size,
        shared_files=len(handle.shared),
    )
    if fmt is not None and fmt not in (canonical.FORMAT_ID, changelog_delta.FORMAT_ID):
        summary.layout = "native" if fmt.startswith("rocksdb") else "unknown"
        if summary.layout == "native":
            summary.declared = [(d.name, d.kind, d.serializer) for d in handle.states]
            summary.native_size = ack.state_size if len(ack.handles) == 1 else None
        return summary
    where = f"state file {handle.path}" if handle.path else "inline state"
    where = f"{where} of {ack.operator_id}[{ack.subtask}]"
    data = storage.read_state(handle)  # size and checksum checked
    if canonical.is_canonical(data):
        _describe_canonical(summary, data, where, sample)
    elif changelog_delta.is_delta(data):
        _describe_columns(summary, data, where, sample)
    elif data[: len(LEGACY_MAGIC)] == LEGACY_MAGIC:
        summary.layout = "legacy-hashmap"
    elif fmt in (canonical.FORMAT_ID, changelog_delta.FORMAT_ID):
        raise CorruptSnapshotError(f"{where} records format {fmt} but is not in that format")
    return summary


def inspect_savepoint(path: str, sample: int = DEFAULT_SAMPLE) -> SavepointSummary:
    """Read the savepoint or checkpoint at ``path`` (see the module docstring).

    Args:
        path: the directory (or its ``_metadata``), a local path or a URL.
        sample: how many entries of each canonical handle to decode and show.

    Raises:
        CheckpointNotFoundError: no ``_metadata`` at ``path``.
        CorruptSnapshotError: unreadable metadata, or a state file that is missing, altered or
            does not decode (the message names the file, operator and subtask).
        StorageLocationError: a handle outside the directory (not self-contained).
    """
    storage, metadata, acks = _open(path)
    handles = [
        _describe_handle(storage, ack, handle, sample)
        for ack in sorted(acks, key=lambda a: (a.operator_id, a.subtask))
        for handle in ack.handles
    ]

    def optional_int(name: str) -> int | None:
        value = metadata.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    job_id, kind = metadata.get("job_id"), metadata.get("kind")
    return SavepointSummary(
        path=storage.base_url,
        metadata_format=metadata["format"],
        job_id=job_id if isinstance(job_id, str) else None,
        checkpoint_id=optional_int("checkpoint_id"),
        kind=kind if isinstance(kind, str) else None,
        attempt=optional_int("attempt"),
        completion_timestamp=optional_int("completion_timestamp"),
        handles=handles,
        operator_state=sorted(
            (a.operator_id, a.subtask, s.function, s.name, s.mode, s.values)
            for a in acks
            for s in a.operator_state
        ),
        stateless=sorted(
            (a.operator_id, a.subtask)
            for a in acks
            if not a.handles and not a.operator_state and not a.source_positions
        ),
        source_positions=sorted(
            (a.operator_id, a.subtask, split, offset)
            for a in acks
            for split, offset in a.source_positions.items()
        ),
    )


# ----------------------------------------------------------------------------- dispose


@dataclass(frozen=True)
class Disposal:
    """A directory found fit to delete (steps 1 and 2 of :func:`dispose_savepoint`), not yet
    deleted: the control plane checks it before it forgets the savepoint, then deletes it."""

    fs: Any
    directory: str  # the filesystem's path of the directory
    root: str  # its URL
    found: dict[str, Any]  # its files, with their details
    metadata: dict[str, Any]
    acks: list[SnapshotCompleted]

    @property
    def checkpoint_id(self) -> int | None:
        found = self.metadata.get("checkpoint_id")
        return found if isinstance(found, int) else None

    @property
    def kind(self) -> str | None:
        found = self.metadata.get("kind")
        return found if isinstance(found, str) else None

    @property
    def job_id(self) -> str | None:
        found = self.metadata.get("job_id")
        return found if isinstance(found, str) else None

    def carry_out(self) -> DisposeResult:
        """Steps 3 and 4 of :func:`dispose_savepoint`: ``_metadata`` first, then the rest
        (what is already gone, another disposal's doing, is no error)."""
        # Step 3
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(f"{self.directory}/{METADATA_FILE}")
        # Step 4
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.directory, recursive=True)
        shared = {ref.path for ack in self.acks for h in ack.handles for ref in h.shared}
        return DisposeResult(
            path=self.root,
            checkpoint_id=self.checkpoint_id,
            kind=self.kind,
            files=len(self.found),
            bytes=sum(int(info.get("size") or 0) for info in self.found.values()),
            shared_kept=len(shared),
        )


def plan_disposal(path: str) -> Disposal:
    """Steps 1 and 2 of :func:`dispose_savepoint`: what deleting ``path`` would delete.

    Raises:
        SavepointDisposeError: as :func:`dispose_savepoint`.
    """
    # Step 1
    try:
        storage, metadata, acks = _open(path)
    except (CheckpointNotFoundError, CorruptSnapshotError) as err:
        raise SavepointDisposeError(f"refusing to delete {path}: {err}") from err
    fs, root = storage.fs, storage.base_url
    directory = fs._strip_protocol(root).rstrip("/")
    # Step 2
    found = fs.find(directory, detail=True)
    for name in [directory, *found]:
        relative = posixpath.relpath(fs._strip_protocol(name), posixpath.dirname(directory))
        if SHARED_DIR in relative.split("/")[:-1] or relative == SHARED_DIR:
            raise SavepointDisposeError(
                f"refusing to delete {root}: it is or holds a {SHARED_DIR}/ directory "
                f"({relative}), a job's shared state, which no savepoint has"
            )
    return Disposal(fs, directory, root, found, metadata, acks)


def dispose_savepoint(path: str) -> DisposeResult:
    """Delete the savepoint or checkpoint directory at ``path``.

    Steps: (1) read ``_metadata`` (refused without a readable one), (2) list the directory's
    files, refusing a directory that holds a ``shared/`` directory (a job's directory, not a
    savepoint's), (3) delete ``_metadata`` first, so that an interrupted dispose never leaves
    something that looks like a savepoint, (4) delete the rest of the directory. Files the
    handles reference in the job's ``shared/`` directory lie outside it and are kept.

    Raises:
        SavepointDisposeError: no readable ``_metadata`` at ``path``, or a directory that is
            or holds a ``shared/`` directory (the message names the path).
    """
    return plan_disposal(path).carry_out()


class SavepointDisposeError(SparkpointError):
    """A directory that :func:`dispose_savepoint` refuses to delete."""


# ----------------------------------------------------------------------------- command line


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0, 1, 2...)")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``sparkpoint savepoint inspect | dispose``."""
    parser = argparse.ArgumentParser(
        prog="sparkpoint savepoint",
        description="Read or delete a savepoint or checkpoint directory (one with _metadata).",
    )
    sub = parser.add_subparsers(dest="tool", required=True)
    inspect = sub.add_parser("inspect", help="list a savepoint's operators, states and entries")
    inspect.add_argument("path", help="the savepoint or checkpoint directory (path or URL)")
    inspect.add_argument(
        "--sample",
        type=_count,
        default=DEFAULT_SAMPLE,
        help="entries to decode and show per state handle (0: none; decoding unpickles "
        f"pickle states, so only inspect savepoints you trust; default {DEFAULT_SAMPLE})",
    )
    inspect.add_argument(
        "--output", choices=("text", "json"), default="text", help="text (default) or JSON"
    )
    dispose = sub.add_parser(
        "dispose", help="delete a savepoint or checkpoint directory (never the job's shared/)"
    )
    dispose.add_argument("path", help="the savepoint or checkpoint directory (path or URL)")
    where = dispose.add_mutually_exclusive_group()
    where.add_argument(
        "--api",
        help="dispose through this control plane (default: $SPARKPOINT_API_URL when set), "
        "which also forgets it: no list offers it, no job restores it",
    )
    where.add_argument(
        "--local",
        action="store_true",
        help="delete the directory from here, even with $SPARKPOINT_API_URL set (a control "
        "plane that knew it goes on listing it)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """``sparkpoint savepoint inspect | dispose ...``; 0, or 2 with one line on stderr."""
    ns = build_parser().parse_args(argv)
    try:
        if ns.tool == "inspect":
            summary = inspect_savepoint(ns.path, ns.sample)
            if ns.output == "json":
                print(json.dumps(summary.to_json(), indent=2))
            else:
                print(render_text(summary))
            return 0
        api = None if ns.local else ns.api or os.environ.get("SPARKPOINT_API_URL")
        result = dispose_savepoint(ns.path) if api is None else _dispose_through(api, ns.path)
    except (SparkpointError, OSError) as err:
        detail = error_text(err)
        print(f"sparkpoint savepoint {ns.tool}: {detail}", file=sys.stderr)
        return EXIT_REFUSED
    what = f"disposed {result.kind or 'checkpoint'} {result.checkpoint_id}"
    if result.files:
        print(f"{what}: deleted {result.path} ({result.files} files, {format_size(result.bytes)})")
    else:  # the control plane knew it, its files had gone another way
        print(f"{what}: its files at {result.path} were already gone")
    if result.shared_kept:
        plural = "s" if result.shared_kept != 1 else ""
        print(f"kept {result.shared_kept} referenced shared file{plural} in the job's shared/")
    if api is not None:
        print(f"the control plane at {api.rstrip('/')} no longer lists or restores it")
    return 0


def _dispose_through(api: str, path: str) -> DisposeResult:
    """``POST /savepoint-disposal`` (the control plane checks, forgets and deletes)."""
    from sparkpoint.rest_client import ControlPlaneClient, find_api_token

    found = find_api_token()
    client = ControlPlaneClient(api, found.token, timeout_s=60.0, unauthorized_hint=found.hint())
    try:
        # A local path as the server sees it (the CLI runs on its machine or shares the path).
        target = absolute(path)
        done = client.request("POST", "/savepoint-disposal", json={"savepoint-path": target})
    finally:
        client.close()
    return DisposeResult(
        path=done["path"],
        checkpoint_id=done.get("checkpoint-id"),
        kind=done.get("kind"),
        files=int(done.get("files") or 0),
        bytes=int(done.get("bytes") or 0),
        shared_kept=int(done.get("shared-files-kept") or 0),
    )
