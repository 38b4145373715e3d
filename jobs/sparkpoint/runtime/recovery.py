"""What a restore starts from: a completed checkpoint in memory or its ``_metadata``.

:func:`checkpoint_metadata` writes what :func:`restore_point_from_metadata` reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.storage import CheckpointStorage, FileSystemCheckpointStorage
from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
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


def restore_point_from_metadata(storage: CheckpointStorage, path: str) -> RestorePoint:
    """Read a checkpoint's ``_metadata`` (the chk directory or the file) into a RestorePoint.

    Raises:
        CheckpointNotFoundError: there is no ``_metadata`` at ``path``.
        CorruptSnapshotError: the metadata is not a Sparkpoint checkpoint's.
    """
    meta = storage.read_metadata(path)
    try:
        if meta.get("format") != "sparkpoint-checkpoint/1":
            raise ValueError(f"unknown format {meta.get('format')!r}")
        acks = tuple(p.SnapshotCompleted.model_validate(a) for a in meta["acks"])
        return RestorePoint(int(meta["checkpoint_id"]), int(meta["attempt"]), acks, path)
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptSnapshotError(f"{path}: not a valid Sparkpoint checkpoint: {err}") from err


def check_restore_point(point: RestorePoint, graph: JobGraph) -> None:
    """Refuse a checkpoint that does not fit the job: state of operators the job lacks, or
    source positions of splits other than the job's (a silent mismatch would lose state or
    replay input from the start).

    Raises:
        ConfigurationError: naming the checkpoint and what does not match.
    """
    tasks = graph.tasks()
    unknown = sorted({a.operator_id for a in point.acks} - set(tasks))
    if unknown:
        raise ConfigurationError(
            f"checkpoint {point.checkpoint_id} ({point.external_path}) has state of operators "
            f"{unknown} that this job does not have (its operators: {sorted(tasks)})"
        )
    splits = set(graph.source.source.split_ids())
    positions = set(point.source_positions())
    if positions != splits:
        raise ConfigurationError(
            f"checkpoint {point.checkpoint_id} ({point.external_path}) has positions of source "
            f"splits {sorted(positions)}, but the job's source has {sorted(splits)}"
        )


def storage_for_checkpoint_path(path: str) -> CheckpointStorage:
    """A storage rooted where a checkpoint lives (``<base>/<job-id>/chk-<n>[/_metadata]``), so
    that its handles can be read by a job whose own checkpoint directory is elsewhere."""
    trimmed = path.rstrip("/")
    if trimmed.endswith("/_metadata"):
        trimmed = trimmed[: -len("/_metadata")]
    base = trimmed.rsplit("/", 2)[0]
    return FileSystemCheckpointStorage(base)


def checkpoint_metadata(job_id: str, cp: CompletedCheckpoint) -> dict[str, Any]:
    """The ``_metadata`` of a completed checkpoint: everything a restore from its path needs."""
    return {
        "format": "sparkpoint-checkpoint/1",
        "job_id": job_id,
        "checkpoint_id": cp.checkpoint_id,
        "kind": cp.kind.value,
        "attempt": cp.attempt,
        "is_final": cp.is_final,
        "trigger_timestamp": cp.trigger_timestamp,
        "completion_timestamp": cp.completion_timestamp,
        "acks": [a.model_dump(mode="json") for a in cp.acks.values()],
    }
