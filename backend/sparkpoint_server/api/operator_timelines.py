"""``GET /jobs/{id}/checkpoints/operators``: each operator's checkpoints over time.

Flink has no such route (its web UI shows one checkpoint's operators at a time); the path
follows Flink's ``/jobs/:jobid/checkpoints/...`` family and the fields are those of its
``TaskCheckpointStatistics``. This router is included before ``api/checkpoints.py``'s, whose
``/checkpoints/{request_id}`` would otherwise take ``operators`` for a request id.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sparkpoint_server.api.deps import SessionsDep, json_response, require_token
from sparkpoint_server.api.responses import CheckpointStatus, answer, errors
from sparkpoint_server.api.schemas import JobId
from sparkpoint_server.storage.operator_timelines import (
    MAX_TIMELINE_CHECKPOINTS,
    operator_timelines,
)

router = APIRouter(tags=["checkpoints"], dependencies=[Depends(require_token)])

DEFAULT_TIMELINE_CHECKPOINTS = 100

_ANSWER = ConfigDict(extra="allow", populate_by_name=True)


class TimelineCheckpoint(BaseModel):
    """One checkpoint of the timelines, as its history entry counts it."""

    model_config = _ANSWER

    id: int
    status: CheckpointStatus
    is_savepoint: bool
    checkpoint_type: str
    trigger_timestamp: int | None
    end_to_end_duration: float | None = Field(description="ms; null until it completes")
    num_subtasks: int
    num_acknowledged_subtasks: int


class SlowestSubtask(BaseModel):
    """The subtask of the operator with the longest end-to-end duration in that checkpoint."""

    index: int
    end_to_end_duration: float


class OperatorCheckpoint(BaseModel):
    """One operator's part of one checkpoint; durations in ms, the slowest subtask's."""

    model_config = _ANSWER

    id: int = Field(description="The checkpoint's id")
    status: CheckpointStatus = Field(
        description="COMPLETED once every subtask acknowledged, else the checkpoint's status"
    )
    trigger_timestamp: int | None
    latest_ack_timestamp: int | None
    end_to_end_duration: float | None = Field(
        description="The operator's latest acknowledgement minus the trigger (null before one)"
    )
    sync_duration: float | None
    async_duration: float | None
    alignment_duration: float | None
    start_delay: float | None
    state_size: int
    checkpointed_size: int
    num_subtasks: int
    num_acknowledged_subtasks: int
    slowest_subtask: SlowestSubtask | None


class OperatorTimeline(BaseModel):
    """One operator (vertex) and its entry for each checkpoint of `checkpoints`, in order."""

    model_config = _ANSWER

    id: str
    name: str
    parallelism: int
    checkpoints: list[OperatorCheckpoint]


class OperatorTimelines(BaseModel):
    """The newest checkpoints, oldest first, and every operator's timeline over them."""

    checkpoints: list[TimelineCheckpoint]
    operators: list[OperatorTimeline]


@router.get(
    "/jobs/{job_id}/checkpoints/operators",
    summary="Per-operator checkpoint timelines",
    description="For each operator (vertex, in the graph's order), one entry per checkpoint of "
    "the newest `limit` (oldest first, the same order as `checkpoints`): its status, its "
    "end-to-end duration (latest acknowledgement minus trigger), the largest synchronous, "
    "asynchronous, alignment and start-delay parts over its subtasks, its state and "
    "checkpointed sizes, how many subtasks acknowledged and which subtask was slowest. "
    "Shows which operator holds checkpoints up; each checkpoint's per-subtask timeline is "
    "`GET /jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{operator_id}`. "
    "Sparkpoint's own route (Flink's web UI shows one checkpoint at a time).",
    response_model=None,
    responses={**answer(OperatorTimelines), **errors(404)},
)
def get_operator_timelines(
    job_id: JobId,
    sessions: SessionsDep,
    limit: Annotated[
        int,
        Query(
            ge=1,
            le=MAX_TIMELINE_CHECKPOINTS,
            description=f"How many of the newest checkpoints (at most {MAX_TIMELINE_CHECKPOINTS}).",
        ),
    ] = DEFAULT_TIMELINE_CHECKPOINTS,
) -> JSONResponse:
    with sessions() as session:
        timelines: dict[str, Any] = operator_timelines(session, job_id, limit)
    return json_response(timelines)
