"""The REST API's inputs: path parameters, and request bodies with Flink's field names.

Unknown fields are refused (the error names them), integers and booleans must be JSON
integers and booleans (no ``"5"`` for 5), every number has the bounds of ``sparkpoint.limits``
(so that nothing reaches the database that it cannot hold), and each model says in its
validators what a valid combination of fields is. Responses are plain dicts (see
``storage/queries.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from sparkpoint.limits import MAX_DURATION_MS, MAX_INT, MAX_JOB_ID_LENGTH, MAX_NAME_LENGTH
from sparkpoint_server.storage.job_settings import CHANGEABLE, CONFIG_KEYS

JobId = Annotated[str, Path(description="The job's id.", max_length=MAX_JOB_ID_LENGTH)]
CheckpointId = Annotated[int, Path(ge=1, le=MAX_INT, description="The checkpoint's id.")]
OperatorId = Annotated[
    str, Path(description="The operator (vertex) uid.", max_length=MAX_NAME_LENGTH)
]
RequestId = Annotated[str, Path(description="The id a trigger answered.", max_length=36)]

_FIELDS = ConfigDict(extra="forbid", populate_by_name=True)


class TriggerCheckpointRequest(BaseModel):
    """``POST /jobs/{id}/checkpoints`` (optional body)."""

    model_config = _FIELDS

    checkpoint_type: Literal["CONFIGURED", "FULL", "INCREMENTAL"] = Field(
        default="CONFIGURED",
        alias="checkpointType",
        description="Flink's checkpoint type; accepted for compatibility, the job's state "
        "backend decides whether a checkpoint is incremental.",
    )


class TriggerSavepointRequest(BaseModel):
    """``POST /jobs/{id}/savepoints``."""

    model_config = _FIELDS

    target_directory: str | None = Field(
        default=None,
        alias="target-directory",
        min_length=1,
        description="Where the savepoint goes (any fsspec URL); default: the control plane's "
        "savepoint directory.",
    )
    cancel_job: bool = Field(
        default=False,
        alias="cancel-job",
        strict=True,
        description="Cancel the job once the savepoint completed.",
    )


class StopWithSavepointRequest(BaseModel):
    """``POST /jobs/{id}/stop``: Flink's ``targetDirectory`` or ``target-directory``."""

    model_config = _FIELDS

    target_directory_camel: str | None = Field(
        default=None, alias="targetDirectory", min_length=1, description="Where the savepoint goes."
    )
    target_directory_hyphen: str | None = Field(
        default=None, alias="target-directory", min_length=1, description="Same as targetDirectory."
    )

    @model_validator(mode="after")
    def _one_directory(self) -> StopWithSavepointRequest:
        camel, hyphen = self.target_directory_camel, self.target_directory_hyphen
        if camel is not None and hyphen is not None and camel != hyphen:
            raise ValueError("targetDirectory and target-directory differ; give one of them")
        return self

    @property
    def target_directory(self) -> str | None:
        return self.target_directory_camel or self.target_directory_hyphen


def _exactly_one_of(*names: str, types: dict[str, str]) -> dict[str, Any]:
    """JSON Schema: exactly one of ``names`` is given and not null."""
    return {
        "oneOf": [
            {"required": [name], "properties": {name: {"type": types[name]}}} for name in names
        ]
    }


def _any_of(*names: str) -> dict[str, Any]:
    """JSON Schema: at least one of ``names`` (integers) is given and not null."""
    return {
        "anyOf": [{"required": [name], "properties": {name: {"type": "integer"}}} for name in names]
    }


class RestoreRequest(BaseModel):
    """``POST /jobs/{id}/restore``: exactly one of ``checkpoint_id`` and ``savepoint_path``."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra=_exactly_one_of(
            "checkpoint_id",
            "savepoint_path",
            types={"checkpoint_id": "integer", "savepoint_path": "string"},
        ),
    )

    checkpoint_id: int | None = Field(
        default=None,
        ge=1,
        le=MAX_INT,
        strict=True,
        description="A retained checkpoint of this job.",
    )
    savepoint_path: str | None = Field(
        default=None, min_length=1, description="A savepoint's directory (or its _metadata)."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> RestoreRequest:
        if (self.checkpoint_id is None) == (self.savepoint_path is None):
            raise ValueError("give exactly one of checkpoint_id and savepoint_path")
        return self


def _fixed_at_start(value: Any) -> Any:
    if value is not None:
        raise ValueError("can change only when the job (re)starts")
    return value


class CheckpointConfigPatch(BaseModel):
    """``PATCH /jobs/{id}/checkpoints/config``: the settings that change on a running job.

    They apply from the next trigger. ``mode`` and ``max_concurrent`` are refused: they are
    fixed when the job (re)starts.
    """

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, json_schema_extra=_any_of(*CHANGEABLE)
    )

    interval: int | None = Field(
        default=None,
        ge=0,
        le=MAX_DURATION_MS,
        strict=True,
        description="ms between checkpoints; 0: periodic off",
    )
    timeout: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DURATION_MS,
        strict=True,
        description="ms before a pending checkpoint expires",
    )
    min_pause: int | None = Field(
        default=None,
        ge=0,
        le=MAX_DURATION_MS,
        strict=True,
        description="ms between a checkpoint and the next",
    )
    tolerable_failed_checkpoints: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INT,
        strict=True,
        description="consecutive failures before failover",
    )
    retained: int | None = Field(
        default=None, ge=1, le=MAX_INT, strict=True, description="completed checkpoints kept"
    )
    mode: SkipJsonSchema[Any] = None
    max_concurrent: SkipJsonSchema[Any] = None

    _fixed = field_validator("mode", "max_concurrent")(_fixed_at_start)

    @model_validator(mode="after")
    def _not_empty(self) -> CheckpointConfigPatch:
        if not self.changes():
            raise ValueError(f"nothing to change; give any of {', '.join(CHANGEABLE)}")
        return self

    def changes(self) -> dict[str, int]:
        """The given fields under the coordination service's keys (``interval_ms``...)."""
        given = {name: getattr(self, name) for name in CHANGEABLE}
        return {CONFIG_KEYS[name]: value for name, value in given.items() if value is not None}
