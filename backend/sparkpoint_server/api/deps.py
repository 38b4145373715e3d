"""What the routes depend on: the token check, settings, sessions, the clock, the service.

Everything comes from ``app.state``, filled by ``sparkpoint_server.app`` (``settings``,
``session_factory``, ``control_plane``, ``ingest_stats`` and, optionally, ``clock``) and by
``install_api`` (``checkpoint_summaries``). The
dependencies are ``async`` on purpose: they do no I/O, and FastAPI would otherwise run each
in a worker thread.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint.clock import Clock, SystemClock
from sparkpoint_server.api.errors import ControlPlaneUnavailableError
from sparkpoint_server.config import Settings
from sparkpoint_server.errors import NotAuthenticatedError
from sparkpoint_server.storage.checkpoint_summary import CheckpointSummaries

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_bearer = HTTPBearer(
    auto_error=False,
    description="`Authorization: Bearer <SPARKPOINT_API_TOKEN>`: needed by every mutating "
    "call, and by reads when `SPARKPOINT_PROTECT_READS` is set.",
)


class ControlPlaneCommands(Protocol):
    """The coordination service's commands that the REST API calls (mutating routes only).

    Each returns as soon as the request is recorded; the outcome is read from the database
    (``GET .../{request_id}``). Errors are :class:`~sparkpoint_server.errors.ControlPlaneError`
    subclasses, which the API maps to their HTTP status.
    """

    def trigger_checkpoint(self, job_id: str) -> str:
        """Trigger a checkpoint now; returns the request id."""
        ...

    def trigger_savepoint(self, job_id: str, target_directory: str | None, cancel_job: bool) -> str:
        """Trigger a savepoint (then cancel the job if ``cancel_job``); returns the request id."""
        ...

    def stop_with_savepoint(self, job_id: str, target_directory: str | None) -> str:
        """Take a savepoint and finish the job once it completed; returns the request id."""
        ...

    def restore(self, job_id: str, checkpoint_id: int | None, savepoint_path: str | None) -> str:
        """Restart the job from a checkpoint of its own or a savepoint; returns the request id."""
        ...

    def cancel(self, job_id: str) -> str:
        """Cancel the job; returns the request id."""
        ...

    def update_checkpoint_config(self, job_id: str, changes: dict[str, int]) -> dict[str, Any]:
        """Change runtime-mutable checkpoint settings (``interval_ms``...); returns them all."""
        ...

    def set_restart_strategy(
        self, job_id: str, conf: dict[str, str | int | float]
    ) -> dict[str, Any]:
        """Replace the restart strategy (Flink keys); returns the stored options."""
        ...


async def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Refuse a call without the configured bearer token (mutating calls; reads if protected).

    No token configured: every call is allowed (local development; the settings refuse that
    outside local use).

    Raises:
        NotAuthenticatedError: the token is missing or wrong.
    """
    settings: Settings = request.app.state.settings
    expected = settings.api_token
    if not expected:
        return
    if request.method not in MUTATING_METHODS and not settings.protect_reads:
        return
    what = "this call" if request.method in MUTATING_METHODS else "reads (protect_reads is on)"
    if credentials is None:
        raise NotAuthenticatedError(
            f"a bearer token is required for {what}: send 'Authorization: Bearer <token>'"
        )
    if not hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise NotAuthenticatedError(f"the bearer token is wrong for {what}")


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_sessions(request: Request) -> sessionmaker[Session]:
    sessions: sessionmaker[Session] = request.app.state.session_factory
    return sessions


async def get_summaries(request: Request) -> CheckpointSummaries | None:
    """The app's cache of checkpoint summaries (``install_api`` creates it)."""
    summaries: CheckpointSummaries | None = getattr(request.app.state, "checkpoint_summaries", None)
    return summaries


async def get_clock(request: Request) -> Clock:
    clock: Clock | None = getattr(request.app.state, "clock", None)
    return clock if clock is not None else SystemClock()


async def get_control_plane(request: Request) -> ControlPlaneCommands:
    """The coordination service.

    Raises:
        ControlPlaneUnavailableError: none runs in this process.
    """
    service: ControlPlaneCommands | None = getattr(request.app.state, "control_plane", None)
    if service is None:
        raise ControlPlaneUnavailableError("the coordination service is not running")
    return service


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionsDep = Annotated[sessionmaker[Session], Depends(get_sessions)]
SummariesDep = Annotated[CheckpointSummaries | None, Depends(get_summaries)]
ClockDep = Annotated[Clock, Depends(get_clock)]
ControlPlaneDep = Annotated[ControlPlaneCommands, Depends(get_control_plane)]


def json_response(content: Any, status_code: int = 200) -> JSONResponse:
    """``content`` as JSON, skipping FastAPI's encoder (the queries return plain JSON types)."""
    return JSONResponse(content, status_code=status_code)
