"""``GET /audit``: the audit log (admin only), newest first, of one job or of all.

The entries are written by ``api/audit_trail.py``: one per mutating call, allowed or refused.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sparkpoint.limits import MAX_INT, MAX_JOB_ID_LENGTH
from sparkpoint_server.api.deps import SessionsDep, json_response, require_token
from sparkpoint_server.api.responses import answer
from sparkpoint_server.storage import access

router = APIRouter(tags=["audit"], dependencies=[Depends(require_token)])

MAX_PAGE = 1000


class AuditLogEntry(BaseModel):
    """One mutating call: who (`token-id`, `token-name`, `role`; `anonymous` without a token,
    `invalid token` with an unknown, revoked or expired one), what (`method`, `path`,
    `job-id`, `request`: the body, summarised and without secrets), when (`time`, ms since
    the epoch) and the outcome (`status`; `request-id` of the operation it started)."""

    model_config = ConfigDict(populate_by_name=True)

    id: int
    time: int
    token_id: str | None = Field(alias="token-id")
    token_name: str = Field(alias="token-name")
    role: str | None
    method: str
    path: str
    job_id: str | None = Field(alias="job-id")
    request: str | None
    status: int
    request_id: str | None = Field(alias="request-id")


class AuditLog(BaseModel):
    """A page of the audit log, newest first; `total` entries match the filter."""

    entries: list[AuditLogEntry]
    total: int


@router.get(
    "/audit",
    summary="Audit log",
    description="Every mutating call, allowed or refused, newest first: `limit` entries from "
    "`offset`, of the job `job` if given. The server keeps the newest "
    "`SPARKPOINT_AUDIT_RETENTION` entries.",
    response_model=None,
    responses={
        **answer(AuditLog),
    },
)
def audit_log(
    sessions: SessionsDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="How many entries.")] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_INT, description="Entries skipped.")] = 0,
    job: Annotated[
        str | None, Query(max_length=MAX_JOB_ID_LENGTH, description="Only this job's calls.")
    ] = None,
) -> JSONResponse:
    with sessions() as session:
        return json_response(access.audit_log(session, limit, offset, job))
