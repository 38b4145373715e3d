"""The control plane's answers to REST requests that steer a job.

Each request is one unit of work (see :mod:`sparkpoint_server.service.control_plane`): it
checks the job and the input, records an operation (``request-id``) that the job's events
complete later, and sends the job its command.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fsspec.core import split_protocol, url_to_fs
from fsspec.registry import get_filesystem_class
from sqlalchemy import select

from sparkpoint import protocol as p
from sparkpoint.checkpointing.pending import CheckpointFailureReason as Reason
from sparkpoint.checkpointing.pending import CheckpointTriggerError, CompletedCheckpoint
from sparkpoint.checkpointing.restart import restart_strategy_from_config
from sparkpoint.checkpointing.storage import CheckpointStorage
from sparkpoint.errors import (
    CheckpointNotFoundError as RuntimeCheckpointNotFound,
)
from sparkpoint.errors import ConfigurationError, CorruptSnapshotError, StorageLocationError
from sparkpoint.runtime.planner import timeout_fitting
from sparkpoint.runtime.recovery import (
    RestorePoint,
    max_parallelism_changed,
    restore_point_from_metadata,
    storage_for_checkpoint_path,
)
from sparkpoint_server.coordination.job import JobRuntime, checkpoint_config_dict
from sparkpoint_server.errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptCheckpointError,
    InvalidRequestError,
    JobNotFoundError,
    StorageUnavailableError,
)
from sparkpoint_server.service import attempts, origins, storage_io
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service.batch import Batch
from sparkpoint_server.service.storage_io import state_paths
from sparkpoint_server.storage.models import Job

if TYPE_CHECKING:
    from sparkpoint_server.service.control_plane import ControlPlane

T = TypeVar("T")
# What a restore's reads raise on purpose: mapped to 404 / 422 answers by the callers.
EXPECTED = (
    RuntimeCheckpointNotFound,
    CorruptSnapshotError,
    StorageLocationError,
    ConfigurationError,
)


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


def active_runtime(plane: ControlPlane, job_id: str) -> JobRuntime:
    """The runtime of a live job; else a 404 (unknown) or a 409 naming the job's status."""
    rt = plane.jobs.get(job_id)
    if rt is None:
        with plane.sessions() as session:
            status = session.execute(select(Job.status).where(Job.job_id == job_id)).scalar()
        if status is None:
            raise JobNotFoundError(job_id)
    elif rt.active:
        return rt
    else:
        status = rt.status.value
    raise ConflictError(f"job {job_id} is {status}; the request needs a live job")


def check_directory(field: str, value: str | None) -> str | None:
    """An absolute path or a URL of a filesystem fsspec knows; else a 400 naming ``field``."""
    if value is None:
        return None
    value = value.strip()
    protocol, path = split_protocol(value)
    if protocol is None and not value.startswith("/"):
        raise InvalidRequestError(field, f"{value!r} must be an absolute path or a URL")
    if protocol is not None:
        try:
            get_filesystem_class(protocol)
        except (ImportError, ValueError) as err:
            raise InvalidRequestError(
                field, f"unknown filesystem {protocol!r} in {value!r}: {err}"
            ) from err
    if ".." in path.split("/"):
        raise InvalidRequestError(field, f"{value!r} must not contain '..'")
    return value


def check_target(plane: ControlPlane, rt: JobRuntime, field: str, value: str | None) -> str | None:
    """:func:`check_directory`, and under the job's storage roots (else a 400 naming them)."""
    value = check_directory(field, value)
    return None if value is None else plane.roots.of_job(rt.config).check(field, value)


