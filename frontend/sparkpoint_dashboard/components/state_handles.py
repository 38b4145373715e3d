"""The checkpoint page's table of state handles: what each subtask's snapshot wrote (a file, a
shared incremental file, inline bytes), in which format, how large, with its checksum."""

from __future__ import annotations

from typing import Any

from sparkpoint_dashboard.components.widgets import number_column
from sparkpoint_dashboard.units import DASH, fmt_bytes

HANDLE_COLUMNS: list[dict[str, Any]] = [
    {"field": "operator", "headerName": "Operator", "minWidth": 120},
    {"field": "subtask", "headerName": "Subtask", "type": "numericColumn", "minWidth": 90},
    {"field": "kind", "headerName": "Kind", "minWidth": 260, "tooltipField": "kind"},
    {"field": "name", "headerName": "Name", "minWidth": 130},
    {"field": "path", "headerName": "Path", "tooltipField": "path", "minWidth": 330},
    number_column("size", "Size", minWidth=90),
    number_column("shared_size", "Shared files", minWidth=150),
    {
        "field": "checksum_short",
        "headerName": "Checksum",
        "tooltipField": "checksum",
        "minWidth": 190,
    },
]

_FORMATS = {
    "sparkpoint-keyed-state-v1": "canonical snapshot",
    "rocksdb-native-v1": "RocksDB files",
}


def handle_kind(handle: dict[str, Any]) -> str:
    """What a state handle holds: inline bytes, a shared (incremental) file, keyed state of a
    key-group range, or operator state; and in which format (canonical, RocksDB's own)."""
    if handle.get("inline"):
        return "inline (in the metadata)"
    start, end = handle.get("key_group_start"), handle.get("key_group_end")
    keyed = f"keyed state, key groups {start} to {end}" if start is not None else "operator state"
    fmt = handle.get("format")
    if fmt:
        keyed += f", {_FORMATS.get(fmt, fmt)}"
    if "/shared/" in (handle.get("path") or ""):
        return f"shared file ({keyed})"
    return keyed


def shared_text(handle: dict[str, Any]) -> str:
    """``"12 files, 3.1 MB"``: the files of the job's shared/ directory a handle references."""
    n = handle.get("shared_files") or 0
    if not n:
        return DASH
    return f"{n} file{'s' if n != 1 else ''}, {fmt_bytes(handle.get('shared_size'))}"


def short_checksum(checksum: str | None) -> str:
    """``"sha256:abf5025e50df"`` (the algorithm and the first 12 hex digits)."""
    if not checksum:
        return DASH
    algo, _, digest = checksum.partition(":")
    return f"{algo}:{digest[:12]}" if digest else checksum[:12]


def handle_rows(operators: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every state handle of every subtask, from the subtasks answers."""
    rows = []
    for op in operators:
        for sub in op.get("subtasks") or []:
            for n, handle in enumerate(sub.get("handles") or []):
                path = handle.get("path") or ""
                rows.append(
                    {
                        "id": f"{op['id']}/{sub['index']}/{n}",
                        "operator": op.get("name") or op["id"],
                        "subtask": sub["index"],
                        "kind": handle_kind(handle),
                        "name": path.rstrip("/").rsplit("/", 1)[-1] if path else "(inline)",
                        "path": path or "(inline in _metadata)",
                        "size": handle.get("size"),
                        "size_text": fmt_bytes(handle.get("size")),
                        "shared_size": handle.get("shared_size") or 0,
                        "shared_size_text": shared_text(handle),
                        "checksum": handle.get("checksum") or "",
                        "checksum_short": short_checksum(handle.get("checksum")),
                    }
                )
    return rows
