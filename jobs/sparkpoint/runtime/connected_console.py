"""What a connected driver tells its user: that it waits for its control plane, and the
checkpoint settings the control plane gave it."""

from __future__ import annotations

from typing import Any

from sparkpoint.runtime.execution import JobExecution

#: While a connected job waits for the control plane's first answer, it says so this often.
WAITING_EVERY_MS = 5_000


class Waiting:
    """Tells the user, at once and then every :data:`WAITING_EVERY_MS`, that the job waits
    for its control plane (and on which stream), until the first answer came."""

    def __init__(self, job: JobExecution, stream: str, timeout_ms: int) -> None:
        self.job, self.stream, self.timeout_ms = job, stream, timeout_ms
        self.started = job.clock.monotonic_ms()
        self.next_at = self.started

    def say(self) -> None:
        now = self.job.clock.monotonic_ms()
        if self.job.console is None or now < self.next_at:
            return
        self.next_at = now + WAITING_EVERY_MS
        waited = (now - self.started) / 1000
        hint = "" if waited < 1 else "; is `sparkpoint server` running on this Redis?"
        self.job.console.line(
            "waiting_for_control_plane",
            f"waiting for the control plane's answer on {self.stream} ({waited:.0f} s of "
            f"{self.timeout_ms / 1000:g} s{hint})",
            level="info" if waited < 1 else "warning",
        )


def settings_text(changes: dict[str, Any]) -> str:
    """``interval_ms=600000, retained=3`` as ``interval 600 s, retained 3``."""
    said = []
    for name, value in sorted(changes.items()):
        if name.endswith("_ms") and isinstance(value, (int, float)):
            said.append(f"{name[:-3].replace('_', ' ')} {value / 1000:g} s")
        else:
            said.append(f"{name.replace('_', ' ')} {value}")
    return ", ".join(said)
