"""``sparkpoint savepoint inspect | dispose PATH``: what a savepoint or checkpoint holds, and
deleting one (Flink's ``flink savepoint --dispose``).

PATH is a savepoint or retained checkpoint directory, a local path or a URL (``file://``...),
holding ``_metadata``. :func:`inspect_savepoint` reads the metadata and every state handle
(checking each file's size and checksum) and returns a :class:`SavepointSummary`: per operator
uid and subtask, each handle's format, key group range and size and, for canonical keyed state
(:mod:`sparkpoint.state.canonical`) and ``hashmap`` checkpoints (their columns,
:mod:`sparkpoint.state.changelog_delta`), its states and a sample of decoded entries. Other
handles (RocksDB native snapshots, legacy ``SPKS`` hashmap snapshots) are listed with their
format and size only. :func:`render_text` and :meth:`SavepointSummary.to_json` show a summary.

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
import dataclasses
import json
import posixpath
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sparkpoint.checkpointing.relocation import relocated
from sparkpoint.checkpointing.storage import METADATA_FILE, SHARED_DIR, FileSystemCheckpointStorage
from sparkpoint.checkpointing.storage_base import format_size
from sparkpoint.errors import CheckpointNotFoundError, CorruptSnapshotError, SparkpointError
from sparkpoint.protocol import SnapshotCompleted, StateHandleModel
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
INLINE = "inline state"  # the location of a handle whose bytes are in the metadata


@dataclass(frozen=True)
class StateSummary:
    """One state of a canonical handle: its kind, serializer, entries and bytes."""

    name: str
    kind: str
    serializer: str
    entries: int
    bytes: int


@dataclass(frozen=True)
class SampleEntry:
    """One decoded entry, its key and value as reprs cut to :data:`REPR_LIMIT` characters."""

    key_group: int
    state: str
    key: str
    value: str


@dataclass
class HandleSummary:
    """One state handle of one subtask.

    ``format`` is what the handle records (None before handles recorded it); ``layout`` what
    the bytes are: ``canonical``, ``columns`` (a ``hashmap`` checkpoint), ``legacy-hashmap``,
    ``native`` (not read) or ``unknown``.
    """

    operator_id: str
    subtask: int
    location: str
    format: str | None
    layout: str
    key_group_range: tuple[int, int] | None
    size: int
    shared_files: int = 0
    backend: str | None = None
    max_parallelism: int | None = None
    entries: int | None = None
    key_groups: int | None = None
    watermarks: dict[int, int] = field(default_factory=dict)
    states: list[StateSummary] = field(default_factory=list)
    sample: list[SampleEntry] = field(default_factory=list)


@dataclass
class SavepointSummary:
    """What ``_metadata`` and the state handles of a savepoint or checkpoint say."""

    path: str
    metadata_format: str
    job_id: str | None
    checkpoint_id: int | None
    kind: str | None
    attempt: int | None
    completion_timestamp: int | None
    handles: list[HandleSummary]
    # (vertex uid, subtask, function uid, state name, mode, values or entries) of each operator
    # list state and broadcast state
    operator_state: list[tuple[str, int, str, str, str, int]]
    stateless: list[tuple[str, int]]  # (operator uid, subtask) of acks without any state

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON-ready data."""
        return dataclasses.asdict(self)


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
    return storage, metadata, relocated(acks, storage.base_url, storage.fs.isfile)


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
            (a.operator_id, a.subtask) for a in acks if not a.handles and not a.operator_state
        ),
    )


# ----------------------------------------------------------------------------- text


def _location(summary: SavepointSummary, location: str) -> str:
    prefix = summary.path.rstrip("/") + "/"
    return location[len(prefix) :] if location.startswith(prefix) else location


_UNRECORDED = {
    "canonical": canonical.FORMAT_ID,
    "columns": changelog_delta.FORMAT_ID,
    "legacy-hashmap": "legacy hashmap snapshot",
    "unknown": "unknown",
}


