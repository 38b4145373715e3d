"""When a periodic checkpoint is due: the interval since the last regular trigger, and the
minimum pause since the last checkpoint finished (Flink's ``CheckpointRequestDecider`` and
``minPauseBetweenCheckpoints``), on the monotonic clock; recorded wall-clock times of a host
that restarted map back onto it."""

from __future__ import annotations

from sparkpoint.clock import Clock


class TriggerTiming:
    """The monotonic times that periodic triggering counts from."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.periodic_base = clock.monotonic_ms()  # the last regular trigger, start or failover
        self._last_finished: float | None = None  # the last completion or failure

    def restart(self) -> None:
        """The next periodic checkpoint is one interval from now."""
        self.periodic_base = self._clock.monotonic_ms()

    def finished(self, now: float | None = None) -> None:
        """A checkpoint completed or failed: the minimum pause counts from ``now``."""
        self._last_finished = self._clock.monotonic_ms() if now is None else now

    def pause_left(self, min_pause_ms: float, now: float) -> float:
        """Milliseconds of the minimum pause still to wait (<= 0: over)."""
        if self._last_finished is None:
            return 0.0
        return min_pause_ms - (now - self._last_finished)

    def recover(self, last_trigger: int | None, last_finished: int | None) -> None:
        """Continue from recorded wall-clock times (None: not recorded)."""
        if last_trigger is not None:
            self.periodic_base = self.monotonic_of(last_trigger)
        if last_finished is not None:
            self._last_finished = self.monotonic_of(last_finished)

    def monotonic_of(self, timestamp: int) -> float:
        """The monotonic time of a recorded wall-clock timestamp (for recovered deadlines)."""
        return self._clock.monotonic_ms() - max(0, self._clock.now_ms() - timestamp)
