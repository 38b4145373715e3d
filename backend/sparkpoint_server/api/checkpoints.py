"""Checkpoints: statistics, one checkpoint's details, triggering one, and the configuration.

Route order matters: ``/checkpoints/config`` and ``/checkpoints/details/...`` are declared
before ``/checkpoints/{request_id}`` (the status of a triggered checkpoint) so that they win.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import JSONResponse

from sparkpoint.limits import MAX_PARALLELISM
from sparkpoint_server.api.deps import (
    ControlPlaneDep,
    SessionsDep,
    SettingsDep,
    SummariesDep,
    json_response,
    require_token,
)
from sparkpoint_server.api.responses import (
    CheckpointConfigAnswer,
    CheckpointDetails,
    CheckpointStatistics,
    OperationStatus,
    OperatorDetails,
    RequestAccepted,
    answer,
    errors,
)
from sparkpoint_server.api.schemas import (
    CheckpointConfigPatch,
    CheckpointId,
    JobId,
    OperatorId,
    RequestId,
    TriggerCheckpointRequest,
)
from sparkpoint_server.storage import checkpoint_stats, job_settings, queries

router = APIRouter(tags=["checkpoints"], dependencies=[Depends(require_token)])

SUBTASKS_PAGE = 1024  # subtasks per answer unless ``limit`` says otherwise


@router.get(
    "/jobs/{job_id}/checkpoints",
    summary="Checkpointing statistics",
    description="Flink's checkpointing statistics: `counts` (`restored` = restarts plus "
    "completed restore requests), `summary` (min/max/avg/p50/p90/p95/p99/p999 over completed "
    "checkpoints), `latest` (`completed`, `savepoint`, `failed`, `restored`) and `history` "
    "(newest first, `limit` entries; default: the server's `default_history`). Each "
    "checkpoint entry also has the `epoch` that carried its barrier and that epoch's "
    "`spark-job-group` in the Spark UI (both null until a source injected the barrier), "
    "`committed` (a completed checkpoint whose sinks committed its output, or that had none "
    "to commit) and `commit_timestamp` (when the job's sinks committed it, the job's clock; "
    "null while they have not, or when it had no sink transaction). `latest.restored` also "
    "has `state_restore_duration` (ms: the slowest keyed subtask's state restore) and "
    "`first_record_timestamp` (when the job processed its first record after the restore, "
    "the executors' clock), both null until the first epoch after the restore ends, and "
    "`epoch_reported` (whether it has ended: null timings then mean that no keyed state was "
    "restored). `latest.failover` (Sparkpoint's): what a failover restores now: `id`, "
    "`is_savepoint` and `external_path` of the newest retained checkpoint of the job's line "
    "(null `id`: the beginning), the line's `origin` (`id`, `external_path`, `next_id`: the "
    "checkpoint its `--from-checkpoint` or its latest restore request named, and the first id "
    "after it; null: it started from the beginning and was never restored), and "
    "`passed_over`: the retained checkpoints a restore went back past, which a failover does "
    "not restore (a restore request still may). `latest.origin_of` (Sparkpoint's): the "
    "job's retained checkpoints that another live job started from (or restored by its path) "
    "and would restore in a failover, having no checkpoint since, oldest first: `id`, "
    "`is_savepoint`, `external_path` and those `jobs`; retention keeps them past `retained` "
    "until then.",
    response_model=None,
    responses={**answer(CheckpointStatistics), **errors(404)},
)
def get_checkpoints(
    job_id: JobId,
    sessions: SessionsDep,
    settings: SettingsDep,
    summaries: SummariesDep,
    limit: Annotated[int | None, Query(ge=1, le=10_000, description="History entries.")] = None,
) -> JSONResponse:
    with sessions() as session:
        stats = checkpoint_stats.checkpoint_statistics(
            session, job_id, limit or settings.default_history, summaries
        )
    return json_response(stats)


@router.post(
    "/jobs/{job_id}/checkpoints",
    summary="Trigger a checkpoint",
    description="Triggers a checkpoint now (Flink 1.17+). Answers 202 with the `request-id`; "
    "poll `GET /jobs/{job_id}/checkpoints/{request_id}`.",
    status_code=202,
    response_model=None,
    responses={**answer(RequestAccepted, 202), **errors(404, 409, 503)},
)
def trigger_checkpoint(
    job_id: JobId,
    sessions: SessionsDep,
    control_plane: ControlPlaneDep,
    body: Annotated[TriggerCheckpointRequest | None, Body()] = None,
) -> JSONResponse:
    with sessions() as session:
        queries.require_job(session, job_id)
    return json_response({"request-id": control_plane.trigger_checkpoint(job_id)}, 202)


@router.get(
    "/jobs/{job_id}/checkpoints/config",
    summary="Checkpoint configuration",
    description="Mode, interval, timeout, minimum pause, max concurrent, tolerable failures, "
    "retained count, state backend and storage; `changeable` lists what PATCH accepts.",
    response_model=None,
    responses={**answer(CheckpointConfigAnswer), **errors(404)},
)
def get_checkpoint_config(job_id: JobId, sessions: SessionsDep) -> JSONResponse:
    with sessions() as session:
        return json_response(job_settings.checkpoint_config(session, job_id))


@router.patch(
    "/jobs/{job_id}/checkpoints/config",
    summary="Change the checkpoint configuration",
    description="Any of `interval`, `timeout`, `min_pause` (ms), `tolerable_failed_checkpoints`"
    " and `retained`; they apply from the next trigger. `mode` and `max_concurrent` change "
    "only when the job (re)starts. A `timeout` shorter than every epoch the job ran lately "
    "is refused (400) with one that would do: a barrier rides one whole epoch. Answers with "
    "the GET shape.",
    response_model=None,
    responses={**answer(CheckpointConfigAnswer), **errors(404, 409, 503)},
)
def patch_checkpoint_config(
    job_id: JobId,
    body: CheckpointConfigPatch,
    sessions: SessionsDep,
    control_plane: ControlPlaneDep,
) -> JSONResponse:
    with sessions() as session:
        current = job_settings.checkpoint_config(session, job_id)
    updated = control_plane.update_checkpoint_config(job_id, body.changes())
    for name, key in job_settings.CONFIG_KEYS.items():
        if key in updated:
            current[name] = updated[key]
    return json_response(current)


@router.get(
    "/jobs/{job_id}/checkpoints/details/{checkpoint_id}",
    summary="One checkpoint",
    description="The checkpoint's history entry (with its `epoch`, `spark-job-group`, "
    "`committed`, `commit_timestamp` and, once it failed, Flink's `failure_timestamp`) "
    "plus `tasks`: per operator, its status, acknowledged subtasks, sizes, slowest "
    "end-to-end duration and buffered bytes.",
    response_model=None,
    responses={**answer(CheckpointDetails), **errors(404)},
)
def get_checkpoint_details(
    job_id: JobId, checkpoint_id: CheckpointId, sessions: SessionsDep
) -> JSONResponse:
    with sessions() as session:
        return json_response(checkpoint_stats.checkpoint_details(session, job_id, checkpoint_id))


@router.get(
    "/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{operator_id}",
    summary="One operator of one checkpoint",
    description="The operator's task entry, a `summary` (min/max/avg of sizes, durations, "
    "alignment, start delay, over every subtask) and its subtasks: barrier, alignment, sync "
    "and async parts, acknowledgement and state handles (never inline bytes; each with its "
    "`format` and, for a native incremental snapshot, the `shared` files it references). "
    "`subtasks` "
    f"holds `limit` of them (default {SUBTASKS_PAGE}) from index `offset`; `num_subtasks` "
    "says how many there are. Alignment on Spark reflects input skew and read order, not "
    "network backpressure (Spark's shuffle is blocking).",
    response_model=None,
    responses={**answer(OperatorDetails), **errors(404)},
)
def get_subtask_details(
    job_id: JobId,
    checkpoint_id: CheckpointId,
    operator_id: OperatorId,
    sessions: SessionsDep,
    offset: Annotated[int, Query(ge=0, lt=MAX_PARALLELISM, description="First subtask.")] = 0,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PARALLELISM, description="How many subtasks.")
    ] = SUBTASKS_PAGE,
) -> JSONResponse:
    with sessions() as session:
        details = checkpoint_stats.subtask_details(session, job_id, checkpoint_id, operator_id)
    details["subtasks"] = details["subtasks"][offset : offset + limit]
    return json_response(details)


@router.get(
    "/jobs/{job_id}/checkpoints/{request_id}",
    summary="Status of a triggered checkpoint",
    description="`status.id` IN_PROGRESS or COMPLETED; when completed, `operation.checkpointId`"
    " or, if it failed, `operation.failure-cause` (and `failed: true`).",
    response_model=None,
    responses={**answer(OperationStatus), **errors(404)},
)
def get_checkpoint_trigger_status(
    job_id: JobId, request_id: RequestId, sessions: SessionsDep
) -> JSONResponse:
    with sessions() as session:
        return json_response(queries.operation_status(session, job_id, "checkpoint", request_id))
