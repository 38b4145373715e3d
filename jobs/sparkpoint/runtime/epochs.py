"""What runs an epoch and who hears of it: the contract between an authority, the epoch
runner and :class:`~sparkpoint.runtime.execution.JobExecution`.

An :class:`EpochRunner` runs an epoch's plan (on Spark or in this process), an
:class:`EpochListener` (the authority) hears of the epoch's acknowledgements while it is
accepted, and an :class:`EpochOutcome` says how it ended. Which of a subtask's events its
acknowledgement stands for (:func:`unacknowledged`) is part of that contract: a listener that
reads them from the acknowledgements does not get them apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from sparkpoint import protocol as p
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.spark import SparkApplication


class EpochRunner(Protocol):
    """Runs one epoch's plan: on Spark (:class:`~sparkpoint.runtime.spark.SparkEpochRunner`)
    or in this process (:class:`~sparkpoint.runtime.local.LocalEpochRunner`)."""

    def warm_up(self) -> None:
        """Start what runs tasks before the first epoch (Spark's Python workers)."""

    def application(self) -> SparkApplication:
        """Where the epochs run, as the job's RUNNING status reports it."""

    def run(self, plan: EpochPlan) -> list[TaskReport]: ...


class EpochListener(Protocol):
    """The authority's hooks while an epoch is accepted, in the order they are called.

    A hook may raise :class:`~sparkpoint.runtime.spark.EpochFailedError` or
    :class:`~sparkpoint.errors.InjectedFailure`: the epoch then counts as failed.
    """

    #: Whether an acknowledgement stands for its subtask's barrier events (the control plane
    #: reads the barrier's time and the alignment from the acknowledgement): then the barrier,
    #: alignment and pre-commit events of a subtask that acknowledged in the same epoch are not
    #: published, which halves what a checkpoint sends to the control plane. A standalone job
    #: keeps every event (its events log, its console).
    acks_carry_barrier_events: bool

    def before_acks(self) -> None:
        """Positions and working state are accepted; the tasks' events come next."""

    def on_decline(self, attempt: int, decline: p.CheckpointDeclined) -> None:
        """A subtask declined a checkpoint (the decline is published already)."""

    def on_ack(self, attempt: int, ack: p.SnapshotCompleted) -> None:
        """A subtask acknowledged a checkpoint (the acknowledgement is published already)."""

    def after_acks(self) -> None:
        """Every acknowledgement of the epoch was handed over."""

    def after_epoch(self, epoch: int) -> None:
        """The heartbeat is out; the epoch is accepted unless this raises."""


#: The events of a subtask that its acknowledgement stands for (``acks_carry_barrier_events``).
CARRIED_BY_ACKS = (
    p.BarrierInjected,
    p.BarrierReceived,
    p.AlignmentCompleted,
    p.SinkPreCommitted,
)


def unacknowledged(events: Iterable[Any], acks: Iterable[p.SnapshotCompleted]) -> list[Any]:
    """``events`` without the barrier, alignment and pre-commit events of the subtasks that
    acknowledged their checkpoint in ``acks``: the acknowledgement carries the barrier's
    time, the alignment and the sink transactions. A subtask that declined, or failed before
    acknowledging, keeps its events (they say how far it got)."""
    acked = {(a.checkpoint_id, a.operator_id, a.subtask) for a in acks}
    return [
        ev
        for ev in events
        if not (
            isinstance(ev, CARRIED_BY_ACKS)
            and (ev.checkpoint_id, ev.operator_id, ev.subtask) in acked
        )
    ]


@dataclass(frozen=True)
class EpochOutcome:
    """How an epoch ended: accepted (``failure`` None) or failed with that cause."""

    epoch: int
    failure: str | None = None
    failed: tuple[str, int] | None = None  # the failed subtask, when the failure names it
    recoverable: bool = True  # False: no restart can fix the failure (a configuration error)
