"""A connected job that stops hearing from its control plane says so.

The control plane triggers every checkpoint of a connected job and completes it, and the job's
sinks commit only then. While the control plane is away (killed, restarting, or reading
another Redis), the job reads and processes on, but nothing is committed, and its console
said nothing. :class:`Silence` says once when no command came for :data:`INTERVALS`
checkpoint intervals (and at least :data:`AT_LEAST_MS`), and again when commands come back.
A checkpoint that waits for its completion is no reason to wait longer: every subtask of a
connected job runs in its driver, so once its acknowledgements are sent, the completion
depends on the control plane alone. A job without periodic checkpoints expects no command
and says nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkpoint import protocol as p

if TYPE_CHECKING:
    from sparkpoint.runtime.execution import JobExecution

#: Checkpoint intervals without a command before a job says so.
INTERVALS = 10
#: ... and at least this long, whatever the interval.
AT_LEAST_MS = 30_000
#: The settings a ``configuration_changed`` command may change that the wait depends on.
_SETTINGS = ("interval_ms", "min_pause_ms")


class Silence:
    """When the job last heard a command, and whether it said that it hears none."""

    def __init__(self, job: JobExecution) -> None:
        self.job = job
        config = job.options.checkpoint
        self.settings = {name: int(getattr(config, name)) for name in _SETTINGS}
        self.last_ms = job.clock.monotonic_ms()
        self.said = False

    def heard(self, command: object) -> None:
        """A command came (any, of this attempt or not: the control plane is there)."""
        if isinstance(command, p.ConfigurationChanged):
            for name in _SETTINGS:
                value = command.changes.get(name)
                if isinstance(value, int) and not isinstance(value, bool):
                    self.settings[name] = value
        now = self.job.clock.monotonic_ms()
        if self.said and self.job.console is not None:
            self.job.console.line(
                "control_plane_back",
                f"the control plane's commands come again, after {(now - self.last_ms) / 1000:.0f}"
                " s without one",
                level="warning",
            )
        self.said = False
        self.last_ms = now

    def reset(self) -> None:
        """Count the silence from now (the job starts running; a pause ends)."""
        self.last_ms = self.job.clock.monotonic_ms()

    def quiet_ms(self) -> int | None:
        """How long without a command is too long (None: no command is expected)."""
        interval = self.settings["interval_ms"]
        if interval <= 0:
            return None
        return max(INTERVALS * (interval + self.settings["min_pause_ms"]), AT_LEAST_MS)

    def check(self, paused: bool = False) -> None:
        """Say so, once, when the job has heard no command for too long. ``paused``: the job
        waits for the control plane's decision after a failure, which comes after the
        restart strategy's delay (minutes, maybe): the wait counts from its end."""
        if paused:
            self.reset()
            return
        quiet = self.quiet_ms()
        if self.said or quiet is None or self.job.console is None:
            return
        silent = self.job.clock.monotonic_ms() - self.last_ms
        if silent < quiet:
            return
        self.said = True
        every = self.settings["interval_ms"] / 1000
        self.job.console.line(
            "control_plane_silent",
            f"no command from the control plane for {silent / 1000:.0f} s (checkpoints every "
            f"{every:g} s): the job runs on, but its sinks commit nothing until checkpoints "
            "complete again; is `sparkpoint server` running on this Redis?",
            level="warning",
            silent_ms=round(silent),
        )
