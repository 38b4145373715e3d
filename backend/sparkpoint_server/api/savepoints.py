"""Savepoints across jobs and the restores requested of a job (who restored what, and when).

Flink's REST API lists neither (its web UI shows savepoints only in a job's checkpoint
history); these two reads let an operator see where each savepoint lives, how large it is
and which restores used it, and let the job page show user-requested restores beside the
failures.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sparkpoint_server.api.deps import (
    ControlPlaneDep,
    SessionsDep,
    SettingsDep,
    json_response,
    require_token,
)
from sparkpoint_server.api.responses import answer, errors
from sparkpoint_server.api.schemas import JobId
from sparkpoint_server.storage import savepoints as queries

router = APIRouter(tags=["savepoints"], dependencies=[Depends(require_token)])

Limit = Annotated[int | None, Query(ge=1, le=10_000, description="How many entries.")]
_ANSWER = ConfigDict(extra="allow", populate_by_name=True)


class RestoreEntry(BaseModel):
    """One restore request: what it restored, into which attempt, and how it ended."""

    model_config = _ANSWER

    request_id: str = Field(alias="request-id")
    job_id: str = Field(alias="job-id")
    status: str = Field(description="IN_PROGRESS, COMPLETED or FAILED.")
    checkpoint_id: int | None = Field(alias="checkpoint-id")
    location: str | None = Field(description="The restored checkpoint's or savepoint's path.")
    attempt: int | None = Field(description="The job attempt the restore started.")
    requested_at: int = Field(alias="requested-at", description="ms since the epoch")
    updated_at: int = Field(alias="updated-at", description="ms since the epoch")
    failure_cause: str | None = Field(alias="failure-cause")


class JobRestores(BaseModel):
    """A job's restore requests, newest first; `truncated` when older ones exist."""

    model_config = _ANSWER

    restores: list[RestoreEntry]
    truncated: bool


class SavepointEntry(BaseModel):
    """A completed savepoint and the restores that used it (newest first)."""

    model_config = _ANSWER

    job_id: str = Field(alias="job-id")
    id: int = Field(description="The savepoint's checkpoint id in its job.")
    location: str = Field(description="Where the savepoint is (its `_metadata`'s directory).")
    target_directory: str | None = Field(alias="target-directory")
    state_size: int = Field(alias="state-size", description="bytes")
    checkpointed_size: int = Field(alias="checkpointed-size", description="bytes")
    trigger_timestamp: int = Field(alias="trigger-timestamp")
    completion_timestamp: int | None = Field(alias="completion-timestamp")
    is_final: bool = Field(alias="is-final", description="Taken by a stop-with-savepoint.")
    restores: list[RestoreEntry]


class Savepoints(BaseModel):
    """Completed savepoints, newest first; `truncated` when older ones exist."""

    model_config = _ANSWER

    savepoints: list[SavepointEntry]
    truncated: bool


@router.get(
    "/savepoints",
    summary="Savepoints",
    description="The completed savepoints of every job (or of `job` only), newest first, "
    "`limit` of them (default: the server's `default_history`): location, size, job, when, "
    "and the restore requests that used each one (matched by location, so a savepoint "
    "restored into another job shows that restore too).",
    response_model=None,
    responses={**answer(Savepoints), **errors(400, 404)},
)
def list_savepoints(
    sessions: SessionsDep,
    settings: SettingsDep,
    job: Annotated[str | None, Query(max_length=200, description="Only this job's.")] = None,
    limit: Limit = None,
) -> JSONResponse:
    with sessions() as session:
        found: dict[str, Any] = queries.savepoints(session, job, limit or settings.default_history)
    return json_response(found)


@router.get(
    "/jobs/{job_id}/restores",
    summary="Restore requests",
    description="The restores requested of the job (REST, CLI or dashboard), newest first: "
    "the checkpoint or savepoint restored, the attempt it started and its status. Failures "
    "and restarts by the restart strategy are in `/jobs/{job_id}/exceptions`.",
    response_model=None,
    responses={**answer(JobRestores), **errors(400, 404)},
)
def job_restores(
    job_id: JobId, sessions: SessionsDep, settings: SettingsDep, limit: Limit = None
) -> JSONResponse:
    with sessions() as session:
        found = queries.job_restores(session, job_id, limit or settings.default_history)
    return json_response(found)


class DisposalRequest(BaseModel):
    """``POST /savepoint-disposal`` (Flink's body)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    savepoint_path: str = Field(
        alias="savepoint-path",
        min_length=1,
        max_length=4096,
        description="The savepoint's directory (or its _metadata), a path or a URL.",
    )


class DisposedSavepoint(BaseModel):
    """What a disposal deleted."""

    model_config = _ANSWER

    path: str = Field(description="The directory that was deleted.")
    job_id: str | None = Field(alias="job-id", description="Its job; null: no job had it.")
    checkpoint_id: int | None = Field(alias="checkpoint-id")
    kind: str | None = Field(description="savepoint, or checkpoint (an ended job's).")
    files: int
    bytes: int
    shared_files_kept: int = Field(
        alias="shared-files-kept",
        description="Files its handles reference in the job's shared/, which stay.",
    )


@router.post(
    "/savepoint-disposal",
    summary="Dispose of a savepoint",
    description="Flink's `POST /savepoint-disposal`: deletes the savepoint's directory, under "
    "the storage roots, and forgets it: `GET /savepoints` and the dashboard no longer offer "
    "it, and a live job's completed-checkpoint store lets it go. Refused (409) while it is "
    "a live job's newest restore point (a failover would restore it), pinned (a pending "
    "restore, an uncommitted sink transaction), or a live job's regular checkpoint. An ended "
    "job's checkpoint may be disposed of too. Unlike Flink, which answers a trigger id to "
    "poll, it answers when the files are gone, with what was deleted.",
    response_model=None,
    responses={**answer(DisposedSavepoint), **errors(400, 404, 409, 422, 503)},
)
def dispose_savepoint(body: DisposalRequest, control_plane: ControlPlaneDep) -> JSONResponse:
    return json_response(control_plane.dispose_savepoint(body.savepoint_path))