def check_restore_point(plane: ControlPlane, rt: JobRuntime, point: RestorePoint) -> None:
    """Refuse a checkpoint whose state does not fit the job (operators it lacks, keyed state
    of another max parallelism), or whose handles (their paths and a native snapshot's shared
    files) point outside the job's storage roots (a crafted ``_metadata`` must not make the
    server read any file)."""
    unknown = sorted({a.operator_id for a in point.acks} - set(rt.tasks))
    if unknown:
        raise InvalidRequestError(
            "savepoint_path",
            f"checkpoint {point.checkpoint_id} has state of operators {unknown} that job "
            f"{rt.job_id} does not have (its operators: {sorted(rt.tasks)})",
        )
    keyed = {v["id"]: v.get("max_parallelism") for v in rt.graph.get("vertices", [])}
    changed = max_parallelism_changed(point, keyed)
    if changed is not None:
        operator, found, expected = changed
        raise InvalidRequestError(
            "savepoint_path",
            f"checkpoint {point.checkpoint_id} holds the keyed state of {operator} with max "
            f"parallelism {found}, and job {rt.job_id} runs with {expected}: every key would "
            f"change key group. Start a new job from it with --max-parallelism {found}",
        )
    roots = plane.roots.of_job(rt.config)
    for ack in point.acks:
        for path in (path for handle in ack.handles for path in state_paths(handle)):
            if not roots.contains(path):
                raise InvalidRequestError(
                    "savepoint_path",
                    f"checkpoint {point.checkpoint_id} of job {rt.job_id}: the state of "
                    f"{ack.operator_id}[{ack.subtask}] at {path!r} is outside the "
                    f"storage roots: {roots.describe()}",
                )


def _verify_state(point: RestorePoint, storage: CheckpointStorage) -> None:
    """Check every state file of ``point`` (:meth:`CheckpointStorage.verify_handles`): a
    native snapshot's manifest and each file it lists, its shared files included."""
    storage.verify_handles(h for ack in point.acks for h in ack.handles)


def _storage(plane: ControlPlane, what: str, fn: Callable[..., T], *args: Any) -> T:
    """A storage call bounded by the storage timeout (never under the lock); the errors a
    restore expects come back as they are, anything else as a StorageUnavailableError."""
    try:
        return storage_io.call(what, plane.storage_timeout_s, fn, *args)
    except StorageUnavailableError as err:
        if isinstance(err.__cause__, EXPECTED):
            raise err.__cause__ from None
        raise


def trigger_checkpoint(plane: ControlPlane, job_id: str) -> str:
    return _trigger(plane, job_id, p.CheckpointKind.CHECKPOINT, "checkpoint", None)


def trigger_savepoint(
    plane: ControlPlane, job_id: str, target_directory: str | None, cancel_job: bool
) -> str:
    check_directory("target-directory", target_directory)
    rt = active_runtime(plane, job_id)
    target = check_target(plane, rt, "target-directory", target_directory)
    return _trigger(
        plane, job_id, p.CheckpointKind.SAVEPOINT, "savepoint", target, cancel_job=cancel_job
    )


def stop_with_savepoint(plane: ControlPlane, job_id: str, target_directory: str | None) -> str:
    check_directory("target-directory", target_directory)
    rt = active_runtime(plane, job_id)
    target = check_target(plane, rt, "target-directory", target_directory)
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
    rt = active_runtime(plane, job_id)
    if rt.status is not p.JobStatus.RUNNING:
        raise ConflictError(f"job {job_id} is {rt.status.value}; it must be RUNNING")
    with plane.unit() as batch:
        batch.touched.add(job_id)
        params: dict[str, Any] = {"target-directory": target, "cancel-job": cancel_job}
        request_id = _new_operation(batch, rt, op, **params)
        if kind is p.CheckpointKind.CHECKPOINT and not rt.tasks_running:
            # Its barrier would wait out the start-up and could expire: queued until it ended.
            starting = f"attempt {rt.attempt}'s first epoch (Spark's start-up) has not ended"
            return _queued(batch, rt, request_id, starting)
        try:
            pending = d.trigger(
                batch, rt, kind, target_directory=target, request_id=request_id, stop=stop
            )
        except CheckpointTriggerError as err:
            if err.reason is not Reason.TOO_MANY_CHECKPOINT_REQUESTS:
                raise ConflictError(str(err)) from err
            # Only manual checkpoints can be refused so: queued, as Flink does.
            return _queued(batch, rt, request_id, err.args[0])
        if cancel_job:
            rt.cancel_after.add(pending.checkpoint_id)
    return request_id


