"""Savepoints, stop-with-savepoint and restores: trigger one, then poll its request id.

Every trigger answers 202 ``{"request-id": ...}``; ``GET .../{request_id}`` answers Flink's
asynchronous-operation shape. A restore's answer also carries a ``warning``: sinks cannot
un-commit, so restoring checkpoint *N* produces again the output that later checkpoints
committed (DESIGN §1, "Restoring an older checkpoint").
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from sparkpoint_server.api.deps import ControlPlaneDep, SessionsDep, json_response, require_token
from sparkpoint_server.api.responses import (
    OperationStatus,
    RequestAccepted,
    RestoreAccepted,
    answer,
    errors,
)
from sparkpoint_server.api.schemas import (
    JobId,
    RequestId,
    RestoreRequest,
    StopWithSavepointRequest,
    TriggerSavepointRequest,
)
from sparkpoint_server.storage import queries

router = APIRouter(tags=["savepoints, stop and restore"], dependencies=[Depends(require_token)])

LISTED_IDS = 10  # a warning names at most this many checkpoints


@router.post(
    "/jobs/{job_id}/savepoints",
    summary="Trigger a savepoint",
    description="Takes a savepoint into `target-directory` (default: the control plane's "
    "savepoint directory), then cancels the job if `cancel-job`. Answers 202 with the "
    "`request-id`.",
    status_code=202,
    response_model=None,
    responses={**answer(RequestAccepted, 202), **errors(404, 409, 503)},
)
def trigger_savepoint(
    job_id: JobId,
    sessions: SessionsDep,
    control_plane: ControlPlaneDep,
    body: Annotated[TriggerSavepointRequest | None, Body()] = None,
) -> JSONResponse:
    body = body or TriggerSavepointRequest()
    with sessions() as session:
        queries.require_job(session, job_id)
    request_id = control_plane.trigger_savepoint(job_id, body.target_directory, body.cancel_job)
    return json_response({"request-id": request_id}, 202)


@router.get(
    "/jobs/{job_id}/savepoints/{request_id}",
    summary="Status of a savepoint",
    description="`status.id` IN_PROGRESS or COMPLETED; `operation.location` or, if it failed, "
    "`operation.failure-cause` (and `failed: true`).",
    response_model=None,
    responses={**answer(OperationStatus), **errors(404)},
)
def savepoint_status(job_id: JobId, request_id: RequestId, sessions: SessionsDep) -> JSONResponse:
    with sessions() as session:
        return json_response(queries.operation_status(session, job_id, "savepoint", request_id))


@router.post(
    "/jobs/{job_id}/stop",
    summary="Stop with a savepoint",
    description="Takes a savepoint (`targetDirectory` or `target-directory`), commits the sinks"
    " and finishes the job. Answers 202 with the `request-id`.",
    status_code=202,
    response_model=None,
    responses={**answer(RequestAccepted, 202), **errors(404, 409, 503)},
)
def stop_with_savepoint(
    job_id: JobId,
    sessions: SessionsDep,
    control_plane: ControlPlaneDep,
    body: Annotated[StopWithSavepointRequest | None, Body()] = None,
) -> JSONResponse:
    body = body or StopWithSavepointRequest()
    with sessions() as session:
        queries.require_job(session, job_id)
    request_id = control_plane.stop_with_savepoint(job_id, body.target_directory)
    return json_response({"request-id": request_id}, 202)


@router.get(
    "/jobs/{job_id}/stop/{request_id}",
    summary="Status of a stop with savepoint",
    description="As the savepoint status: `operation.location` of the final savepoint.",
    response_model=None,
    responses={**answer(OperationStatus), **errors(404)},
)
def stop_status(job_id: JobId, request_id: RequestId, sessions: SessionsDep) -> JSONResponse:
    with sessions() as session:
        return json_response(queries.operation_status(session, job_id, "stop", request_id))


@router.post(
    "/jobs/{job_id}/restore",
    summary="Restore a checkpoint or savepoint",
    description="Restarts the job (a new attempt) from `checkpoint_id` (one of its retained "
    "checkpoints) or `savepoint_path`; exactly one. Answers 202 with the `request-id` and a "
    "`warning` when completed checkpoints after the restored one exist: sinks cannot "
    "un-commit, so their output will be produced again.",
    status_code=202,
    response_model=None,
    responses={**answer(RestoreAccepted, 202), **errors(404, 409, 422, 503)},
)
def restore(
    job_id: JobId, body: RestoreRequest, sessions: SessionsDep, control_plane: ControlPlaneDep
) -> JSONResponse:
    with sessions() as session:
        queries.require_job(session, job_id)
        warning = restore_warning(session, job_id, body)
    request_id = control_plane.restore(job_id, body.checkpoint_id, body.savepoint_path)
    return json_response({"request-id": request_id, "warning": warning}, 202)


@router.get(
    "/jobs/{job_id}/restore/{request_id}",
    summary="Status of a restore",
    description="`status.id` IN_PROGRESS or COMPLETED (the job runs again from the checkpoint:"
    " `operation.checkpointId`, `operation.location`), or `operation.failure-cause`.",
    response_model=None,
    responses={**answer(OperationStatus), **errors(404)},
)
def restore_status(job_id: JobId, request_id: RequestId, sessions: SessionsDep) -> JSONResponse:
    with sessions() as session:
        return json_response(queries.operation_status(session, job_id, "restore", request_id))


def restore_warning(session: Session, job_id: str, body: RestoreRequest) -> str | None:
    """What restoring produces again, or ``None`` when no later checkpoint completed.

    A savepoint path that is none of the job's own checkpoints gives ``None``: nothing is
    known about what it precedes.

    Raises:
        CheckpointNotFoundError: ``checkpoint_id`` is not a checkpoint of the job.
    """
    if body.checkpoint_id is not None:
        restored: int | None = body.checkpoint_id
    else:
        restored = queries.checkpoint_at_path(session, job_id, body.savepoint_path or "")
    if restored is None:
        return None
    later = queries.completed_checkpoints_after(session, job_id, restored)
    if not later:
        return None
    shown = ", ".join(str(i) for i in later[:LISTED_IDS])
    if len(later) > LISTED_IDS:
        shown += f", ... {later[-1]} ({len(later)} in all)"
    return (
        f"sinks cannot un-commit: restoring checkpoint {restored} replays the input after it, "
        f"so the output already committed by the later checkpoint(s) {shown} will be "
        "produced again"
    )
