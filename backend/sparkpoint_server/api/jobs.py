"""Jobs: the list and overview, one job's detail, its throughput and failures, cancelling it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from sparkpoint.limits import MAX_INT
from sparkpoint_server.api.deps import (
    ClockDep,
    ControlPlaneDep,
    SessionsDep,
    SettingsDep,
    json_response,
    require_token,
)
from sparkpoint_server.api.responses import (
    ExceptionHistory,
    JobDetails,
    JobList,
    JobsOverview,
    RequestAccepted,
    ThroughputSample,
    answer,
    errors,
)
from sparkpoint_server.api.schemas import JobId
from sparkpoint_server.errors import InvalidRequestError
from sparkpoint_server.storage import job_overview, queries

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_token)])

History = Annotated[int | None, Query(ge=1, le=10_000, description="How many entries.")]
# Flink's name of the exception history's limit (``limit`` wins when both are given).
MaxExceptions = Annotated[
    int | None,
    Query(alias="maxExceptions", ge=1, le=10_000, description="Flink's name for `limit`."),
]


@router.get(
    "/jobs",
    summary="List jobs",
    description="The jobs, newest first, `limit` of them (default 1000) after skipping "
    "`offset`; `total` counts them all. Each: status, times, attempt, restarts, its last "
    "finished checkpoint (`last-checkpoint`: the newest completed or failed one, with its "
    "outcome and when it finished), its current records per second and its end-to-end "
    "`guarantee`.",
    response_model=None,
    responses={**answer(JobList), **errors(400)},
)
def list_jobs(
    sessions: SessionsDep,
    clock: ClockDep,
    limit: Annotated[int, Query(ge=1, le=10_000, description="How many jobs.")] = 1000,
    offset: Annotated[int, Query(ge=0, le=MAX_INT, description="Jobs skipped.")] = 0,
) -> JSONResponse:
    with sessions() as session:
        jobs, total = queries.list_jobs(session, clock.now_ms(), limit=limit, offset=offset)
    return json_response({"jobs": jobs, "total": total})


# Before /jobs/{job_id}, which would take `overview` for a job id.
@router.get(
    "/jobs/overview",
    summary="Jobs overview",
    description="Flink's `GET /jobs/overview`: every job, newest first, as Flink's "
    "`JobDetails`: `jid`, `name`, `state`, `start-time`, `end-time` (-1 while it has not "
    "ended), `duration`, `last-modification` (its latest status change) and `tasks`: how many "
    "of its subtasks are in each of Flink's execution states, and `total` (the sum of its "
    "vertices' parallelism). Sparkpoint does not track subtasks one by one: each is counted "
    "in the state its job's status implies: CREATED `created`, RUNNING `running`, FAILING and "
    "CANCELLING `canceling`, RESTARTING and CANCELED `canceled`, FAILED `failed`, FINISHED "
    "`finished` (`scheduled`, `deploying`, `reconciling`, `initializing` stay 0). The path is "
    "not a job id: `overview` is refused as a job id (by `--job-id` and at registration).",
    response_model=None,
    responses=answer(JobsOverview),
)
def jobs_overview(sessions: SessionsDep, clock: ClockDep) -> JSONResponse:
    with sessions() as session:
        return json_response({"jobs": job_overview.jobs_overview(session, clock.now_ms())})


async def _overview_is_not_a_job(request: Request) -> Response:
    """``PATCH /jobs/overview`` is not a cancel of a job ``overview``: the path has only GET."""
    raise HTTPException(405)


# A plain route (no token dependency), as Starlette's own 405 for a method the path lacks.
router.add_route("/jobs/overview", _overview_is_not_a_job, ["PATCH"], include_in_schema=False)


@router.get(
    "/jobs/{job_id}",
    summary="Job details",
    description="Flink's job detail (`jid`, `state`, `vertices`, `timestamps`...) plus the "
    "status history, the latest heartbeat's `throughput` (`source-lag` is null while a split's "
    "source does not answer, and `unanswered-splits` names those splits; `epoch-bound`: the "
    "milliseconds the driver held its latest epoch within so that checkpoints complete within "
    "their timeout, null when it was not held back), the registered "
    "configuration and "
    "`spark`: the `ui-url` and `application-id` of the current driver's Spark application "
    "(null until the driver reports RUNNING; `ui-url` also when the Spark UI is off) and its "
    "`executors` after the latest epoch (`id`, `host`, `cores`, `active`, and for a lost one "
    "Spark's `remove-reason`; null from a driver that does not report them). "
    "`guarantee`: the end-to-end delivery guarantee its sources and sinks give "
    "(`exactly_once`, `at_least_once`, `at_most_once`) with the `reason` when it is weaker, "
    "null when the driver did not report one. `driver`: its `heartbeat-interval` and "
    "`last-heartbeat` (null: a driver that sends none), and `first-epoch-ended`: whether the "
    "current attempt's first epoch (Spark's start-up) ended; periodic checkpoints wait for it, "
    "as Flink's wait for all tasks to run (null: a driver that does not report it).",
    response_model=None,
    responses={**answer(JobDetails), **errors(404)},
)
def job_details(job_id: JobId, sessions: SessionsDep, clock: ClockDep) -> JSONResponse:
    with sessions() as session:
        return json_response(queries.job_details(session, job_id, clock.now_ms()))


@router.patch(
    "/jobs/{job_id}",
    summary="Cancel a job",
    description="Flink's `PATCH /jobs/:jobid?mode=cancel`: the job stops without a savepoint "
    "(use `POST /jobs/{job_id}/stop` to stop with one). Answers 202 with the request id.",
    status_code=202,
    response_model=None,
    responses={**answer(RequestAccepted, 202), **errors(404, 409, 503)},
)
def cancel_job(
    job_id: JobId,
    sessions: SessionsDep,
    control_plane: ControlPlaneDep,
    mode: Annotated[
        str, Query(description="Only `cancel`.", json_schema_extra={"enum": ["cancel"]})
    ] = "cancel",
) -> JSONResponse:
    if mode != "cancel":
        raise InvalidRequestError(
            "mode",
            f"unknown mode {mode!r}; the only mode is 'cancel' (to stop with a "
            f"savepoint: POST /jobs/{job_id}/stop)",
        )
    with sessions() as session:
        queries.require_job(session, job_id)
    return json_response({"request-id": control_plane.cancel(job_id)}, 202)


@router.get(
    "/jobs/{job_id}/metrics/throughput",
    summary="Throughput history",
    description="The job's last `limit` heartbeats (one per accepted epoch), oldest first: "
    "records, records per second, source lag (null while a split's source did not answer: "
    "`unanswered-splits`) and epoch duration.",
    response_model=None,
    responses={**answer(list[ThroughputSample], description="Oldest first."), **errors(404)},
)
def job_throughput(
    job_id: JobId,
    sessions: SessionsDep,
    limit: Annotated[int, Query(ge=1, le=10_000, description="How many samples.")] = 300,
) -> JSONResponse:
    with sessions() as session:
        return json_response(queries.throughput(session, job_id, limit))


@router.get(
    "/jobs/{job_id}/exceptions",
    summary="Exception history",
    description="Flink's `exceptionHistory`: the job's failures newest first, each with what "
    "the restart strategy decided (`action`); `truncated` when older ones exist.",
    response_model=None,
    responses={**answer(ExceptionHistory), **errors(404)},
)
def job_exceptions(
    job_id: JobId,
    sessions: SessionsDep,
    settings: SettingsDep,
    limit: History = None,
    max_exceptions: MaxExceptions = None,
) -> JSONResponse:
    wanted = limit or max_exceptions or settings.default_history
    with sessions() as session:
        history = queries.exception_history(session, job_id, wanted)
    return json_response({"exceptionHistory": history})