def render_text(summary: SavepointSummary) -> str:
    """The summary for a terminal."""
    what = summary.kind or "checkpoint (kind not recorded)"
    lines = [f"{what} {summary.checkpoint_id} of job {summary.job_id}"]
    lines.append(f"  path: {summary.path}")
    details = [f"metadata {summary.metadata_format}"]
    if summary.attempt is not None:
        details.append(f"attempt {summary.attempt}")
    if summary.completion_timestamp is not None:
        when = datetime.fromtimestamp(summary.completion_timestamp / 1000, UTC)
        details.append(f"completed {when:%Y-%m-%d %H:%M:%S} UTC")
    total = sum(h.size for h in summary.handles)
    details.append(f"{len(summary.handles)} state handles, {format_size(total)}")
    lines.append("  " + ", ".join(details))
    for h in summary.handles:
        kg = "" if h.key_group_range is None else f", key groups {list(h.key_group_range)}"
        fmt = h.format or f"{_UNRECORDED[h.layout]} (no format recorded)"
        lines.append(
            f"operator {h.operator_id}, subtask {h.subtask}: {fmt}{kg}, {format_size(h.size)}"
        )
        where = _location(summary, h.location)
        lines.append(f"  {where}" if h.location == INLINE else f"  file {where}")
        if h.shared_files:
            lines.append(f"  shared files referenced: {h.shared_files}")
        if h.layout not in ("canonical", "columns"):
            continue
        groups = "" if h.key_groups is None else f" in {h.key_groups} key groups"
        lines.append(
            f"  backend {h.backend}, max parallelism {h.max_parallelism}, {h.entries} entries"
            + groups
        )
        if h.watermarks:
            lines.append(f"  channel watermarks {h.watermarks}")
        rows = [("state", "kind", "serializer", "entries", "bytes")] + [
            (s.name, s.kind, s.serializer, str(s.entries), str(s.bytes)) for s in h.states
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            left = "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=False))
            right = "  ".join(cell.rjust(w) for cell, w in zip(row[3:], widths[3:], strict=True))
            lines.append(f"    {left}  {right}")
        if h.sample:
            lines.append(f"  sample ({len(h.sample)} of {h.entries}):")
            lines.extend(
                f"    [key group {e.key_group}] {e.state} {e.key} = {e.value}" for e in h.sample
            )
    for vertex, subtask, function, name, mode, values in summary.operator_state:
        what = (
            f"broadcast state {name!r}, {values} entries"
            if mode == "broadcast"
            else f"list {name!r} ({mode}), {values} values"
        )
        lines.append(f"operator {vertex}, subtask {subtask}: operator state of {function}, {what}")
    for operator_id, subtask in summary.stateless:
        lines.append(f"operator {operator_id}, subtask {subtask}: no state")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- dispose


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
    # Step 3
    fs.rm(f"{directory}/{METADATA_FILE}")
    # Step 4
    fs.rm(directory, recursive=True)
    shared = {ref.path for ack in acks for h in ack.handles for ref in h.shared}
    checkpoint_id = metadata.get("checkpoint_id")
    return DisposeResult(
        path=root,
        checkpoint_id=checkpoint_id if isinstance(checkpoint_id, int) else None,
        kind=metadata.get("kind") if isinstance(metadata.get("kind"), str) else None,
        files=len(found),
        bytes=sum(int(info.get("size") or 0) for info in found.values()),
        shared_kept=len(shared),
    )


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
        result = dispose_savepoint(ns.path)
    except (SparkpointError, OSError) as err:
        detail = " ".join(str(err).split()) or type(err).__name__
        print(f"sparkpoint savepoint {ns.tool}: {detail}", file=sys.stderr)
        return EXIT_REFUSED
    what = result.kind or "checkpoint"
    print(
        f"disposed {what} {result.checkpoint_id}: deleted {result.path} "
        f"({result.files} files, {format_size(result.bytes)})"
    )
    if result.shared_kept:
        plural = "s" if result.shared_kept != 1 else ""
        print(f"kept {result.shared_kept} referenced shared file{plural} in the job's shared/")
    return 0
