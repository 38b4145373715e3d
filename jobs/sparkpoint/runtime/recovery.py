"""What a restore starts from: a completed checkpoint in memory or its ``_metadata``.

:func:`~sparkpoint.checkpointing.pending.checkpoint_metadata` writes what
:func:`restore_point_from_metadata` reads back.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fsspec.core import split_protocol

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.pending import checkpoint_metadata as checkpoint_metadata
from sparkpoint.checkpointing.relocation import relocated_to
from sparkpoint.checkpointing.storage import CheckpointStorage, FileSystemCheckpointStorage
from sparkpoint.errors import ConfigurationError, CorruptSnapshotError, StorageLocationError
from sparkpoint.graph import JobGraph


@dataclass(frozen=True)
class RestorePoint:
    """A checkpoint's acknowledgements: handles, source positions and sink transactions."""

    checkpoint_id: int
    attempt: int
    acks: tuple[p.SnapshotCompleted, ...]
    external_path: str | None = None

    @classmethod
    def of(cls, cp: CompletedCheckpoint) -> RestorePoint:
        return cls(cp.checkpoint_id, cp.attempt, tuple(cp.acks.values()), cp.external_path)

    def source_positions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ack in self.acks:
            out.update(ack.source_positions)
        return out

    def handles(self, operator_id: str) -> tuple[p.StateHandleModel, ...]:
        return tuple(h for a in self.acks if a.operator_id == operator_id for h in a.handles)

    def operator_state(self, operator_id: str) -> tuple[p.OperatorStateModel, ...]:
        """Vertex ``operator_id``'s operator state, every subtask's."""
        return tuple(s for a in self.acks if a.operator_id == operator_id for s in a.operator_state)


def restore_point_from_metadata(storage: FileSystemCheckpointStorage, path: str) -> RestorePoint:
    """Read a checkpoint's ``_metadata`` (the chk directory or the file) into a RestorePoint.

    Raises:
        CheckpointNotFoundError: there is no ``_metadata`` at ``path``.
        CorruptSnapshotError: the metadata is not a Sparkpoint checkpoint's.
    """
    meta = storage.read_metadata(path)
    try:
        if meta.get("format") != "sparkpoint-checkpoint/1":
            raise ValueError(f"unknown format {meta.get('format')!r}")
        acks = [p.SnapshotCompleted.model_validate(a) for a in meta["acks"]]
        checkpoint_id, attempt = int(meta["checkpoint_id"]), int(meta["attempt"])
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptSnapshotError(f"{path}: not a valid Sparkpoint checkpoint: {err}") from err
    acks = relocated_to(storage, path, acks)  # a savepoint moved or copied here
    return RestorePoint(checkpoint_id, attempt, tuple(acks), path)


def check_restore_point(
    point: RestorePoint, graph: JobGraph, *, allow_non_restored_state: bool = False
) -> RestorePoint:
    """Refuse a checkpoint that does not fit the job: state of operators the job lacks
    (unless ``allow_non_restored_state``: that state is then skipped, as Flink's
    ``--allowNonRestoredState``), keyed state taken with another max parallelism, or source
    positions of splits other than the job's (a silent mismatch would lose state or replay
    input from the start).

    Returns:
        The point to restore: without the operators the job lacks, when those are allowed.

    Raises:
        ConfigurationError: naming the checkpoint and what does not match.
    """
    tasks = graph.tasks()
    unknown = sorted({a.operator_id for a in point.acks} - set(tasks))
    if unknown and not allow_non_restored_state:
        raise ConfigurationError(
            f"checkpoint {point.checkpoint_id} ({point.external_path}) has state of operators "
            f"{unknown} that this job does not have (its operators: {sorted(tasks)}); to "
            "restore the rest and drop that state, run with --allow-non-restored-state"
        )
    if unknown:
        kept = tuple(a for a in point.acks if a.operator_id in tasks)
        point = RestorePoint(point.checkpoint_id, point.attempt, kept, point.external_path)
    held = {s.function for a in point.acks for s in a.operator_state}
    functions = graph.function_uids() if held else set()
    stale = sorted(held - functions)
    if stale and not allow_non_restored_state:
        raise ConfigurationError(
            f"checkpoint {point.checkpoint_id} ({point.external_path}) has operator state of "
            f"functions {stale} that this job does not have (its checkpointed functions: "
            f"{sorted(functions)}); to restore the rest and drop that state, run with "
            "--allow-non-restored-state"
        )
    if stale:
        kept = tuple(
            a.model_copy(
                update={"operator_state": [s for s in a.operator_state if s.function in functions]}
            )
            for a in point.acks
        )
        point = RestorePoint(point.checkpoint_id, point.attempt, kept, point.external_path)
    keyed = {v.uid: v.max_parallelism for v in graph.keyed_vertices}
    changed = max_parallelism_changed(point, keyed)
    if changed is not None:
        operator, found, expected = changed
        raise ConfigurationError(
            f"{_named(point)} holds the keyed state of {operator} with max parallelism "
            f"{found}, and this job's is {expected}: every key would change key group. Run "
            f"with --max-parallelism {found}, the value it was taken with (Flink's "
            "pipeline.max-parallelism; it cannot change across a restore)"
        )
    splits = set(graph.split_ids())
    positions = set(point.source_positions())
    if positions != splits:
        raise ConfigurationError(
            f"checkpoint {point.checkpoint_id} ({point.external_path}) has positions of source "
            f"splits {sorted(positions)}, but the job's source has {sorted(splits)}"
        )
    return point


