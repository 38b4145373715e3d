"""Counts consecutive checkpoint failures and decides when the job must fail over (Flink's rules).

Follows Flink's ``CheckpointFailureManager``:

- only some reasons count (expired, declined, I/O and asynchronous-phase failures); the
  coordinator's own refusals and aborts (too many requests, minimum pause, subsumed, shutdown,
  failover, task failure, finalization) do not;
- each checkpoint counts at most once, and only when it is newer than the last completed one;
- a savepoint failure seen by the coordinator (expiry, abort) does not count: a failover would
  not help a manual action. A savepoint declined by a task counts, as Flink does for a task-side
  failure of a savepoint;
- a completed checkpoint newer than the last one resets the count;
- when the count exceeds the tolerable number, the count is cleared and the job must fail over.
"""

from __future__ import annotations

from sparkpoint.checkpointing.pending import CheckpointFailureReason, FailedCheckpoint
from sparkpoint.errors import ConfigurationError

#: Flink's message when the threshold is exceeded.
EXCEEDED_CHECKPOINT_TOLERABLE_FAILURE_MESSAGE = "Exceeded checkpoint tolerable failure threshold."

#: The failure reasons that count against the tolerable number (Flink's ``checkFailureCounter``).
COUNTED_REASONS = frozenset(
    {
        CheckpointFailureReason.IO_EXCEPTION,
        CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
        CheckpointFailureReason.CHECKPOINT_DECLINED,
        CheckpointFailureReason.CHECKPOINT_EXPIRED,
    }
)


def counts_against_tolerance(failed: FailedCheckpoint) -> bool:
    """Whether this failure's reason and kind make it count (ignoring ids and history)."""
    if failed.is_savepoint and failed.declined_by is None:
        return False
    return failed.reason in COUNTED_REASONS


class CheckpointFailureManager:
    """Tracks consecutive counted checkpoint failures against a tolerable number."""

    def __init__(self, tolerable_failures: int) -> None:
        """Create a manager with no failures counted.

        Args:
            tolerable_failures: how many consecutive counted failures are tolerated (>= 0);
                one more fails the job over.

        Raises:
            ConfigurationError: when ``tolerable_failures`` is negative.
        """
        _check_tolerable(tolerable_failures)
        self._tolerable = tolerable_failures
        self._counted_ids: set[int] = set()
        self._last_succeeded_id: int | None = None

    @property
    def tolerable_failures(self) -> int:
        return self._tolerable

    @property
    def continuous_failures(self) -> int:
        """How many consecutive counted failures there are now."""
        return len(self._counted_ids)

    @property
    def last_succeeded_id(self) -> int | None:
        return self._last_succeeded_id

    def set_tolerable(self, tolerable_failures: int) -> None:
        """Change the tolerable number; it applies from the next failure.

        Raises:
            ConfigurationError: when ``tolerable_failures`` is negative.
        """
        _check_tolerable(tolerable_failures)
        self._tolerable = tolerable_failures

    def handle_failure(self, failed: FailedCheckpoint) -> bool:
        """Account for one failed checkpoint.

        Args:
            failed: the failed checkpoint, with its reason.

        Returns:
            True when the count now exceeds the tolerable number: the job must fail over
            ("Exceeded checkpoint tolerable failure threshold."). The count is then cleared.
        """
        if self._last_succeeded_id is not None and failed.checkpoint_id <= self._last_succeeded_id:
            return False
        if not counts_against_tolerance(failed):
            return False
        self._counted_ids.add(failed.checkpoint_id)
        if len(self._counted_ids) > self._tolerable:
            self._counted_ids.clear()
            return True
        return False

    def exceeded_cause(self, job_id: str, failed: FailedCheckpoint) -> str:
        """The failover's cause when ``failed`` exceeded the tolerable number."""
        return (
            f"{EXCEEDED_CHECKPOINT_TOLERABLE_FAILURE_MESSAGE} Job {job_id}, tolerable failures "
            f"{self._tolerable}; last: {failed.message} ({failed.reason.value})"
        )

    def handle_success(self, checkpoint_id: int) -> None:
        """Account for a completed checkpoint; a newer one than the last resets the count."""
        if self._last_succeeded_id is None or checkpoint_id > self._last_succeeded_id:
            self._last_succeeded_id = checkpoint_id
            self._counted_ids.clear()


def _check_tolerable(tolerable_failures: int) -> None:
    if (
        isinstance(tolerable_failures, bool)
        or not isinstance(tolerable_failures, int)
        or tolerable_failures < 0
    ):
        raise ConfigurationError(
            f"tolerable_failures must be an integer >= 0, got {tolerable_failures!r}"
        )
