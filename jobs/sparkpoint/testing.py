"""Test helpers that ship with the library: in-memory sources, failure injection, output checks.

A test runs a job, fails it at a chosen point, lets it restore, and compares the committed
output with that of a run that never failed::

    baseline = committed_lines(run_dir_a)
    JobDriver(graph, options, spark=spark,
              failure=FailureInjection("keyed", subtask=0, records=500, at_epoch=3)).run()
    assert Counter(committed_lines(run_dir_b)) == Counter(baseline)
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkpoint.connectors.sources import Source
from sparkpoint.records import Batch
from sparkpoint.runtime.plan import FailureInjection

__all__ = [
    "FailureInjection",
    "ListSource",
    "committed_files",
    "committed_lines",
    "line_counts",
    "uncommitted_files",
]


@dataclass(frozen=True)
class ListSource(Source):
    """Records from a list, dealt round-robin over ``splits`` splits; offsets are positions.
    Not ``bounded``: the source never ends (no total), as an unbounded source that has
    nothing after these records."""

    records: tuple[Any, ...]
    splits: int = 2
    bounded: bool = True

    def split_ids(self) -> list[str]:
        return [f"list-{i}" for i in range(self.splits)]

    def _split(self, split: int) -> Sequence[Any]:
        return self.records[split :: self.splits]

    def total(self, split: int) -> int | None:
        return len(self._split(split)) if self.bounded else None

    def available(self, split: int, elapsed_s: float) -> int | None:
        return len(self._split(split))

    def read(self, split: int, start: int, end: int) -> Batch:
        return Batch.of_rows(list(self._split(split)[start:end]))


def committed_files(directory: str) -> list[str]:
    """Committed output: files whose names do not start with ``.`` or ``_``."""
    if not os.path.isdir(directory):
        return []
    return sorted(
        os.path.join(directory, n) for n in os.listdir(directory) if not n.startswith((".", "_"))
    )


def uncommitted_files(directory: str) -> list[str]:
    """In-progress and pre-committed parts (hidden names)."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


def committed_lines(directory: str) -> list[str]:
    """Every line of the committed output, in file-name order."""
    lines: list[str] = []
    for path in committed_files(directory):
        with open(path, encoding="utf-8") as fh:
            lines.extend(fh.read().splitlines())
    return lines


def line_counts(directory: str) -> Counter[str]:
    """The committed output as a multiset of lines (order between files is not defined)."""
    return Counter(committed_lines(directory))


@dataclass
class MemorySnapshotTarget:
    """A snapshot target that keeps what a backend's snapshot writes in memory: the blobs
    (canonical, or a hashmap checkpoint's columns) in ``blobs`` (handles are real, with size
    and checksum, and inline bytes)."""

    checkpoint_id: int = 1
    key_group_range: Any = None
    incremental: bool = False

    def __post_init__(self) -> None:
        self.blobs: list[bytes] = []

    def write(self, data: bytes, *, fmt: str) -> Any:
        import base64

        from sparkpoint.checkpointing.storage_base import state_handle

        self.blobs.append(bytes(data))
        handle = state_handle(data, self.key_group_range, inline=base64.b64encode(data).decode())
        return handle.model_copy(update={"format": fmt})

    def write_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("MemorySnapshotTarget keeps canonical snapshots only")


def snapshot_blob(backend: Any, checkpoint_id: int = 1, *, native: bool = False) -> bytes:
    """A backend's canonical snapshot (``native``: a checkpoint in a format of the backend's
    own that is one blob, the hashmap's), both phases run at once (for tests)."""
    capture = backend.snapshot(checkpoint_id, native=native)
    target = MemorySnapshotTarget(checkpoint_id, backend.key_group_range)
    try:
        capture.materialize(target)
    finally:
        capture.release()
    (blob,) = target.blobs
    return blob
