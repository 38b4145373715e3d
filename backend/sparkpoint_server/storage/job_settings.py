"""A job's settings as the REST API shows them: its checkpointing configuration (Flink's field
names, what ``PATCH`` may change) and its restart strategy (Flink's keys and a description)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.restart import restart_strategy_from_config
from sparkpoint.errors import ConfigurationError
from sparkpoint_server.errors import JobNotFoundError
from sparkpoint_server.storage.models import Job

J = Job.__table__.c

#: API field of the checkpoint configuration -> key of ``jobs.checkpoint_config``.
CONFIG_KEYS = {
    "mode": "mode",
    "interval": "interval_ms",
    "timeout": "timeout_ms",
    "min_pause": "min_pause_ms",
    "max_concurrent": "max_concurrent",
    "tolerable_failed_checkpoints": "tolerable_failures",
    "retained": "retained",
}
#: The fields that ``PATCH /jobs/{id}/checkpoints/config`` changes on a running job.
CHANGEABLE = ("interval", "timeout", "min_pause", "tolerable_failed_checkpoints", "retained")


def checkpoint_config(session: Session, job_id: str) -> dict[str, Any]:
    """The job's checkpointing configuration, Flink's field names, and what PATCH may change.

    Raises:
        JobNotFoundError: the job is unknown.
    """
    row = session.execute(select(J.checkpoint_config, J.config).where(J.job_id == job_id)).first()
    if row is None:
        raise JobNotFoundError(job_id)
    return shape_checkpoint_config(row.checkpoint_config or {}, row.config or {})


def shape_checkpoint_config(current: dict[str, Any], registered: dict[str, Any]) -> dict[str, Any]:
    """The GET shape from ``jobs.checkpoint_config`` (current) and ``jobs.config`` (registered).

    A key missing from both takes :class:`~sparkpoint.checkpointing.config.CheckpointConfig`'s
    default (Flink's).
    """
    defaults = CheckpointConfig()
    shaped: dict[str, Any] = {}
    for api_name, key in CONFIG_KEYS.items():
        value = current.get(key, registered.get(key, getattr(defaults, key)))
        shaped[api_name] = getattr(value, "value", value)  # the mode enum's name
    return {
        **shaped,
        "state_backend": registered.get("state_backend"),
        "incremental": registered.get("incremental") is True,
        "checkpoint_storage": registered.get("checkpoint_storage"),
        "checkpoint_dir": registered.get("checkpoint_dir"),
        "changeable": list(CHANGEABLE),
    }


def restart_strategy(session: Session, job_id: str) -> dict[str, Any]:
    """The job's restart strategy (Flink keys) and a ``description`` of it.

    Raises:
        JobNotFoundError: the job is unknown.
    """
    conf = session.execute(
        select(J.restart_strategy).where(J.job_id == job_id)
    ).scalar_one_or_none()
    if conf is None:
        raise JobNotFoundError(job_id)
    return shape_restart_strategy(conf)


def shape_restart_strategy(conf: dict[str, Any]) -> dict[str, Any]:
    """The GET shape of a restart strategy: its Flink keys plus ``description``."""
    try:
        description = restart_strategy_from_config(conf, checkpointing_enabled=True).describe()
    except ConfigurationError as err:
        description = f"invalid restart strategy: {err}"
    return {**conf, "description": description}
