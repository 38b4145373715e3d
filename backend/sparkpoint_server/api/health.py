"""``GET /healthz``: the control plane answers and reaches its database."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from sparkpoint_server.api.deps import SessionsDep, json_response
from sparkpoint_server.api.responses import Health, Unhealthy, answer
from sparkpoint_server.storage.queries import ping

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    summary="Health check",
    description='`{"status": "ok"}` when the database answers `SELECT 1`; otherwise 503 '
    "with the database error. Never needs a token.",
    response_model=None,
    responses={**answer(Health), **answer(Unhealthy, 503)},
)
def healthz(sessions: SessionsDep) -> JSONResponse:
    try:
        with sessions() as session:
            ping(session)
    except SQLAlchemyError as err:
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        error = f"database unreachable: {type(err).__name__}: {reason}"
        return json_response({"status": "unavailable", "errors": [error]}, 503)
    return json_response({"status": "ok"})
