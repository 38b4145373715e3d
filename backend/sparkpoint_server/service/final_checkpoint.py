"""The final checkpoint of a job whose input ended (its ``EndOfInput``).

The first is triggered at once. One that failed (a storage away, a decline) is asked for
again by the job; the next then waits as a periodic checkpoint would
(:meth:`~sparkpoint.checkpointing.coordinator.CheckpointCoordinator.final_wait_ms`), and the
timers' tick triggers it once that wait is over. Periodic checkpoints stay off meanwhile, as
Flink's are while a job ends; a manual checkpoint or savepoint still goes (and may complete:
a control plane that restarts finds the failed final checkpoint by attempt, not as a failure
since the last completion).
"""

from __future__ import annotations

from sparkpoint import protocol as p
from sparkpoint_server.coordination.job import JobRuntime
from sparkpoint_server.service import decisions as d
from sparkpoint_server.service.batch import Batch


def end_of_input(batch: Batch, rt: JobRuntime) -> None:
    """The job's input ended: send a pending final checkpoint's trigger again, or trigger
    one now, or once the wait after a failed one is over."""
    for pending in rt.coordinator.pending.values():
        if pending.is_final:
            d.resend_trigger(batch, rt, pending)
            return
    rt.final_requested = rt.final_waiting = True
    trigger_if_due(batch, rt)


def due(rt: JobRuntime) -> bool:
    """Whether a final checkpoint waits to be triggered and its wait is over (not while the
    job stops with a savepoint: that one ends it)."""
    return (
        rt.final_waiting
        and rt.status is p.JobStatus.RUNNING
        and rt.stop_checkpoint is None
        and rt.coordinator.final_wait_ms() <= 0
    )


def trigger_if_due(batch: Batch, rt: JobRuntime) -> bool:
    """Trigger the final checkpoint the job waits for, if :func:`due`; whether it did."""
    if not due(rt):
        return False
    d.trigger(batch, rt, is_final=True)  # a final checkpoint is never refused
    rt.final_waiting = False
    return True
