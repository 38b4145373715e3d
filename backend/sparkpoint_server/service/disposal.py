"""Disposing a savepoint through the control plane (Flink's ``POST /savepoint-disposal``).

``sparkpoint savepoint dispose --local`` deletes a directory where it runs, and the control
plane goes on believing in it: ``GET /savepoints`` and the dashboard offer it to restore, and
a live job keeps it in its completed-checkpoint store, whose newest entry is what a failover
restores. Disposing through the control plane keeps the two in step:

1. the path (the directory, or its ``_metadata``) must lie under the storage roots (of the
   job whose savepoint it is, else the server's own), and its rows are found by location
   (local paths also with their links resolved);
2. the directory is read as ``savepoint dispose`` reads it (a readable ``_metadata``, no
   ``shared/`` directory), before anything is forgotten. Its ``_metadata`` names its job and
   id: the job's store is checked by those too, so another spelling of the path, or a
   completion whose row is not written yet, is no way around step 3;
3. under the lock, a live job's savepoint leaves its store. Refused (409): the store's newest
   written entry (a failover now would restore it: take a checkpoint first), one still being
   written, a pinned one (a pending restore, an uncommitted sink transaction), a live job's
   regular checkpoint (the job deletes those itself once newer ones subsume them), and one
   that a live job's restore under way reads. Its rows are marked discarded, so nothing
   offers it any more, also after a restart. Until step 4 ends, a restore by path of it is
   refused (``ControlPlane.disposing``);
4. the files go, ``_metadata`` first (outside the lock, bounded by the storage timeout).

A copy of a job's savepoint elsewhere (same job and id, another directory) is not the job's:
disposing of it leaves the job's own alone. A savepoint the control plane knows whose files
are already gone (deleted by hand, or with ``dispose --local``) is forgotten all the same,
and the answer says no file was deleted.

Unlike Flink, which answers with a trigger id to poll, the request answers when the files
are gone, with what was deleted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from sparkpoint.checkpointing.storage import METADATA_FILE
from sparkpoint.errors import CheckpointError, ConfigurationError, CorruptSnapshotError
from sparkpoint.errors import CheckpointNotFoundError as RuntimeCheckpointNotFound
from sparkpoint.savepoint_tool import Disposal, SavepointDisposeError, plan_disposal
from sparkpoint_server.errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptCheckpointError,
    InvalidRequestError,
    StorageUnavailableError,
)
from sparkpoint_server.service import origins, storage_io
from sparkpoint_server.service import requests as r
from sparkpoint_server.service.storage_io import Location
from sparkpoint_server.storage.models import Checkpoint, Job

if TYPE_CHECKING:
    from sparkpoint_server.service.control_plane import ControlPlane

FIELD = "savepoint-path"


def dispose_savepoint(plane: ControlPlane, path: str) -> dict[str, Any]:
    """Dispose of the savepoint (or an ended job's checkpoint) at ``path``; see the module
    docstring for the steps. Returns what was deleted."""
    value = r.check_directory(FIELD, path)
    assert value is not None
    # Step 1
    directory = _directory(value)
    try:
        places = storage_io.aliases(directory)
    except ValueError as err:
        raise InvalidRequestError(FIELD, str(err)) from None
    rows, config = _rows_at(plane, places)
    plane.roots.of_job(config).check(FIELD, directory)
    # Step 2
    disposal: Disposal | None = None
    try:
        disposal = r._storage(plane, f"reading {directory} to dispose of it", _plan, directory)
    except RuntimeCheckpointNotFound as err:
        if not rows:
            raise CheckpointNotFoundError(f"{FIELD}: {err}") from None
        # Its files went some other way (deleted by hand, `dispose --local`): forget it.
    except CorruptSnapshotError as err:
        raise CorruptCheckpointError(f"{FIELD}: {err}") from None
    except ConfigurationError as err:
        raise InvalidRequestError(FIELD, str(err)) from None
    if disposal is not None:
        places |= storage_io.aliases(disposal.root)
    # Step 3
    with plane.unit() as batch:
        _refuse_restores(plane, places)
        owner = None
        if disposal is not None and disposal.job_id and disposal.checkpoint_id is not None:
            owner = (disposal.job_id, disposal.checkpoint_id)
            _forget(plane, *owner, places)  # also when no row is there yet (being completed)
        for job_id, checkpoint_id in rows:
            if (job_id, checkpoint_id) != owner:
                _forget(plane, job_id, checkpoint_id, places)
            batch.touched.add(job_id)
            batch.writer.checkpoint(job_id, checkpoint_id, discarded=True)
        plane.disposing |= places  # a restore by path waits until the files are gone
    # Step 4
    try:
        if disposal is None:
            job_id, checkpoint_id = rows[0]
            return {
                "path": directory,
                "job-id": job_id,
                "checkpoint-id": checkpoint_id,
                "kind": None,
                "files": 0,
                "bytes": 0,
                "shared-files-kept": 0,
            }
        done = r._storage(plane, f"disposing of {disposal.root}", disposal.carry_out)
    except StorageUnavailableError as err:
        raise StorageUnavailableError(
            f"{err}; the control plane has forgotten the savepoint, its files are left: "
            f"delete them with `sparkpoint savepoint dispose --local {directory}`"
        ) from None
    finally:
        with plane.lock:
            plane.disposing -= places
    return {
        "path": done.path,
        "job-id": owner[0] if owner else (rows[0][0] if rows else None),
        "checkpoint-id": done.checkpoint_id,
        "kind": done.kind,
        "files": done.files,
        "bytes": done.bytes,
        "shared-files-kept": done.shared_kept,
    }


def _directory(value: str) -> str:
    """The savepoint's directory, also when ``value`` names its ``_metadata``."""
    trimmed = value.rstrip("/")
    if trimmed.endswith(f"/{METADATA_FILE}"):
        trimmed = trimmed[: -len(METADATA_FILE) - 1]
    return trimmed or "/"


def _rows_at(
    plane: ControlPlane, places: set[Location]
) -> tuple[list[tuple[str, int]], dict[str, Any] | None]:
    """The completed, not yet discarded checkpoint rows at one of ``places`` (job, id), and
    the configuration of their job (None when no job has one there)."""
    with plane.sessions() as session:
        found = session.execute(
            select(Checkpoint.job_id, Checkpoint.checkpoint_id, Checkpoint.external_path).where(
                Checkpoint.status == "COMPLETED",
                Checkpoint.discarded.is_(False),
                Checkpoint.external_path.is_not(None),
            )
        ).all()
        rows = [(j, c) for j, c, url in found if _at(url, places)]
        if not rows:
            return [], None
        config = session.execute(select(Job.config).where(Job.job_id == rows[0][0])).scalar()
    return rows, config


def _at(url: str | None, places: set[Location]) -> bool:
    if url is None:
        return False
    try:
        return bool(storage_io.aliases(url) & places)
    except ValueError:
        return False


def _plan(path: str) -> Disposal:
    """:func:`plan_disposal`, its refusals as the errors a storage call passes on."""
    try:
        return plan_disposal(path)
    except SavepointDisposeError as err:
        if isinstance(err.__cause__, (RuntimeCheckpointNotFound, CorruptSnapshotError)):
            raise err.__cause__ from None
        raise ConfigurationError(str(err)) from None


def _refuse_restores(plane: ControlPlane, places: set[Location]) -> None:
    """409 while a live job may restore one of ``places``: a restore from it is under way
    (its new attempt reads the files; a restore of another job's savepoint pins nothing in
    the owner's store), or the job started from it or restored it by its path and has no
    checkpoint since (a failover restores it again)."""
    if places & set(plane.starting):
        raise ConflictError(
            "a job is starting from it (its registration or restore request read it and is "
            "not applied yet); dispose of it once that job has a checkpoint of its own"
        )
    for rt in plane.jobs.values():
        if not rt.active:
            continue
        start = getattr(rt.start_command, "external_path", None)
        if rt.restore_request is not None and _at(start, places):
            raise ConflictError(
                f"job {rt.job_id} is restoring it (request {rt.restore_request[1]}); dispose "
                "of it once that restore completed"
            )
        origin = rt.origin
        restoring = origin is not None and origin.path is not None and _at(origin.path, places)
        if restoring and not origins.candidates(rt):
            raise ConflictError(
                f"job {rt.job_id} restored it and has no checkpoint since: a failover now "
                "would restore it; dispose of it once one has completed"
            )


def _forget(plane: ControlPlane, job_id: str, checkpoint_id: int, places: set[Location]) -> None:
    """Take a checkpoint out of its job's store, unless the job still needs it (409). A copy
    elsewhere of a checkpoint the job holds is not the job's: its own stays."""
    rt = plane.jobs.get(job_id)
    if rt is None:
        return  # an ended job that is not in memory: no store holds it
    name = f"checkpoint {checkpoint_id} of job {job_id}"
    if checkpoint_id in rt.finalizing:
        raise ConflictError(f"{name} is still being written; it completes first")
    store = rt.coordinator.store
    held = store.get(checkpoint_id)
    if held is None or (held.external_path and not _at(held.external_path, places)):
        return
    name = f"{held.kind.value} {checkpoint_id} of job {job_id}"
    if rt.active:
        if not held.is_savepoint:
            raise ConflictError(
                f"{name} is retained by the job ({rt.status.value}); the job deletes its "
                "checkpoints once newer ones subsume them"
            )
        target = origins.candidates(rt)
        if target and target[0].checkpoint_id == checkpoint_id:
            raise ConflictError(
                f"{name} is its newest restore point: a failover now would restore it; "
                "dispose of it once a later checkpoint has completed"
            )
    try:
        store.remove(checkpoint_id)
    except CheckpointError as err:  # pinned
        raise ConflictError(f"{name} cannot be disposed of: {err}") from None
