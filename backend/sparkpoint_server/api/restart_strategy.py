"""A job's restart strategy: read it, or replace it (Flink's ``restart-strategy.*`` keys)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends
from fastapi.responses import JSONResponse

from sparkpoint.checkpointing.restart import (
    DEFAULTS,
    TYPE_KEY,
    ConfigValue,
    restart_strategy_from_config,
)
from sparkpoint.errors import ConfigurationError
from sparkpoint_server.api.deps import ControlPlaneDep, SessionsDep, json_response, require_token
from sparkpoint_server.api.errors import InvalidConfigurationError
from sparkpoint_server.api.responses import RestartStrategyAnswer, answer, errors
from sparkpoint_server.api.schemas import JobId
from sparkpoint_server.errors import InvalidRequestError
from sparkpoint_server.storage import job_settings, queries

router = APIRouter(tags=["restart strategy"], dependencies=[Depends(require_token)])

TYPES = "none, off, disable, fixed-delay, fixeddelay, failure-rate, failurerate, "
TYPES += "exponential-delay, exponentialdelay"

#: The body's JSON Schema: the type and Flink's options, each a string or a number.
BODY_SCHEMA: dict[str, Any] = {
    "properties": {
        TYPE_KEY: {"type": "string", "description": f"One of {TYPES} (any case)."},
        **{key: {"type": ["string", "number"]} for key in DEFAULTS},
    },
    "required": [TYPE_KEY],
    "additionalProperties": False,
}

EXAMPLE = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": 3,
    "restart-strategy.fixed-delay.delay": "10 s",
}


def validate_restart_strategy(conf: dict[str, Any]) -> dict[str, ConfigValue]:
    """Check a restart strategy as :func:`restart_strategy_from_config` builds it.

    Returns:
        ``conf``, typed.

    Raises:
        InvalidRequestError: a key is unknown, missing, of the wrong type, or belongs to
            another strategy type.
        InvalidConfigurationError: a value is invalid (the message names the key).
    """
    unknown = sorted(set(conf) - {TYPE_KEY, *DEFAULTS})
    if unknown:
        raise InvalidRequestError(
            ", ".join(unknown),
            f"unknown restart strategy option; known: {', '.join([TYPE_KEY, *DEFAULTS])}",
        )
    if TYPE_KEY not in conf:
        raise InvalidRequestError(TYPE_KEY, f"required; one of {TYPES}")
    for key, value in conf.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise InvalidRequestError(key, f"must be a string or a number, got {value!r}")
    try:
        strategy = restart_strategy_from_config(conf, checkpointing_enabled=True)
    except ConfigurationError as err:
        raise InvalidConfigurationError(str(err)) from err
    prefix = f"restart-strategy.{strategy.type_name}."
    foreign = sorted(k for k in conf if k != TYPE_KEY and not k.startswith(prefix))
    if foreign:
        raise InvalidRequestError(
            ", ".join(foreign), f"does not apply to {TYPE_KEY} {conf[TYPE_KEY]!r}"
        )
    return dict(conf)


@router.get(
    "/jobs/{job_id}/restart-strategy",
    summary="Restart strategy",
    description="The job's restart strategy as Flink options, plus a one-line `description`.",
    response_model=None,
    responses={**answer(RestartStrategyAnswer), **errors(404)},
)
def get_restart_strategy(job_id: JobId, sessions: SessionsDep) -> JSONResponse:
    with sessions() as session:
        return json_response(job_settings.restart_strategy(session, job_id))


@router.put(
    "/jobs/{job_id}/restart-strategy",
    summary="Replace the restart strategy",
    description=f"A flat object of Flink options: `{TYPE_KEY}` ({TYPES}) and that type's "
    "`restart-strategy.<type>.*` keys (missing ones take Flink's defaults). Applies to the "
    "next failure. Answers with the GET shape.",
    response_model=None,
    responses={**answer(RestartStrategyAnswer), **errors(404, 409, 503)},
)
def put_restart_strategy(
    job_id: JobId,
    conf: Annotated[
        dict[str, Any],
        Body(openapi_examples={"fixed-delay": {"value": EXAMPLE}}, json_schema_extra=BODY_SCHEMA),
    ],
    sessions: SessionsDep,
    control_plane: ControlPlaneDep,
) -> JSONResponse:
    valid = validate_restart_strategy(conf)
    with sessions() as session:
        queries.require_job(session, job_id)
    stored = control_plane.set_restart_strategy(job_id, valid)
    return json_response(job_settings.shape_restart_strategy(stored))