def _queued(batch: Batch, rt: JobRuntime, request_id: str, why: str) -> str:
    """Queue a manual checkpoint request that cannot be triggered now (``why``); its id.

    Raises:
        ConflictError: the queue is full.
    """
    try:
        d.queue_checkpoint(batch, rt, request_id, why)
    except CheckpointTriggerError as full:
        raise ConflictError(str(full)) from full
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
    # Until it is applied, retention keeps the checkpoint restored (read outside the lock).
    path = savepoint_path
    if checkpoint_id is not None:
        with plane.lock:
            rt = plane.jobs.get(job_id)
            held = rt.coordinator.store.get(checkpoint_id) if rt is not None else None
            path = held.external_path if held is not None else None
    with plane.starting_from([path] if path else []):
        return _restore(plane, job_id, checkpoint_id, savepoint_path)


def _restore(
    plane: ControlPlane, job_id: str, checkpoint_id: int | None, savepoint_path: str | None
) -> str:
    rt = active_runtime(plane, job_id)
    # Step 1
    if checkpoint_id is not None:
        cp = rt.coordinator.store.get(checkpoint_id)
        if cp is None:
            retained = [c.checkpoint_id for c in rt.coordinator.store.all()]
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of job {job_id} is not retained; "
                f"retained checkpoints and savepoints: {retained or 'none'}"
            )
        if checkpoint_id in rt.finalizing:
            raise ConflictError(
                f"checkpoint {checkpoint_id} of job {job_id} is still being written; "
                "restore it once it completed"
            )
        _check_files(plane, rt, cp)
    else:
        path = check_target(plane, rt, "savepoint_path", savepoint_path)
        assert path is not None
        cp = _read_savepoint(plane, rt, path)
    # Step 2, 3
    with plane.unit() as batch:
        if cp.external_path and storage_io.location_of(cp.external_path) in plane.disposing:
            raise ConflictError(f"{cp.external_path} is being disposed of")
        held = origins.held(rt, cp.checkpoint_id, cp.external_path)
        gone = origins.deleted_at(batch.writer.session, cp.external_path or "")
        if (checkpoint_id is not None and held is None) or (held is None and gone):
            raise ConflictError(  # subsumed or disposed of while its files were read
                f"{gone or f'checkpoint {cp.checkpoint_id}'} was deleted while its files were "
                "checked; restore a checkpoint the job retains now"
            )
        batch.touched.add(job_id)
        request_id = _new_operation(
            batch, rt, "restore", checkpoint_id=cp.checkpoint_id, path=cp.external_path
        )
        cause = f"restore of {cp.kind.value} {cp.checkpoint_id} requested"
        d.set_status(batch, rt, p.JobStatus.RESTARTING, cause)
        # Completions still being written fail first: only written checkpoints are restored.
        d.take_back_completions(batch, rt, cause)
        if origins.held(rt, cp.checkpoint_id, cp.external_path) is not None:
            decision = rt.coordinator.restore_to(cp.checkpoint_id)
        else:
            decision = rt.coordinator.restore_from(cp, cause)
        attempts.start_attempt(batch, rt, decision, request_id)
    return request_id


def _check_files(plane: ControlPlane, rt: JobRuntime, cp: CompletedCheckpoint) -> None:
    """A retained checkpoint's ``_metadata`` and state files are there and intact (read with
    the storage timeout, outside the lock)."""
    name = f"checkpoint {cp.checkpoint_id} of job {rt.job_id}"
    if cp.external_path is not None:
        try:
            point = _storage(
                plane,
                f"{name}: reading {cp.external_path}",
                restore_point_from_metadata,
                rt.storage,
                cp.external_path,
            )
        except RuntimeCheckpointNotFound as err:
            raise CheckpointNotFoundError(f"{name} no longer exists: {err}") from err
        except CorruptSnapshotError as err:
            raise CorruptCheckpointError(str(err)) from err
    else:
        point = RestorePoint.of(cp)
    check_restore_point(plane, rt, point)
    storage = (
        storage_for_checkpoint_path(cp.external_path)
        if cp.is_savepoint and cp.external_path
        else rt.storage
    )
    try:
        _storage(plane, f"{name}: reading its state", _verify_state, point, storage)
    except (CorruptSnapshotError, StorageLocationError) as err:
        message = f"{name} cannot be restored: {err}"
        if "No such file" in str(err) or "missing" in str(err):
            raise CheckpointNotFoundError(message) from err
        raise CorruptCheckpointError(message) from err


