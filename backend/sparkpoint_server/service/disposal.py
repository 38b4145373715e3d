"""Disposing a savepoint through the control plane (Flink's ``POST /savepoint-disposal``).

``sparkpoint savepoint dispose --local`` deletes a directory where it runs, and the control
plane goes on believing in it: ``GET /savepoints`` and the dashboard offer it to restore, and
a live job keeps it in its completed-checkpoint store, whose newest entry is what a failover
restores. Disposing through the control plane keeps the two in step:

1. the path must lie under the storage roots (of the job whose savepoint it is, else the
   server's own), and its rows are found by location;
2. the directory is read as ``savepoint dispose`` reads it (a readable ``_metadata``, no
   ``shared/`` directory), before anything is forgotten;
3. under the lock, a live job's savepoint leaves its store. Refused (409): the store's newest
   entry (a failover now would restore it: take a checkpoint first), a pinned one (a pending
   restore, an uncommitted sink transaction) and a live job's regular checkpoint (the job
   deletes those itself once newer ones subsume them). Its rows are marked discarded, so
   nothing offers it any more, also after a restart;
4. the files go, ``_metadata`` first (outside the lock, bounded by the storage timeout).

A savepoint the control plane knows whose files are already gone (deleted by hand, or with
``dispose --local``) is forgotten all the same, and the answer says no file was deleted.

Unlike Flink, which answers with a trigger id to poll, the request answers when the files
are gone, with what was deleted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

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
    try:
        where = Location.of(value)
    except ValueError as err:
        raise InvalidRequestError(FIELD, str(err)) from None
    rows, config = _rows_at(plane, where)
    plane.roots.of_job(config).check(FIELD, value)
    # Step 2
    disposal: Disposal | None = None
    try:
        disposal = r._storage(plane, f"reading {value} to dispose of it", _plan, value)
    except RuntimeCheckpointNotFound as err:
        if not rows:
            raise CheckpointNotFoundError(f"{FIELD}: {err}") from None
        # Its files went some other way (deleted by hand, `dispose --local`): forget it.
    except CorruptSnapshotError as err:
        raise CorruptCheckpointError(f"{FIELD}: {err}") from None
    except ConfigurationError as err:
        raise InvalidRequestError(FIELD, str(err)) from None
    # Step 3
    with plane.unit() as batch:
        for job_id, checkpoint_id, kind in rows:
            _forget(plane, job_id, checkpoint_id, kind)
            batch.touched.add(job_id)
            batch.writer.checkpoint(job_id, checkpoint_id, discarded=True)
    # Step 4
    if disposal is None:
        job_id, checkpoint_id, kind = rows[0]
        gone = {"path": value, "checkpoint-id": checkpoint_id, "kind": kind, "files": 0}
        return {**gone, "job-id": job_id, "bytes": 0, "shared-files-kept": 0}
    try:
        done = r._storage(plane, f"disposing of {disposal.root}", disposal.carry_out)
    except StorageUnavailableError as err:
        raise StorageUnavailableError(
            f"{err}; the control plane has forgotten the savepoint, its files are left: "
            f"delete them with `sparkpoint savepoint dispose --local {disposal.root}`"
        ) from None
    return {
        "path": done.path,
        "job-id": rows[0][0] if rows else None,
        "checkpoint-id": done.checkpoint_id,
        "kind": done.kind,
        "files": done.files,
        "bytes": done.bytes,
        "shared-files-kept": done.shared_kept,
    }


def _rows_at(
    plane: ControlPlane, where: Location
) -> tuple[list[tuple[str, int, str]], dict[str, Any] | None]:
    """The completed, not yet discarded checkpoint rows at ``where`` (job, id, kind), and the
    configuration of their job (None when no job has one there)."""
    with plane.sessions() as session:
        found = session.execute(
            select(
                Checkpoint.job_id,
                Checkpoint.checkpoint_id,
                Checkpoint.kind,
                Checkpoint.external_path,
            ).where(
                Checkpoint.status == "COMPLETED",
                Checkpoint.discarded.is_(False),
                Checkpoint.external_path.is_not(None),
            )
        ).all()
        rows = [(j, c, k) for j, c, k, url in found if _located(url) == where]
        if not rows:
            return [], None
        config = session.execute(select(Job.config).where(Job.job_id == rows[0][0])).scalar()
    return rows, config


def _located(url: str | None) -> Location | None:
    if url is None:
        return None
    try:
        return Location.of(url)
    except ValueError:
        return None


def _plan(path: str) -> Disposal:
    """:func:`plan_disposal`, its refusals as the errors a storage call passes on."""
    try:
        return plan_disposal(path)
    except SavepointDisposeError as err:
        if isinstance(err.__cause__, (RuntimeCheckpointNotFound, CorruptSnapshotError)):
            raise err.__cause__ from None
        raise ConfigurationError(str(err)) from None


def _forget(plane: ControlPlane, job_id: str, checkpoint_id: int, kind: str) -> None:
    """Take a checkpoint out of its job's store, unless the job still needs it (409)."""
    rt = plane.jobs.get(job_id)
    if rt is None:
        return  # an ended job that is not in memory: no store holds it
    store = rt.coordinator.store
    name = f"{kind} {checkpoint_id} of job {job_id}"
    if rt.active:
        if kind != "savepoint":
            raise ConflictError(
                f"{name} is retained by the job ({rt.status.value}); the job deletes its "
                "checkpoints once newer ones subsume them"
            )
        latest = store.latest()
        if latest is not None and latest.checkpoint_id == checkpoint_id:
            raise ConflictError(
                f"{name} is its newest restore point: a failover now would restore it; "
                "dispose of it once a later checkpoint has completed"
            )
    if store.get(checkpoint_id) is None:
        return
    try:
        store.remove(checkpoint_id)
    except CheckpointError as err:  # pinned
        raise ConflictError(f"{name} cannot be disposed of: {err}") from None
