"""The vocabulary of the wire protocol: Flink's status names, bounded field types, the base model.

:mod:`sparkpoint.protocol` builds its events and commands from these and re-exports the status
enums and the state handle models, so that ``protocol.JobStatus`` and
``protocol_types.JobStatus`` are one class.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sparkpoint.limits import (
    CHECKPOINT_SETTING_BOUNDS,
    MAX_INT,
    MAX_JOB_ID_LENGTH,
    MAX_LONG,
    MAX_NAME_LENGTH,
    MAX_PARALLELISM,
    MIN_INT,
    MIN_LONG,
    cut_text,
)


class JobStatus(str, enum.Enum):
    """Flink's job statuses, with the same names in every part of the product."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    RESTARTING = "RESTARTING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"


class CheckpointStatus(str, enum.Enum):
    """Flink's checkpoint statuses."""

    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


class CheckpointKind(str, enum.Enum):
    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class CheckpointingMode(str, enum.Enum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"


class ProtocolModel(BaseModel):
    """The base of every event and command: unknown fields ignored, frozen, finite numbers."""

    # No NaN or infinity: the database and the REST API's JSON cannot hold them.
    model_config = ConfigDict(
        extra="ignore", frozen=True, use_enum_values=False, allow_inf_nan=False
    )


# The bounds of the numbers in messages (see ``sparkpoint.limits``).
CheckpointId = Annotated[int, Field(ge=1, le=MAX_INT)]
Epoch = Annotated[int, Field(ge=MIN_INT, le=MAX_INT)]
Long = Annotated[int, Field(ge=MIN_LONG, le=MAX_LONG)]  # timestamps, positions
Size = Annotated[int, Field(ge=0, le=MAX_LONG)]  # bytes, records, offsets, lag
Index = Annotated[int, Field(ge=0, lt=MAX_PARALLELISM)]  # subtasks, channels, key groups
Parallelism = Annotated[int, Field(ge=1, le=MAX_PARALLELISM)]
Text = Annotated[str, AfterValidator(cut_text)]  # causes and reasons, cut when very long
Name = Annotated[str, Field(max_length=MAX_NAME_LENGTH)]  # job names, operator uids, Spark ids
Nonce = Annotated[str, Field(max_length=MAX_JOB_ID_LENGTH)]  # a driver process's incarnation


# The keys of a registration's ``config`` that the control plane reads, and their types (None
# is always allowed: the default); other keys are kept as they are.
_CONFIG_TYPES: dict[str, type] = {
    **dict.fromkeys(
        ("mode", "checkpoint_storage", "checkpoint_dir", "from_checkpoint", "state_backend"), str
    ),
    **dict.fromkeys(
        (
            "interval_ms",
            "timeout_ms",
            "min_pause_ms",
            "max_concurrent",
            "tolerable_failures",
            "retained",
            "max_parallelism",
            "max_inline_state_bytes",
        ),
        int,
    ),
    "restart_strategy": dict,  # Flink's keys -> str, int or float
}


def check_registration_config(config: dict[str, Any]) -> dict[str, Any]:
    """A registration's configuration whose known keys have the types they are read as (their
    values are checked by the control plane, which refuses a job it cannot run and says why),
    and whose other integers, anywhere in it, fit a ``BIGINT`` (the database stores it as
    JSON): the checkpoint settings the control plane bounds itself keep its refusal, which
    tells the job why, and everything else is refused here."""
    for key, value in config.items():
        if key not in CHECKPOINT_SETTING_BOUNDS:  # refused by the control plane, with a reason
            _check_integers(value, f"config.{key}")
    for key, expected in _CONFIG_TYPES.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ValueError(f"{key} is a {type(value).__name__}, not a {expected.__name__}")
        if isinstance(value, dict):  # restart_strategy
            for option, setting in value.items():
                if not isinstance(setting, (str, int, float)):
                    raise ValueError(f"restart_strategy option {option!r} is not a scalar")
    return config


def _check_integers(value: Any, where: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not MIN_LONG <= value <= MAX_LONG:
        raise ValueError(f"{where} is an integer outside 64 bits")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_integers(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_integers(item, f"{where}[{i}]")


# ----------------------------------------------------------------------------- state handles


class SharedFileModel(ProtocolModel):
    """A file in the job's ``shared/`` directory that a checkpoint references (incremental
    state: uploaded once, referenced by every later checkpoint that still needs it)."""

    path: str
    size: Size
    checksum: str  # "sha256:<hex>"


class StateDescriptorModel(ProtocolModel):
    """A keyed state a snapshot holds: its name, kind and the serializer of its values (what a
    restore needs to read it, recorded in ``_metadata`` beside the handle)."""

    name: Name
    kind: Name  # "value", "list" or "map"
    serializer: Name  # a name in sparkpoint.state.serializers, e.g. "pickle"


class StateHandleModel(ProtocolModel):
    """Where a piece of snapshot state lives: a path (or inline bytes), its size and checksum.

    ``format`` None is the legacy (pre-``format``) key-group snapshot; ``"hashmap-columns-v1"``
    a ``hashmap`` checkpoint (one file of the tables' columns). A native snapshot
    (``"rocksdb-native-v1"``) has as ``path`` a small JSON manifest listing its files, and in
    ``shared`` every file of the job's ``shared/`` directory it references, new or reused:
    what keeps those files alive (:meth:`~sparkpoint.checkpointing.storage_base.
    CheckpointStorage.discard`).
    """

    path: str | None = None
    inline: str | None = None  # base64, for jobmanager (inline) checkpoint storage
    size: Size
    checksum: str  # "sha256:<hex>"
    key_group_start: Index | None = None
    key_group_end: Index | None = None  # inclusive
    # "sparkpoint-keyed-state-v1", "hashmap-columns-v1", "rocksdb-native-v1"; None: legacy
    format: str | None = None
    shared: list[SharedFileModel] = []
    states: list[StateDescriptorModel] = []  # the keyed states in this snapshot
    # Keyed state: the operator's max parallelism (its number of key groups) when it was taken;
    # a restore with another is refused before it starts. None: not keyed state, or a snapshot
    # written before it was recorded.
    max_parallelism: Parallelism | None = None

    @property
    def is_native(self) -> bool:
        """Whether this is RocksDB's own format (a set of files), not one file of bytes."""
        return (self.format or "").startswith("rocksdb")


#: At most this many executors in one ``heartbeat`` (the active first, then the latest lost).
MAX_EXECUTORS = 64


class ExecutorModel(ProtocolModel):
    """One Spark executor of the job's application and its host (Spark's ``ExecutorSummary``);
    a removed one keeps Spark's reason (``worker lost: ...``)."""

    executor_id: Name
    host: Name
    cores: int = Field(ge=0, le=1 << 16)
    active: bool
    remove_reason: Text | None = None


class OperatorStateModel(ProtocolModel):
    """One list state (or broadcast state: its entries) of a checkpointed function in one
    subtask (``sparkpoint.operator_state``), kept in the checkpoint's metadata: its values
    pickled, then base64 (at most 64 KiB pickled per subtask, checked by the task; the message
    limit bounds it here)."""

    function: Name  # the uid of the operator whose function holds it
    name: Name
    mode: Literal["split", "union", "broadcast"]
    subtask: Index
    parallelism: Parallelism
    values: Size  # how many
    data: str


class SinkTransactionModel(ProtocolModel):
    transaction_id: str
    parts: list[str]
    records: Size = 0
    bytes: Size = 0
    sink: str | None = None  # the sink's uid; None: the only sink of the acknowledging vertex
    # Where the sink pre-committed it (a file sink's directory or URL): a job restored from
    # another job's checkpoint commits it there. None: the sink does not say, or a checkpoint
    # from before sinks named it; committed where the restoring job's sink writes.
    location: str | None = None
