"""The log of a step that fails again at every try (the server's timer tick, 20 times a second,
while the database is away; an executor's durable copies of working state while the storage is
full): its first failure, then one line every so often, then its end, instead of a line or a
traceback at every try."""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable


class FailureStreak:
    """Count the failures in a row of one step and log them sparingly on ``log``.

    A step that flaps (fails, works once, fails again: a full storage that takes a small file
    now and then) is told at most once in ``every_s`` too: a streak that starts within that
    time of the last line is counted but not told, and neither is its end.

    Safe to share between threads (an executor's Python worker may run tasks in several): one
    lock keeps the count and the time of the last line consistent, so a streak is told once
    however many threads fail at the same moment.

    Args:
        what: The step, as the lines name it ("timer tick").
        log: The logger of the module that runs the step.
        traceback: Whether the first failure is logged with its traceback (an unexpected
            one), or as one line (a dependency away, expected).
        expected: Errors told in one line even where others get their traceback (the
            database away, under a step whose other errors are bugs).
        every_s: How often a streak that goes on is told again.
        then: What follows a failure, when not a retry ("the version is kept on this
            executor only"); said in every warning line, since it is what the reader acts on.
        again: How the end of a streak is told ("runs again", "are written again").
        error_type: Whether the lines name the error's type before its message ("OSError:
            [Errno 28] ..."), where the message alone does not say what failed.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        *,
        traceback: bool = True,
        every_s: float = 60.0,
        then: str | None = None,
        again: str = "runs again",
        error_type: bool = False,
        expected: tuple[type[BaseException], ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.log, self.traceback, self.expected = what, log, traceback, expected
        self.every_s, self.then, self.again, self.clock = every_s, then, again, clock
        self.error_type = error_type
        self.count = 0
        self._told_at = -math.inf
        self._told = False  # whether this streak was told (its end is told then)
        self._lock = threading.Lock()

    def failed(self, what: str | None = None) -> None:
        """Call in the ``except`` block of a failure.

        Args:
            what: This failure, when the lines should name more than the step (the version
                whose copy failed); the streak is still the step's.
        """
        with self._lock:  # decide under the lock, log outside it: logging has its own
            self.count += 1
            count, now = self.count, self.clock()
            if now - self._told_at < self.every_s:
                return
            # A streak first told after failures inside the quiet time says how many there were.
            self._told_at, self._told, first = now, True, count == 1
        what, error = what or self.what, _last_error(self.error_type)
        if first:
            said = f"({self.then or 'retried'}; {_one_line_every(self.every_s)} while it fails)"
            if self.traceback and not isinstance(sys.exc_info()[1], self.expected):
                self.log.exception("%s failed %s", what, said)
            else:
                self.log.warning("%s failed %s: %s", what, said, error)
        else:
            then = f" ({self.then})" if self.then else ""
            self.log.warning("%s failed %d times in a row%s: %s", what, count, then, error)

    def ended(self) -> None:
        """Call after a success."""
        with self._lock:
            count, told, self.count, self._told = self.count, self._told, 0, False
        if told:
            self.log.info("%s %s after %d failure(s)", self.what, self.again, count)


def _one_line_every(seconds: float) -> str:
    """``every_s`` as the first line says it: "one line a minute", "one line every 10 s"."""
    if seconds == 60:
        return "one line a minute"
    if seconds > 60 and seconds % 60 == 0:
        return f"one line every {seconds / 60:g} minutes"
    return f"one line every {seconds:g} s"


def _last_error(with_type: bool) -> str:
    """The first line of the error being handled (a driver's error may run to pages)."""
    err = sys.exc_info()[1]
    if err is None or not str(err):
        return repr(err)
    first = str(err).splitlines()[0]
    return f"{type(err).__name__}: {first}" if with_type else first
