"""When a periodic checkpoint is due: the interval since the last regular trigger, and the
minimum pause since the last checkpoint finished (Flink's ``CheckpointRequestDecider`` and
``minPauseBetweenCheckpoints``), on the monotonic clock; recorded wall-clock times of a host
that restarted map back onto it. Also when a final checkpoint that failed is tried again, and
why a checkpoint may not trigger now."""

from __future__ import annotations

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.pending import (
    CheckpointFailureReason,
    CheckpointTriggerError,
    FailedCheckpoint,
)
from sparkpoint.clock import Clock

#: How long a failed final checkpoint waits before the next when periodic checkpoints are off.
FINAL_RETRY_WITHOUT_INTERVAL_MS = 1000


class TriggerTiming:
    """The monotonic times that periodic triggering counts from."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.periodic_base = clock.monotonic_ms()  # the last regular trigger, start or failover
        self._last_finished: float | None = None  # the last completion or failure
        # This attempt's last failed final checkpoint: when it was triggered and when it failed.
        self._final_failed: tuple[float, float] | None = None

    def restart(self) -> None:
        """The next periodic checkpoint is one interval from now; a new attempt's first final
        checkpoint goes at once."""
        self.periodic_base = self._clock.monotonic_ms()
        self._final_failed = None

    def periodic_due(self, config: CheckpointConfig, pending: int) -> bool:
        """Whether the interval has passed since the last regular trigger (or start, or
        failover), the minimum pause since the last completion or failure is over, and fewer
        than ``max_concurrent`` checkpoints are ``pending``."""
        now = self._clock.monotonic_ms()
        return (
            config.interval_ms > 0
            and now - self.periodic_base >= config.interval_ms
            and pending < config.max_concurrent
            and self.pause_left(config.min_pause_ms, now) <= 0
        )

    def finished(self, now: float | None = None) -> None:
        """A checkpoint completed or failed: the minimum pause counts from ``now``."""
        self._last_finished = self._clock.monotonic_ms() if now is None else now

    def failed(self, final_trigger: float | None = None) -> None:
        """A checkpoint failed now; ``final_trigger``: a final one, triggered at that time."""
        now = self._clock.monotonic_ms()
        self.finished(now)
        if final_trigger is not None:
            self._final_failed = (final_trigger, now)

    def final_wait(self, config: CheckpointConfig) -> float:
        """Milliseconds before a final checkpoint may be triggered (<= 0: now).

        The first of an attempt goes at once. After one failed, the next waits as a periodic
        checkpoint would: the interval (:data:`FINAL_RETRY_WITHOUT_INTERVAL_MS` with periodic
        checkpoints off) since the failed one's trigger and the minimum pause since it failed.
        Flink triggers the checkpoints of a job whose sources finished on its periodic
        schedule too. Tried again at once, the tolerable failures of a storage away for a few
        seconds would pass in as many empty epochs, and the job would fail over.
        """
        if self._final_failed is None:
            return 0.0
        triggered, failed = self._final_failed
        now = self._clock.monotonic_ms()
        interval = config.interval_ms or FINAL_RETRY_WITHOUT_INTERVAL_MS
        return max(interval - (now - triggered), config.min_pause_ms - (now - failed))

    def check_trigger(
        self, job_id: str, config: CheckpointConfig, pending: list[int], periodic: bool, now: float
    ) -> None:
        """Refuse a regular checkpoint while ``max_concurrent`` checkpoints are ``pending``
        (savepoints included, as in Flink), and a periodic one also while the minimum pause is
        not over.

        Raises:
            CheckpointTriggerError: with reason ``TOO_MANY_CHECKPOINT_REQUESTS`` or
                ``MINIMUM_TIME_BETWEEN_CHECKPOINTS``.
        """
        if len(pending) >= config.max_concurrent:
            raise CheckpointTriggerError(
                job_id,
                CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS,
                f"{len(pending)} checkpoint(s) pending ({', '.join(map(str, pending))}), "
                f"max concurrent is {config.max_concurrent}",
            )
        left = self.pause_left(config.min_pause_ms, now)
        if periodic and left > 0:
            raise CheckpointTriggerError(
                job_id,
                CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS,
                f"minimum pause of {config.min_pause_ms} ms between checkpoints not over "
                f"({left:g} ms left)",
            )

    def pause_left(self, min_pause_ms: float, now: float) -> float:
        """Milliseconds of the minimum pause still to wait (<= 0: over)."""
        if self._last_finished is None:
            return 0.0
        return min_pause_ms - (now - self._last_finished)

    def recover(
        self,
        last_trigger: int | None,
        last_finished: int | None,
        failed_final: FailedCheckpoint | None = None,
    ) -> None:
        """Continue from recorded wall-clock times (None: not recorded); ``failed_final``: the
        current attempt's last final checkpoint, which failed (the next waits as
        :meth:`final_wait` says)."""
        if failed_final is not None:
            self._final_failed = (
                self.monotonic_of(failed_final.trigger_timestamp),
                self.monotonic_of(failed_final.failure_timestamp),
            )
        if last_trigger is not None:
            self.periodic_base = self.monotonic_of(last_trigger)
        if last_finished is not None:
            self._last_finished = self.monotonic_of(last_finished)

    def monotonic_of(self, timestamp: int) -> float:
        """The monotonic time of a recorded wall-clock timestamp (for recovered deadlines)."""
        return self._clock.monotonic_ms() - max(0, self._clock.now_ms() - timestamp)
