"""What the routes depend on: the token and role check, settings, sessions, the clock, the service.

Everything comes from ``app.state``, filled by ``sparkpoint_server.app`` (``settings``,
``session_factory``, ``control_plane``, ``ingest_stats`` and, optionally, ``clock``) and by
``install_api`` (``checkpoint_summaries``). The
dependencies are ``async`` on purpose: they do no I/O, and FastAPI would otherwise run each
in a worker thread.
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from sparkpoint.clock import Clock, SystemClock
from sparkpoint_server.api.auth import (
    Role,
    Unauthenticated,
    authorize,
    identify,
    required_role,
)
from sparkpoint_server.api.errors import ControlPlaneUnavailableError
from sparkpoint_server.config import Settings
from sparkpoint_server.errors import NotAuthenticatedError
from sparkpoint_server.storage.checkpoint_summary import CheckpointSummaries

_bearer = HTTPBearer(
    auto_error=False,
    description="`Authorization: Bearer <token>`: a token of the role the operation needs "
    "(viewer, operator, admin).",
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

    def dispose_savepoint(self, path: str) -> dict[str, Any]:
        """Forget a savepoint and delete its files; returns what was deleted."""
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
    """Refuse a call whose bearer token's role is below what the operation needs
    (``auth.required_role``: operator for mutating calls, admin for ``/tokens`` and ``/audit``,
    viewer for reads when they are protected).

    No token configured (``None``: an app built without ``sparkpoint server``, which always
    has one): every call is allowed. An empty token refuses every call it protects. The
    caller is kept in ``request.state.principal`` for the audit log (``api/audit_trail.py``).

    Raises:
        NotAuthenticatedError: the token is missing, unknown, revoked or expired (401).
        PermissionDeniedError: the token's role is below the one needed (403).
    """
    settings: Settings = request.app.state.settings
    route = request.scope.get("route")
    path = getattr(route, "path", None) or request.url.path
    needed = required_role(request.method, path, settings)
    if needed is None:
        return
    what = "reads (protect_reads is on)" if needed is Role.VIEWER else "this call"
    if not settings.api_token:
        raise NotAuthenticatedError(f"the API token is empty: {what} cannot be authenticated")
    clock: Clock = await get_clock(request)
    secret = credentials.credentials if credentials is not None else None
    sessions = getattr(request.app.state, "session_factory", None)
    try:
        principal = await run_in_threadpool(
            identify, secret, what, settings, sessions, clock.now_ms()
        )
    except Unauthenticated as err:
        request.state.principal = err.principal
        raise
    request.state.principal = principal
    authorize(principal, needed)


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
