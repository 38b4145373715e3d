"""Injected time: a wall clock for timestamps and a monotonic clock for durations and deadlines."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What the runtime and the coordinator read time from."""

    def now_ms(self) -> int:
        """Wall-clock time in epoch milliseconds (for timestamps shown to people)."""
        ...

    def monotonic_ms(self) -> float:
        """Monotonic milliseconds (for durations and deadlines; never goes back)."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic_ns() / 1_000_000


class ManualClock:
    """A clock that only moves when a test advances it."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._wall = start_ms
        self._mono = 0.0

    def now_ms(self) -> int:
        return self._wall

    def monotonic_ms(self) -> float:
        return self._mono

    def advance(self, ms: float) -> None:
        """Move both clocks forward by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError(f"a clock cannot go back ({ms} ms)")
        self._wall += int(ms)
        self._mono += ms
