"""Checkpoint configuration with Flink's defaults; the fields that may change while a job runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sparkpoint.errors import ConfigurationError
from sparkpoint.limits import CHECKPOINT_SETTING_BOUNDS
from sparkpoint.protocol import CheckpointingMode

#: Fields that apply from the next trigger when changed on a running job.
RUNTIME_MUTABLE = frozenset(
    {"interval_ms", "timeout_ms", "tolerable_failures", "min_pause_ms", "retained"}
)

#: Upper bounds (``sparkpoint.limits``): durations at most a year, counts a Java ``int``.
_AT_MOST = CHECKPOINT_SETTING_BOUNDS


@dataclass(frozen=True)
class CheckpointConfig:
    """How a job checkpoints (Flink's ``execution.checkpointing.*`` options)."""

    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE
    interval_ms: int = 0  # 0: periodic checkpoints off
    timeout_ms: int = 600_000  # Flink: 10 min
    min_pause_ms: int = 0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    retained: int = 1

    def __post_init__(self) -> None:
        for name in _AT_MOST:  # NaN or a string would pass or break the comparisons below
            if type(getattr(self, name)) is not int:
                raise ConfigurationError(f"{name} must be an integer, got {getattr(self, name)!r}")
        for name in ("interval_ms", "min_pause_ms", "tolerable_failures"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("timeout_ms", "max_concurrent", "retained"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name, most in _AT_MOST.items():
            if getattr(self, name) > most:
                raise ConfigurationError(
                    f"{name} must be at most {most}, got {getattr(self, name)}"
                )

    def with_changes(self, changes: dict[str, Any], *, running: bool = True) -> CheckpointConfig:
        """A copy with ``changes`` applied: while the job runs, runtime-mutable fields only."""
        fixed = set(changes) - RUNTIME_MUTABLE
        if fixed and running:
            raise ConfigurationError(
                f"{', '.join(sorted(fixed))} cannot change while the job runs "
                "(only at its next start)"
            )
        return dataclasses.replace(self, **changes)
