"""Whether a job's driver is alive: Flink's ``HeartbeatMonitor`` for one driver process.

Pure: the service tells a :class:`DriverHeartbeatMonitor` when a heartbeat arrived (on its
monotonic clock) and asks whether the driver stayed silent past the heartbeat timeout. The
timeout counts from the later of the last heartbeat and the moment the monitor was created,
so a control plane that was itself down (or just started) gives every driver a full timeout
before it declares one lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

#: The statuses in which a silent driver matters: it registered (CREATED, until it reports
#: RUNNING), it runs, it was sent a restore and has not reported RUNNING yet (RESTARTING with
#: no restart pending: a restart that is still due is the control plane's own wait, not the
#: driver's silence), or it was told to cancel (CANCELLING, until it reports CANCELED).
WATCHED = frozenset({"CREATED", "RUNNING", "RESTARTING", "CANCELLING"})
#: The kind of the failure in the job's exception history.
HEARTBEAT_TIMEOUT = "HEARTBEAT_TIMEOUT"


def lost_driver_key(incarnation: str, attempt: int | None = None) -> str:
    """The exception-history key (after the job id) of a driver declared lost at ``attempt``
    (None: the prefix of every attempt's)."""
    prefix = f"heartbeat:{incarnation}:"
    return prefix if attempt is None else f"{prefix}{attempt}"


@dataclass
class DriverHeartbeatMonitor:
    """The heartbeats of one driver process (``incarnation``) of a job."""

    job_id: str
    incarnation: str
    since_monotonic_ms: float  # the timeout counts from here
    last_at: int | None  # wall-clock ms of the last heartbeat received; None: none known
    watching_since: int  # wall-clock ms at which this control plane started watching

    def received(self, at: int, monotonic_ms: float) -> None:
        """A heartbeat (or any sign of life) of this driver arrived."""
        self.last_at = at
        self.since_monotonic_ms = max(self.since_monotonic_ms, monotonic_ms)

    def overdue(self, now_monotonic_ms: float, timeout_ms: int, counting_from: float = 0.0) -> bool:
        """Whether ``timeout_ms`` passed since the last heartbeat and ``counting_from``."""
        return now_monotonic_ms - max(self.since_monotonic_ms, counting_from) >= timeout_ms

    def cause(self, timeout_ms: int) -> str:
        """Why the driver is declared lost, naming the last heartbeat."""
        if self.last_at is not None and self.last_at >= self.watching_since:
            last = f"the last one arrived at {_iso(self.last_at)}"
        elif self.last_at is not None:
            last = (
                f"the last one arrived at {_iso(self.last_at)}, none since the control plane "
                f"started at {_iso(self.watching_since)}"
            )
        else:
            last = f"none arrived since the control plane started at {_iso(self.watching_since)}"
        return (
            f"job {self.job_id}: no heartbeat from the driver (incarnation "
            f"{self.incarnation[:12]}) for {timeout_ms / 1000:g} s ({last}); "
            "its process is gone or hangs"
        )


def _iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
