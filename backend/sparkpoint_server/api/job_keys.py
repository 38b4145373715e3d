"""A job's signing key, handed to its driver over the authenticated API (``sparkpoint.signing``).

A driver that cannot read the control plane's data directory (another machine) asks for its
job's key with the operator's API token; the key signs that job's events and checks its
commands, and nothing of any other job. Always authenticated, whatever ``protect_reads`` says.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from sparkpoint.limits import JOB_ID_PATTERN, MAX_JOB_ID_LENGTH
from sparkpoint_server.api.deps import require_token
from sparkpoint_server.api.responses import answer, errors
from sparkpoint_server.errors import NotAuthenticatedError

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_token)])

KeyJobId = Annotated[
    str,
    Path(
        description="The job's id (it need not be registered yet).",
        pattern=JOB_ID_PATTERN,
        max_length=MAX_JOB_ID_LENGTH,
    ),
]


class JobKey(BaseModel):
    """The key a job's driver signs its events and checks its commands with."""

    model_config = ConfigDict(populate_by_name=True)

    job_id: str = Field(alias="job-id")
    key: str = Field(description="HMAC-SHA256 key, 64 hex digits.", pattern="^[0-9a-f]{64}$")


@router.post(
    "/jobs/{job_id}/key",
    summary="The key a job's driver signs its events with",
    responses={**answer(JobKey), **errors(400, 401)},
)
async def job_key(job_id: KeyJobId, request: Request) -> dict[str, str]:
    """The job's HMAC-SHA256 key, in hex (docs/control-plane.md, "Authenticated messages"):
    for a driver that cannot read the control plane's data directory. Needs the API token."""
    if request.app.state.settings.api_token is None:
        raise NotAuthenticatedError("no API token is configured: job keys are not handed out")
    key: bytes = request.app.state.control_plane.key_of(job_id)
    return {"job-id": job_id, "key": key.hex()}
