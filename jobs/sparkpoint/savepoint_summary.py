"""What ``sparkpoint savepoint inspect`` found, and how it reads on a terminal.

:func:`~sparkpoint.savepoint_tool.inspect_savepoint` fills a :class:`SavepointSummary`;
:func:`render_text` shows it, :meth:`SavepointSummary.to_json` gives it as data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sparkpoint.checkpointing.storage_base import format_size
from sparkpoint.state import canonical, changelog_delta

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
    """One decoded entry, its key and value as reprs cut to
    :data:`~sparkpoint.savepoint_tool.REPR_LIMIT` characters."""

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
    # A native snapshot (not read): the states ``_metadata`` declares for it, as (name, kind,
    # serializer), and the bytes its files hold in all (the subtask's state size).
    declared: list[tuple[str, str, str]] = field(default_factory=list)
    native_size: int | None = None


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
    # (source uid, subtask, split, offset): where each split of a source resumes
    source_positions: list[tuple[str, int, str, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The summary as JSON-ready data."""
        return dataclasses.asdict(self)


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
        if h.layout == "native":
            lines.extend(_native_lines(h))
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
        lines.extend(_table(rows, text_columns=3))
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
    for operator_id, subtask, split, offset in summary.source_positions:
        lines.append(
            f"operator {operator_id}, subtask {subtask}: source split {split} resumes at "
            f"offset {offset:,}"
        )
    for operator_id, subtask in summary.stateless:
        lines.append(f"operator {operator_id}, subtask {subtask}: no state")
    return "\n".join(lines)


def _native_lines(h: HandleSummary) -> list[str]:
    """What is known of a native snapshot without reading its files."""
    size = "" if h.native_size is None else f", {format_size(h.native_size)} in all"
    lines = [f"  RocksDB's own files{size}, not read here (a savepoint of the job shows entries)"]
    if h.declared:
        lines.extend(_table([("state", "kind", "serializer"), *h.declared], text_columns=3))
    return lines


def _table(rows: Sequence[tuple[str, ...]], text_columns: int) -> list[str]:
    """``rows`` as indented lines of aligned columns: the first ``text_columns`` to the left,
    the rest (numbers) to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "    "
        + "  ".join(
            cell.ljust(w) if i < text_columns else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
