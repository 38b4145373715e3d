"""The control plane's answers to REST requests that steer a job.

Each request is one unit of work (see :mod:`sparkpoint_server.service.control_plane`): it
checks the job and the input, records an operation (``request-id``) that the job's events
complete later, and sends the job its command.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from fsspec.core import split_protocol, url_to_fs
from fsspec.registry import known_implementations

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CheckpointTriggerError, CompletedCheckpoint
from sparkpoint.checkpointing.restart import restart_strategy_from_config
from sparkpoint.errors import (
    CheckpointNotFoundError as RuntimeCheckpointNotFound,
)
from sparkpoint.errors import ConfigurationError, CorruptSnapshotError, StorageLocationError
from sparkpoint.runtime.recovery import (
    RestorePoint,
    restore_point_from_metadata,
    storage_for_checkpoint_path,
)
from sparkpoint_server.coordination.job import JobRuntime, checkpoint_config_dict
from sparkpoint_server.errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptCheckpointError,
    InvalidRequestError,
)
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service.batch import Batch

if TYPE_CHECKING:
    from sparkpoint_server.service.control_plane import ControlPlane


def _new_operation(batch: Batch, rt: JobRuntime, kind: str, **params: Any) -> str:
    request_id = str(uuid.uuid4())
    batch.writer.insert_operation(
        request_id=request_id,
        job_id=rt.job_id,
        kind=kind,
        status="IN_PROGRESS",
        created_at=batch.now,
        updated_at=batch.now,
        params=params,
    )
    return request_id


def check_directory(field: str, value: str | None) -> str | None:
    """An absolute path or a URL of a filesystem fsspec knows; else a 400 naming ``field``."""
    if value is None:
        return None
    value = value.strip()
    protocol, path = split_protocol(value)
    if protocol is None and not value.startswith("/"):
        raise InvalidRequestError(field, f"{value!r} must be an absolute path or a URL")
    if protocol is not None and protocol not in known_implementations and protocol != "file":
        raise InvalidRequestError(field, f"unknown filesystem {protocol!r} in {value!r}")
    if ".." in path.split("/"):
        raise InvalidRequestError(field, f"{value!r} must not contain '..'")
    return value


def verify_restorable(rt: JobRuntime, point: RestorePoint, storage: Any) -> None:
    """Refuse a checkpoint whose state does not fit the job or fails its checksums."""
    unknown = sorted({a.operator_id for a in point.acks} - set(rt.tasks))
    if unknown:
        raise InvalidRequestError(
            "savepoint_path",
            f"checkpoint {point.checkpoint_id} has state of operators {unknown} that job "
            f"{rt.job_id} does not have (its operators: {sorted(rt.tasks)})",
        )
    try:
        for ack in point.acks:
            for handle in ack.handles:
                storage.read_state(handle)
    except (CorruptSnapshotError, StorageLocationError) as err:
        raise CorruptCheckpointError(
            f"checkpoint {point.checkpoint_id} of job {rt.job_id} cannot be restored: {err}"
        ) from err


def trigger_checkpoint(plane: ControlPlane, job_id: str) -> str:
    return _trigger(plane, job_id, p.CheckpointKind.CHECKPOINT, "checkpoint", None)


def trigger_savepoint(
    plane: ControlPlane, job_id: str, target_directory: str | None, cancel_job: bool
) -> str:
    target = check_directory("target-directory", target_directory)
    return _trigger(
        plane, job_id, p.CheckpointKind.SAVEPOINT, "savepoint", target, cancel_job=cancel_job
    )


def stop_with_savepoint(plane: ControlPlane, job_id: str, target_directory: str | None) -> str:
    target = check_directory("target-directory", target_directory)
    return _trigger(plane, job_id, p.CheckpointKind.SAVEPOINT, "stop", target, stop=True)


def _trigger(
    plane: ControlPlane,
    job_id: str,
    kind: p.CheckpointKind,
    op: str,
    target: str | None,
    *,
    cancel_job: bool = False,
    stop: bool = False,
) -> str:
    rt = plane.active_runtime(job_id)
    if rt.status is not p.JobStatus.RUNNING:
        raise ConflictError(f"job {job_id} is {rt.status.value}; it must be RUNNING")
    with plane.unit() as batch:
        batch.touched.add(job_id)
        params: dict[str, Any] = {"target-directory": target, "cancel-job": cancel_job}
        request_id = _new_operation(batch, rt, op, **params)
        try:
            pending = d.trigger(
                batch, rt, kind, target_directory=target, request_id=request_id, stop=stop
            )
        except CheckpointTriggerError as err:
            raise ConflictError(str(err)) from err
        if cancel_job:
            rt.cancel_after.add(pending.checkpoint_id)
    return request_id


def restore(
    plane: ControlPlane, job_id: str, checkpoint_id: int | None, savepoint_path: str | None
) -> str:
    """Restore checkpoint N (retained) or a savepoint (by path) into a new attempt.

    Steps: (1) find it and check its files, (2) the coordinator starts the next attempt
    from it (pending checkpoints are aborted), (3) record the request and send the job
    the restore; the request completes when the job reports it restored.
    """
    if (checkpoint_id is None) == (savepoint_path is None):
        raise InvalidRequestError(
            "checkpoint_id, savepoint_path",
            "give exactly one of checkpoint_id or savepoint_path",
        )
    rt = plane.active_runtime(job_id)
    # Step 1
    if checkpoint_id is not None:
        cp = rt.coordinator.store.get(checkpoint_id)
        if cp is None:
            retained = [c.checkpoint_id for c in rt.coordinator.store.all()]
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of job {job_id} is not retained; "
                f"retained checkpoints and savepoints: {retained or 'none'}"
            )
        _check_files(plane, rt, cp)
    else:
        path = check_directory("savepoint_path", savepoint_path)
        assert path is not None
        cp = _read_savepoint(plane, rt, path)
    # Step 2, 3
    with plane.unit() as batch:
        batch.touched.add(job_id)
        request_id = _new_operation(
            batch, rt, "restore", checkpoint_id=cp.checkpoint_id, path=cp.external_path
        )
        cause = f"restore of {cp.kind.value} {cp.checkpoint_id} requested"
        if rt.coordinator.store.get(cp.checkpoint_id) is not None:
            decision = rt.coordinator.restore_to(cp.checkpoint_id)
        else:
            decision = rt.coordinator.restore_from(cp, cause)
        rt.restart_due_at, rt.restart_cause = None, None
        batch.writer.job(job_id, restart_due_at=None, restart_cause=None)
        d.set_status(batch, rt, p.JobStatus.RESTARTING, cause)
        d.start_attempt(batch, rt, decision, request_id)
    return request_id


def _check_files(plane: ControlPlane, rt: JobRuntime, cp: CompletedCheckpoint) -> None:
    if cp.external_path is not None:
        try:
            point = restore_point_from_metadata(rt.storage, cp.external_path)
        except RuntimeCheckpointNotFound as err:
            raise CheckpointNotFoundError(
                f"checkpoint {cp.checkpoint_id} of job {rt.job_id} no longer exists: {err}"
            ) from err
        except CorruptSnapshotError as err:
            raise CorruptCheckpointError(str(err)) from err
    else:
        point = RestorePoint.of(cp)
    storage = (
        storage_for_checkpoint_path(cp.external_path)
        if cp.is_savepoint and cp.external_path
        else rt.storage
    )
    try:
        verify_restorable(rt, point, storage)
    except CorruptCheckpointError as err:
        if "No such file" in str(err) or "missing" in str(err):
            raise CheckpointNotFoundError(str(err)) from err
        raise


def _read_savepoint(plane: ControlPlane, rt: JobRuntime, path: str) -> CompletedCheckpoint:
    fs, fs_path = url_to_fs(path)
    metadata = fs_path if fs_path.endswith("/_metadata") else fs_path.rstrip("/") + "/_metadata"
    if not fs.exists(metadata):
        raise CheckpointNotFoundError(f"savepoint_path: no savepoint at {path} (no _metadata)")
    try:
        storage = storage_for_checkpoint_path(path)
        point = restore_point_from_metadata(storage, path)
    except RuntimeCheckpointNotFound as err:
        raise CheckpointNotFoundError(f"savepoint_path: {err}") from err
    except (CorruptSnapshotError, StorageLocationError, ConfigurationError) as err:
        raise CorruptCheckpointError(f"savepoint_path: {err}") from err
    verify_restorable(rt, point, storage)
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


def cancel(plane: ControlPlane, job_id: str) -> str:
    rt = plane.active_runtime(job_id)
    with plane.unit() as batch:
        batch.touched.add(job_id)
        request_id = _new_operation(batch, rt, "cancel")
        rt.cancel_request = request_id
        rt.restart_due_at, rt.restart_cause = None, None
        batch.writer.job(job_id, restart_due_at=None, restart_cause=None)
        d.set_status(batch, rt, p.JobStatus.CANCELLING, "cancel requested")
        aborted = rt.coordinator.abort_all(
            d.Reason.CHECKPOINT_COORDINATOR_SHUTDOWN, "the job is being cancelled"
        )
        d.handle_failed(batch, rt, aborted)
        batch.command(job_id, rt.attempt, p.CancelJob(cause="cancel requested"))
    return request_id


def update_checkpoint_config(
    plane: ControlPlane, job_id: str, changes: dict[str, int]
) -> dict[str, Any]:
    rt = plane.active_runtime(job_id)
    with plane.unit() as batch:
        batch.touched.add(job_id)
        try:
            new = rt.coordinator.update_config(dict(changes))
        except ConfigurationError as err:
            field = next((k for k in changes if k in str(err)), "checkpoint config")
            raise InvalidRequestError(field, str(err)) from err
        stored = checkpoint_config_dict(new)
        batch.writer.job(job_id, checkpoint_config=stored, updated_at=batch.now)
        d.discard_subsumed(batch, rt)
        batch.command(job_id, rt.attempt, p.ConfigurationChanged(changes=dict(changes)))
    return stored


def set_restart_strategy(
    plane: ControlPlane, job_id: str, conf: dict[str, str | int | float]
) -> dict[str, Any]:
    rt = plane.active_runtime(job_id)
    enabled = rt.coordinator.config.interval_ms > 0
    try:
        strategy = restart_strategy_from_config(dict(conf), checkpointing_enabled=enabled)
    except ConfigurationError as err:
        raise InvalidRequestError("restart-strategy", str(err)) from err
    with plane.unit() as batch:
        batch.touched.add(job_id)
        rt.restart = strategy
        stored = dict(strategy.to_config())
        batch.writer.job(job_id, restart_strategy=stored, updated_at=batch.now)
    return {**stored, "description": strategy.describe()}