def _read_point(path: str) -> tuple[RestorePoint, Any]:
    """The savepoint at ``path`` and a storage that reads its handles (storage I/O)."""
    fs, fs_path = url_to_fs(path)
    metadata = fs_path if fs_path.endswith("/_metadata") else fs_path.rstrip("/") + "/_metadata"
    if not fs.exists(metadata):
        raise RuntimeCheckpointNotFound(f"no savepoint at {path} (no _metadata)")
    storage = storage_for_checkpoint_path(path)
    return restore_point_from_metadata(storage, path), storage


def _read_savepoint(plane: ControlPlane, rt: JobRuntime, path: str) -> CompletedCheckpoint:
    what = f"job {rt.job_id}: reading savepoint {path}"
    try:
        point, storage = _storage(plane, what, _read_point, path)
    except RuntimeCheckpointNotFound as err:
        raise CheckpointNotFoundError(f"savepoint_path: {err}") from err
    except (CorruptSnapshotError, StorageLocationError, ConfigurationError) as err:
        raise CorruptCheckpointError(f"savepoint_path: {err}") from err
    check_restore_point(plane, rt, point)
    try:
        _storage(plane, f"{what}: its state", _verify_state, point, storage)
    except (CorruptSnapshotError, StorageLocationError) as err:
        raise CorruptCheckpointError(
            f"checkpoint {point.checkpoint_id} of job {rt.job_id} cannot be restored: {err}"
        ) from err
    return origins.read_from_path(point)


def cancel(plane: ControlPlane, job_id: str) -> str:
    rt = active_runtime(plane, job_id)
    with plane.unit() as batch:
        batch.touched.add(job_id)
        request_id = _new_operation(batch, rt, "cancel")
        rt.cancel_request = request_id
        d.drop_restart(batch, rt)
        d.set_status(batch, rt, p.JobStatus.CANCELLING, "cancel requested")
        aborted = rt.coordinator.abort_all(
            d.Reason.CHECKPOINT_COORDINATOR_SHUTDOWN, "the job is being cancelled"
        )
        d.handle_failed(batch, rt, aborted)
        batch.command(job_id, rt.attempt, p.CancelJob(cause="cancel requested"))
        if rt.driver_lost:  # its driver is gone, no new one registered: nobody to tell
            cause = "cancel requested; no driver is running (its heartbeats had stopped)"
            d.set_status_and_settle(batch, rt, p.JobStatus.CANCELED, cause)
    return request_id


def update_checkpoint_config(
    plane: ControlPlane, job_id: str, changes: dict[str, int]
) -> dict[str, Any]:
    rt = active_runtime(plane, job_id)
    _check_timeout_fits_an_epoch(rt, changes)
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


def _check_timeout_fits_an_epoch(rt: JobRuntime, changes: dict[str, int]) -> None:
    """Refuse a checkpoint timeout shorter than every epoch the job ran lately: a barrier
    rides one whole epoch, so each checkpoint would expire and, past the tolerable failures,
    fail the job over, again and again.

    Raises:
        InvalidRequestError: naming the shortest epoch and a timeout that would do (its
            duration over the share of the timeout the job's planner gives an epoch).
    """
    timeout = changes.get("timeout_ms")
    shortest = rt.epoch_ends.shortest_ms(rt.attempt)
    if timeout is None or shortest is None or timeout >= shortest:
        return
    raise InvalidRequestError(
        "timeout",
        f"{timeout} ms is shorter than every epoch job {rt.job_id} ran lately "
        f"(the shortest took {shortest:,.0f} ms): a checkpoint travels with an epoch, so every "
        f"checkpoint would expire; give it at least {timeout_fitting(shortest)} ms",
    )


def set_restart_strategy(
    plane: ControlPlane, job_id: str, conf: dict[str, str | int | float]
) -> dict[str, Any]:
    rt = active_runtime(plane, job_id)
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
