"""Plans the offset range of every source split for the next epoch, and where barriers go."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from sparkpoint.clock import Clock
from sparkpoint.connectors.sources import Source
from sparkpoint.runtime.plan import SplitRange


class EpochPlanner:
    """Tracks source positions; sizes epochs to a target duration from measured throughput.

    With ``--rate`` the source only *has* ``rate * elapsed`` records; the planner waits for
    some to exist rather than spin. Without it, epochs grow to what the job processes in the
    target duration (between ``min_records`` and ``max_records`` per split).
    """

    def __init__(
        self,
        source: Source,
        clock: Clock,
        *,
        target_ms: float,
        min_records: int,
        max_records: int,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.source = source
        self.clock = clock
        self.split_ids = source.split_ids()
        self.totals = [source.total(i) for i in range(len(self.split_ids))]
        self.positions = [0] * len(self.split_ids)
        self.target_ms = target_ms
        self.min_records = min_records
        self.max_records = max_records
        self.per_split = max(min_records, min(max_records, 100_000))
        self._sleep = sleep
        self._started = clock.monotonic_ms()
        self._observed = 0

    def start(self) -> None:
        """Start pacing now (``--rate`` counts from the first epoch, not from start-up)."""
        self._started = self.clock.monotonic_ms()

    @property
    def bounded(self) -> bool:
        return all(t is not None for t in self.totals)

    def exhausted(self) -> bool:
        """True once every (bounded) split has been read to its end."""
        return self.bounded and all(
            pos >= (total or 0) for pos, total in zip(self.positions, self.totals, strict=True)
        )

    def lag(self) -> int:
        """Records that exist but were not read yet (bounded sources: all unread ones)."""
        elapsed = (self.clock.monotonic_ms() - self._started) / 1000
        lag = 0.0
        for i, pos in enumerate(self.positions):
            avail = self._available(i, elapsed)
            lag += max(0, avail - pos) if avail != math.inf else 0
        return int(lag)

    def _available(self, split: int, elapsed_s: float) -> float:
        total = self.totals[split]
        avail = self.source.available(split, elapsed_s)
        limits = [x for x in (total, avail) if x is not None]
        return min(limits) if limits else math.inf

    def next_ranges(self) -> list[SplitRange]:
        """The ranges of the next epoch; waits (paced sources) until some record exists."""
        while True:
            elapsed = (self.clock.monotonic_ms() - self._started) / 1000
            ranges = []
            for i, pos in enumerate(self.positions):
                end = int(min(self._available(i, elapsed), pos + self.per_split))
                ranges.append(SplitRange(i, self.split_ids[i], pos, max(pos, end)))
            if any(r.records for r in ranges) or self.exhausted():
                return ranges
            self._sleep(min(self.target_ms, 100) / 1000)

    def will_exhaust(self, ranges: list[SplitRange]) -> bool:
        """True when reading ``ranges`` reaches the end of every (bounded) split."""
        return self.bounded and all(r.end >= (self.totals[r.split] or 0) for r in ranges)

    @staticmethod
    def with_barrier(ranges: list[SplitRange], at_end: bool) -> list[SplitRange]:
        """Place the barrier in the middle of every split's range (or at its end)."""
        return [
            SplitRange(
                r.split, r.split_id, r.start, r.end, r.end if at_end else r.start + r.records // 2
            )
            for r in ranges
        ]

    def advance(self, ranges: list[SplitRange]) -> None:
        for r in ranges:
            self.positions[r.split] = r.end

    def reset(self, positions: dict[str, int]) -> None:
        """Seek every split back to a checkpoint's positions (0 where it has none)."""
        self.positions = [positions.get(sid, 0) for sid in self.split_ids]

    def observe(self, records: int, duration_ms: float) -> None:
        """Resize epochs so that the next one takes about the target duration."""
        self._observed += 1
        if records <= 0 or duration_ms <= 0 or self._observed == 1:
            return  # the first epoch's rate is mostly Python workers starting up
        per_split = records / duration_ms * self.target_ms / len(self.split_ids)
        grown = min(per_split, self.per_split * 4)  # grow gradually, shrink at once
        self.per_split = int(max(self.min_records, min(self.max_records, grown)))
