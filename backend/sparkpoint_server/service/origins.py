"""Where a job's current line of checkpoints starts (its
:class:`~sparkpoint_server.coordination.job.Origin`), and which retained checkpoint is the one at
a path.

A failover restores the newest checkpoint of the line (:func:`candidates`); a
checkpoint named by its path is the store's only when it is at that path, since checkpoint ids
are each job's own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.runtime.recovery import RestorePoint
from sparkpoint_server.coordination.job import ORIGIN_PIN, JobRuntime, Origin
from sparkpoint_server.service import storage_io
from sparkpoint_server.service.storage_io import Location
from sparkpoint_server.storage.models import Checkpoint


def held(rt: JobRuntime, checkpoint_id: int, path: str | None) -> CompletedCheckpoint | None:
    """The job's retained checkpoint ``checkpoint_id`` if it is the one at ``path`` (None: any
    location). Ids are a job's own: another job's checkpoint or savepoint may have one of its
    ids, and restoring by its path must not restore the job's own checkpoint of that id."""
    cp = rt.coordinator.store.get(checkpoint_id)
    return cp if cp is not None and same_place(cp.external_path, path) else None


def same_place(path: str | None, where: str | None) -> bool:
    """Whether a checkpoint at ``path`` (None: inline) is at ``where`` (None: any place),
    however either is spelled (:func:`~.storage_io.same_place`)."""
    if where is None:
        return True
    return path is not None and storage_io.same_place(path, where)


def in_line(origin: Origin, checkpoint_id: int, *, is_origin: bool, origin_held: bool) -> bool:
    """Whether a retained checkpoint is of the line that starts at ``origin`` (``is_origin``:
    it is the origin; ``origin_held``: the job's store holds the origin): one completed since,
    the origin itself, or, when the origin is the job's own, one older than it (a failover
    falls back to those when the newer ones' files are damaged, as it always did). Not: one
    completed before the restore that is newer than the origin (the restore went back past
    it), nor, when the origin is another job's checkpoint or a savepoint read by its path, any
    completed before it."""
    if checkpoint_id >= origin.next_id or is_origin:
        return True
    return origin_held and checkpoint_id < origin.checkpoint_id


def candidates(rt: JobRuntime) -> list[CompletedCheckpoint]:
    """Under the lock: the retained checkpoints a failover may restore, newest first: those
    of the job's current line (:func:`~.origins.in_line`: not one that a restore went back
    past), not those whose ``_metadata`` is still being written (a failover takes them back).
    None left: the failover restores the origin by its path, or the beginning."""
    origin = rt.origin
    own = held(rt, origin.checkpoint_id, origin.path) if origin is not None else None
    kept = (
        cp
        for cp in rt.coordinator.store.all()
        if cp.checkpoint_id not in rt.finalizing
        and (
            origin is None
            or in_line(origin, cp.checkpoint_id, is_origin=cp is own, origin_held=own is not None)
        )
    )
    return sorted(kept, key=lambda cp: cp.checkpoint_id, reverse=True)


def relied_on(
    jobs: Iterable[JobRuntime], cp: CompletedCheckpoint, starting: Collection[Location] = ()
) -> str | None:
    """Under the lock: who would restore checkpoint ``cp`` by its path, or None: a live job
    that started from it or restored it and has no checkpoint of its line since (another
    job, or its owner once it restored one that retention had already kept), or a job whose
    registration or restore request read it and is not applied yet (``starting``: where
    those read). Retention keeps such a checkpoint pinned (:data:`ORIGIN_PIN`) instead of
    deleting it; Flink's restore mode NO_CLAIM leaves it to its owner, whose retention may
    delete it before the new job's first checkpoint."""
    if cp.external_path is None:
        return None
    if starting and storage_io.aliases(cp.external_path) & set(starting):
        return "a job starting from it"
    for rt in jobs:
        origin = rt.origin
        if (
            rt.active
            and origin is not None
            and origin.path is not None
            and same_place(cp.external_path, origin.path)
            and not candidates(rt)
        ):
            return f"job {rt.job_id}"
    return None


def released_pins(
    jobs: dict[str, JobRuntime], starting: Collection[Location] = ()
) -> list[tuple[JobRuntime, int]]:
    """Under the lock: the checkpoints kept for a job's origin that no job needs any more (it
    completed a checkpoint, restored another or ended): unpin and delete them."""
    return [
        (rt, cp.checkpoint_id)
        for rt in jobs.values()
        for cp in rt.coordinator.store.subsumed_pinned()
        if ORIGIN_PIN in rt.coordinator.store.pins(cp.checkpoint_id)
        and relied_on(jobs.values(), cp, starting) is None
    ]


def deleted_at(session: Session, path: str) -> str | None:
    """Under the lock: which checkpoint of a job retention or a disposal deleted at ``path``
    (``"checkpoint N of job J"``), or None. A registration or a restore that read it before
    it was deleted, outside the lock, must not start from it now."""
    bare = path.rstrip("/").removesuffix("/_metadata")
    spellings = {bare, f"file://{bare}"} if bare.startswith("/") else {bare}
    if bare.startswith("file://"):
        spellings.add(bare.removeprefix("file://"))
    row = session.execute(
        select(Checkpoint.job_id, Checkpoint.checkpoint_id).where(
            Checkpoint.external_path.in_(sorted(spellings)), Checkpoint.discarded.is_(True)
        )
    ).first()
    return None if row is None else f"checkpoint {row.checkpoint_id} of job {row.job_id}"


def columns(origin: Origin | None) -> dict[str, Any]:
    """The job row's columns of an :class:`Origin`."""
    return {
        "origin_checkpoint_id": origin.checkpoint_id if origin else None,
        "origin_path": origin.path if origin else None,
        "origin_next_id": origin.next_id if origin else None,
    }


def read_from_path(point: RestorePoint) -> CompletedCheckpoint:
    """A checkpoint read from its path (``_metadata``) as one to restore: a savepoint, since
    the job's store does not hold it (or holds another of that id)."""
    return CompletedCheckpoint(
        checkpoint_id=point.checkpoint_id,
        kind=p.CheckpointKind.SAVEPOINT,
        attempt=point.attempt,
        trigger_timestamp=0,
        completion_timestamp=0,
        end_to_end_duration_ms=0.0,
        is_final=False,
        acks={(a.operator_id, a.subtask): a for a in point.acks},
        external_path=point.external_path,
    )


def restore_command(
    rt: JobRuntime,
    cp: CompletedCheckpoint | None,
    attempt: int,
    request_id: str | None,
    cause: str | None = None,
) -> p.RestoreJob:
    """The ``restore`` that starts ``attempt`` from ``cp``; None: from the job's origin by its
    path (a checkpoint its store does not hold), or the beginning when it has none.
    ``cause``: why the job restarts."""
    if cp is None:
        origin = rt.origin
        if origin is None or origin.path is None:
            return p.RestoreJob(new_attempt=attempt, request_id=request_id, cause=cause)
        return p.RestoreJob(
            new_attempt=attempt,
            checkpoint_id=origin.checkpoint_id,
            external_path=origin.path,
            savepoint_path=origin.path,
            request_id=request_id,
            cause=cause,
        )
    inline = any(h.inline is not None for a in cp.acks.values() for h in a.handles)
    return p.RestoreJob(
        new_attempt=attempt,
        checkpoint_id=cp.checkpoint_id,
        external_path=cp.external_path,
        savepoint_path=cp.external_path if cp.is_savepoint else None,
        acks=list(cp.acks.values()) if inline or cp.external_path is None else None,
        request_id=request_id,
        cause=cause,
    )
