"""The log of a background step that fails again at every try (the timers' tick, 20 times a
second, while the database is away): its first failure, then one line a minute, then its end,
instead of a line or a traceback at every try."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable


class FailureStreak:
    """Count the failures in a row of one step and log them sparingly on ``log``.

    Args:
        what: The step, as the lines name it ("timer tick").
        log: The logger of the module that runs the step.
        traceback: Whether the first failure is logged with its traceback (an unexpected
            one), or as one line (a dependency away, expected).
        every_s: How often a streak that goes on is told again.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        *,
        traceback: bool = True,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.log, self.traceback = what, log, traceback
        self.every_s, self.clock = every_s, clock
        self.count = 0
        self._told_at = 0.0

    def failed(self) -> None:
        """Call in the ``except`` block of a failure."""
        self.count += 1
        now = self.clock()
        if self.count == 1 and self.traceback:
            self.log.exception("%s failed (retried; one line a minute while it fails)", self.what)
        elif self.count == 1:
            self.log.warning(
                "%s failed (retried; one line a minute while it fails): %s",
                self.what,
                _last_error(),
            )
        elif now - self._told_at >= self.every_s:
            self.log.warning(
                "%s failed %d times in a row: %s", self.what, self.count, _last_error()
            )
        else:
            return
        self._told_at = now

    def ended(self) -> None:
        """Call after a success."""
        if self.count:
            self.log.info("%s runs again after %d failure(s)", self.what, self.count)
            self.count = 0


def _last_error() -> str:
    err = sys.exc_info()[1]
    return str(err).splitlines()[0] if err is not None and str(err) else repr(err)
