"""The connected driver's liveness: heartbeats to the control plane on a timer of their own.

The control plane fails a connected job over when its driver stops sending heartbeats for its
heartbeat timeout (Flink's ``heartbeat.timeout``). The per-epoch ``heartbeat`` event carries
throughput and comes only after an epoch; :class:`DriverHeartbeats` sends the lightweight
``driver_heartbeat`` every interval (Flink's ``heartbeat.interval``) for as long as the driver
process lives. The registration also carries why the previous driver process ended when
``sparkpoint run`` restarted it (:func:`previous_failure`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from sparkpoint import protocol as p
from sparkpoint.clock import Clock
from sparkpoint.env_settings import positive_seconds
from sparkpoint.errors import SparkpointError
from sparkpoint.transport import RedisEventSink

if TYPE_CHECKING:
    from sparkpoint.runtime.driver_lease import DriverLease

#: Flink's ``heartbeat.interval``: how often the driver tells the control plane it is alive.
HEARTBEAT_INTERVAL_MS = 10_000
#: Overrides :data:`HEARTBEAT_INTERVAL_MS` (seconds); keep it well below the control plane's
#: ``SPARKPOINT_HEARTBEAT_TIMEOUT``.
HEARTBEAT_INTERVAL_ENV = "SPARKPOINT_HEARTBEAT_INTERVAL"
#: Set by ``sparkpoint run`` on a driver it restarted: why the previous process ended.
PREVIOUS_FAILURE_ENV = "SPARKPOINT_PREVIOUS_DRIVER_FAILURE"
PREVIOUS_FAILURE_MAX_CHARS = 1000

log = logging.getLogger(__name__)


def heartbeat_interval_ms(job_id: str, environ: Mapping[str, str]) -> int:
    """The driver's heartbeat interval: ``SPARKPOINT_HEARTBEAT_INTERVAL`` seconds, or 10 s.

    Raises:
        ConfigurationError: the variable is not a positive number of seconds.
    """
    seconds = positive_seconds(environ, HEARTBEAT_INTERVAL_ENV, f"job {job_id}: ")
    if seconds is None:
        return HEARTBEAT_INTERVAL_MS
    return max(1, round(seconds * 1000))


def previous_failure(environ: Mapping[str, str]) -> str | None:
    """The one-line cause ``sparkpoint run`` gave for the previous driver process, if any."""
    raw = " ".join(environ.get(PREVIOUS_FAILURE_ENV, "").split())
    return raw[:PREVIOUS_FAILURE_MAX_CHARS] or None


class DriverHeartbeats:
    """A daemon thread that sends ``driver_heartbeat`` every interval for as long as the
    driver process lives (Flink's ``heartbeat.interval``), whatever the job does meanwhile:
    Spark starting, a long epoch, a wait for the control plane's decision.

    A heartbeat that cannot be sent is dropped (the next one follows an interval later); the
    control plane fails the job over only after its heartbeat timeout without any.
    """

    def __init__(
        self,
        events: RedisEventSink,
        job_id: str,
        incarnation: str,
        interval_ms: int,
        *,
        lease: DriverLease | None = None,
    ) -> None:
        self.events = events
        self.lease = lease  # renewed with every heartbeat
        self.job_id = job_id
        self.incarnation = incarnation
        self.interval_ms = interval_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, attempt: Callable[[], int], clock: Clock) -> None:
        """Send one heartbeat now and one every interval until :meth:`stop`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run,
            args=(attempt, clock),
            name=f"sparkpoint-heartbeats-{self.job_id}",
            daemon=True,  # it must never keep a finished driver alive
        )
        self._thread.start()

    def beat(self, attempt: int, clock: Clock) -> bool:
        """Send one heartbeat; False when Redis did not take it."""
        payload = p.DriverHeartbeat(incarnation=self.incarnation, host_time=clock.now_ms())
        try:
            self.events.publish([p.envelope(self.job_id, attempt, clock.now_ms(), payload)])
        except SparkpointError as err:
            log.warning("job %s: heartbeat not sent: %s", self.job_id, err)
            return False
        return True

    def _run(self, attempt: Callable[[], int], clock: Clock) -> None:
        while True:
            if self.lease is not None:
                self.lease.renew()
                if self.lease.lost:  # another driver runs the job: its heartbeats count now
                    return
            self.beat(attempt(), clock)
            if self._stop.wait(self.interval_ms / 1000):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