def max_parallelism_changed(
    point: RestorePoint, expected: Mapping[str, int | None]
) -> tuple[str, int, int] | None:
    """The first keyed operator whose state in ``point`` was taken with another max
    parallelism than ``expected`` gives it (operator id -> max parallelism): (operator, the
    checkpoint's, the expected), or None. Key groups are the key's hash modulo the max
    parallelism, so such state cannot be restored (Flink refuses it too). Snapshots that did
    not record theirs are checked as each subtask restores them."""
    for ack in point.acks:
        want = expected.get(ack.operator_id)
        for handle in ack.handles:
            found = handle.max_parallelism
            if want is not None and found is not None and found != want:
                return ack.operator_id, found, want
    return None


def _named(point: RestorePoint) -> str:
    where = f" ({point.external_path})" if point.external_path else ""
    return f"checkpoint {point.checkpoint_id}{where}"


def newest_restorable(
    checkpoints: Iterable[CompletedCheckpoint], storage: CheckpointStorage
) -> tuple[CompletedCheckpoint | None, list[str]]:
    """The newest of ``checkpoints`` whose state files verify, and why each newer one was
    skipped: a corrupt or missing state file (a lost shared file of incremental state) makes
    a checkpoint fail every restore, so "the latest" falls back to the newest that verifies.

    Files are checked by size (small ones by checksum too, see
    :meth:`CheckpointStorage.verify_handles`); a savepoint's in its own directory.

    Returns:
        (the checkpoint, or None when none verifies or there is none; one line per skipped
        checkpoint, newest first, naming it and the file).
    """
    skipped = []
    for cp in sorted(checkpoints, key=lambda c: c.checkpoint_id, reverse=True):
        where = (
            storage_for_checkpoint_path(cp.external_path)
            if cp.is_savepoint and cp.external_path
            else storage
        )
        try:
            where.verify_handles(h for ack in cp.acks.values() for h in ack.handles)
        except (CorruptSnapshotError, StorageLocationError) as err:
            skipped.append(f"{cp.kind.value} {cp.checkpoint_id} cannot be restored: {err}")
            continue
        return cp, skipped
    return None, skipped


def verify_restore_point(point: RestorePoint, storage: CheckpointStorage) -> None:
    """Refuse a checkpoint to restore whose state files are missing or altered, before the
    job starts (else every epoch would fail reading them).

    Raises:
        CorruptSnapshotError: naming the checkpoint's path and the file.
    """
    try:
        storage.verify_handles(h for ack in point.acks for h in ack.handles)
    except (CorruptSnapshotError, StorageLocationError) as err:
        raise CorruptSnapshotError(
            f"checkpoint {point.checkpoint_id} ({point.external_path}) cannot be restored: {err}"
        ) from err


def storage_for_checkpoint_path(path: str) -> FileSystemCheckpointStorage:
    """A storage rooted where a checkpoint lives (``<base>/<job-id>/chk-<n>[/_metadata]``), so
    that its handles can be read by a job whose own checkpoint directory is elsewhere (or that
    keeps its checkpoints in memory). A path too short for that layout is rooted at its
    filesystem's root (an object store's: its bucket)."""
    trimmed = path.rstrip("/")
    if trimmed.endswith("/_metadata"):
        trimmed = trimmed[: -len("/_metadata")]
    protocol, rest = split_protocol(trimmed)
    top = "" if protocol in (None, "file", "local") else rest.lstrip("/").split("/", 1)[0]
    base = posixpath.dirname(posixpath.dirname(rest))
    if len(base.strip("/")) <= len(top):
        base = f"{top}/" if top else "/"
    return FileSystemCheckpointStorage(f"{protocol}://{base}" if protocol else base)
