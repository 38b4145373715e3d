"""What a job says of its progress and its liveness: the per-epoch :class:`Heartbeat` (metrics,
executors, a restore's cost) and the driver's timed :class:`DriverHeartbeat`.

Part of the wire protocol: :mod:`sparkpoint.protocol` registers both as event payloads and
re-exports them (``protocol.Heartbeat``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sparkpoint.limits import MAX_DURATION_MS, MAX_PARALLELISM
from sparkpoint.protocol_types import (
    MAX_EXECUTORS,
    Epoch,
    ExecutorModel,
    Long,
    Name,
    Nonce,
    ProtocolModel,
    Size,
)


class Heartbeat(ProtocolModel):
    type: Literal["heartbeat"] = "heartbeat"
    epoch: Epoch
    records: Size
    duration_ms: float = Field(ge=0)
    records_per_second: float = Field(ge=0)
    # Records the sources hold and the job has not read yet, counted over the splits whose
    # source answered: those in ``unanswered_splits`` (their system did not answer when asked,
    # Source.available) are not in it, so the lag is unknown while that list is not empty.
    source_lag: Size
    host_time: Long
    # None: a driver that does not report them (its lag counts every split).
    unanswered_splits: list[Name] | None = Field(default=None, max_length=MAX_PARALLELISM)
    # The planner held the epoch within this many ms so that checkpoints complete within their
    # timeout (a job catching up would have read more); None: not held back.
    epoch_bound_ms: float | None = Field(default=None, ge=0, le=MAX_DURATION_MS)
    # The application's executors after the epoch; None: a driver that does not report them.
    executors: list[ExecutorModel] | None = Field(default=None, max_length=MAX_EXECUTORS)
    # An epoch that restored keyed state (else None): its longest restore, first records' time
    restore_duration_ms: float | None = Field(default=None, ge=0, le=MAX_DURATION_MS)
    first_record_after_restore: Long | None = None


class DriverHeartbeat(ProtocolModel):
    """The driver process is alive (Flink's ``heartbeat.interval``): sent on a timer, whatever
    the job is doing (starting Spark, a long epoch, waiting for a decision). Unlike
    :class:`Heartbeat` it carries no metrics and is not tied to an epoch; the control plane
    fails the job over when these stop for its heartbeat timeout. Keyed by the driver's
    ``incarnation``, not by the attempt: a driver still switching attempts is alive too."""

    type: Literal["driver_heartbeat"] = "driver_heartbeat"
    incarnation: Nonce
    host_time: Long
