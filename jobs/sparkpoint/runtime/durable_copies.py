"""What the driver tells of durable copies of working state that the storage refused.

With durable working state (on a cluster), each subtask writes its epoch's version to the
checkpoint storage too; a copy that fails leaves the version on its executor only
(:func:`~sparkpoint.runtime.working_state.write_durable`), and a subtask that lands on another
executor then recovers from the latest checkpoint. The executor logs why the storage refused
it; the driver sees which subtasks' reports carry no durable copy, and says so on the job's
console: when it starts, once a minute while it goes on, and when copies are written again.
"""

from __future__ import annotations

from collections.abc import Mapping

from sparkpoint.clock import Clock
from sparkpoint.console import Console
from sparkpoint.runtime.plan import TaskReport

#: While copies fail, the console says so again at most this often.
TOLD_EVERY_MS = 60_000
#: Subtasks named in one line (then "and N more").
NAMED = 6


class DurableCopiesWatch:
    """Counts the epochs in a row in which some subtask's durable copy failed."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.epochs = 0  # epochs in a row with a failed copy
        self._told_ms: float | None = None

    def accepted(
        self, epoch: int, reports: Mapping[tuple[str, int], TaskReport], console: Console | None
    ) -> None:
        """After an accepted epoch of a job that keeps durable working state."""
        lacking = sorted(
            f"{uid}[{subtask}]"
            for (uid, subtask), report in reports.items()
            if report.state_version is not None and report.state_durable_path is None
        )
        if not lacking:
            if self.epochs and console is not None:
                console.line(
                    "durable_working_state",
                    f"durable copies of working state are written again, after {self.epochs} "
                    "epoch(s) without",
                    always=True,
                )
            self.epochs, self._told_ms = 0, None
            return
        self.epochs += 1
        now = self.clock.monotonic_ms()
        if self._told_ms is not None and now - self._told_ms < TOLD_EVERY_MS:
            return
        self._told_ms = now
        if console is None:
            return
        named = ", ".join(lacking[:NAMED]) + (
            f" and {len(lacking) - NAMED} more" if len(lacking) > NAMED else ""
        )
        console.line(
            "durable_working_state",
            f"epoch {epoch}: the checkpoint storage took no durable copy of the working state of "
            f"{named} ({self.epochs} epoch(s) in a row; the executors' log says why): a subtask "
            "that moves to another executor now recovers from the latest checkpoint",
            level="warning",
        )
