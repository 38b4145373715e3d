"""``GET /healthz``: the control plane answers, reaches its database and (in two processes) has
its engine running."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from sparkpoint_server.api.deps import SessionsDep, json_response
from sparkpoint_server.api.errors import public_cause
from sparkpoint_server.api.metrics import ingest_counters
from sparkpoint_server.api.responses import Health, Unhealthy, answer
from sparkpoint_server.engine_process import EngineUnavailableError
from sparkpoint_server.storage.queries import ping

logger = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    summary="Health check",
    description='`{"status": "ok"}` when the database answers `SELECT 1` and the engine (the '
    "process that coordinates, when the API runs in a process of its own) is running, with "
    "`ingest`: how far the control plane has read the events its jobs send; otherwise "
    "503 with the database error (without its host, port or user), or saying that the "
    "engine is being started again. Never needs a token.",
    response_model=None,
    responses={**answer(Health), **answer(Unhealthy, 503)},
)
def healthz(request: Request, sessions: SessionsDep) -> JSONResponse:
    engine = getattr(request.app.state, "engine", None)  # two processes: the API's runner
    if engine is not None and not engine.engine_up():
        error = "the control plane's engine is not running; it is being started again"
        return json_response({"status": "unavailable", "errors": [error]}, 503)
    try:
        with sessions() as session:
            ping(session)
    except SQLAlchemyError as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        logger.warning("GET /healthz: database unreachable: %s: %s", type(err).__name__, reason)
        error = f"database unreachable: {type(err).__name__}: {public_cause(reason)}"
        return json_response({"status": "unavailable", "errors": [error]}, 503)
    ingest = _ingest_progress(request)
    return json_response({"status": "ok", **({"ingest": ingest} if ingest else {})})


def _ingest_progress(request: Request) -> dict[str, int | None] | None:
    """How far the ingest has read (the engine's counters in two processes); None: unknown."""
    try:
        counters = ingest_counters(getattr(request.app.state, "ingest_stats", None))
    except EngineUnavailableError:  # it died since engine_up(): /healthz says so next time
        return None
    if not counters or "read_through_ms" not in counters:
        return None
    read_through = int(counters["read_through_ms"] or 0) or None
    behind = None if read_through is None else max(0, int(time.time() * 1000) - read_through)
    return {"read-through": read_through, "behind-ms": behind}
