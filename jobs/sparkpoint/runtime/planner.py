"""Plans the offset range of every source split for the next epoch, and where barriers go.

A job of several sources is planned as one source of all their splits
(:class:`CombinedSplits`): one epoch reads a range of every split of every source.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial

from sparkpoint.clock import Clock
from sparkpoint.connectors.sources import Source, SourceUnavailableError
from sparkpoint.graph import JobGraph
from sparkpoint.records import Batch
from sparkpoint.runtime.plan import SplitRange

#: Epochs grow at most this much from one to the next (a misjudged cost costs one epoch).
GROWTH = 4
#: A paced job's epochs read at least this many times what arrives while they run.
KEEP_UP_MARGIN = 1.25
#: How quickly the arrival rate follows a change (weight of the latest epoch).
RATE_SMOOTHING = 0.5
#: The most records per split of a job's first sized epoch, and of the first epoch after a
#: restore: its Python workers start afresh (the failed epoch's were killed), and no keyed task
#: runs before the source stage ended, so a full-sized epoch kept the job from its first
#: processed record for as long as reading it took (0.97 s of 1.10 s recovery,
#: ``make bench-recovery``). Before it, a driver's very first epoch reads only ``min_records``
#: per split: it is mostly start-up, a checkpoint triggered while it runs is carried by the
#: next epoch, and that next epoch is bounded by what the first one cost. A first epoch of
#: FIRST_EPOCH_RECORDS with a slow function (50 us a record: 10 s) expired the first checkpoint
#: of every driver under a 3 s checkpoint timeout.
FIRST_EPOCH_RECORDS = 100_000
#: The longest an epoch may run, as a share of the checkpoint timeout: a barrier travels with
#: an epoch, and a checkpoint triggered while one epoch runs is carried by the next (connected
#: mode), so two epochs and a margin must fit in the timeout. Without this bound a job catching
#: up grew its epochs past the timeout: every checkpoint expired, and the failover that
#: followed restored the same backlog, over and over.
CHECKPOINT_TIMEOUT_SHARE = 0.4
#: A split whose source did not answer is asked again after this long: planning an epoch
#: asks several times, and each question to a host that drops packets waits out a timeout.
ASK_AGAIN_MS = 1_000


def timeout_fitting(epoch_ms: float) -> int:
    """The shortest checkpoint timeout (ms, rounded up to 100 ms) whose
    :data:`CHECKPOINT_TIMEOUT_SHARE` holds an epoch of ``epoch_ms``: what the console and the
    control plane name when a timeout is too short for the job's epochs."""
    return math.ceil(epoch_ms / CHECKPOINT_TIMEOUT_SHARE / 100) * 100


class CombinedSplits(Source):
    """Several sources' splits as one source's, in order, for the planner: split ``i`` of the
    whole is split ``i - offset`` of the source it falls in; ids are the job's
    (:meth:`~sparkpoint.graph.JobGraph.split_ids`)."""

    def __init__(self, sources: Sequence[Source], split_ids: list[str]) -> None:
        self._where = [(src, i) for src in sources for i in range(len(src.split_ids()))]
        self._ids = split_ids

    def split_ids(self) -> list[str]:
        return list(self._ids)

    def total(self, split: int) -> int | None:
        src, i = self._where[split]
        return src.total(i)

    def available(self, split: int, elapsed_s: float) -> int | None:
        src, i = self._where[split]
        return src.available(i, elapsed_s)

    def read(self, split: int, start: int, end: int) -> Batch:
        src, i = self._where[split]
        return src.read(i, start, end)


def planned_source(graph: JobGraph) -> Source:
    """What the planner plans: the job's one source, or all its sources' splits in order."""
    if len(graph.sources) == 1:
        return graph.source.source
    return CombinedSplits([s.source for s in graph.sources], graph.split_ids())


def holds_records(ranges: Sequence[SplitRange]) -> bool:
    """Whether an epoch of ``ranges`` reads any record."""
    return any(r.records for r in ranges)


class EpochCostModel:
    """An epoch's duration: a fixed overhead plus a cost per record, fitted to recent epochs.

    Least squares over the last ``window`` epochs (records, milliseconds) when their sizes
    differ enough to tell the two apart; otherwise the per-record cost stays and the overhead
    follows the latest epochs. Overhead is Spark's scheduling, Python workers and the driver's
    own work per epoch: 0.3 s on an idle machine, 2 s on a loaded one.
    """

    def __init__(self, window: int = 8) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self.overhead_ms = 0.0
        self.per_record_ms: float | None = None  # None until an epoch was observed

    def observe(self, records: int, duration_ms: float) -> None:
        """Add an epoch that read ``records`` records in ``duration_ms`` and fit again."""
        if records <= 0 or duration_ms <= 0:
            return
        self._samples.append((float(records), duration_ms))
        ns = [n for n, _ in self._samples]
        mean_n = sum(ns) / len(ns)
        mean_d = sum(d for _, d in self._samples) / len(ns)
        if len(ns) >= 2 and max(ns) - min(ns) >= 0.25 * max(ns):  # sizes differ: fit
            var = sum((n - mean_n) ** 2 for n in ns)
            cov = sum((n - mean_n) * (d - mean_d) for n, d in self._samples)
            per_record = max(0.0, cov / var)
        elif self.per_record_ms is not None:  # keep the cost per record
            per_record = self.per_record_ms
        else:  # a first epoch alone: all of it counts as per-record cost (pessimistic)
            per_record = mean_d / mean_n
        overhead = mean_d - per_record * mean_n
        if overhead < 0:  # the records cost more than the fit says: no overhead at all
            overhead, per_record = 0.0, mean_d / mean_n
        self.overhead_ms, self.per_record_ms = overhead, per_record

    def duration_ms(self, records: float) -> float:
        """The predicted duration of an epoch of ``records`` records."""
        return self.overhead_ms + (self.per_record_ms or 0.0) * records

    def records_within(self, ms: float) -> float:
        """The most records an epoch reads in ``ms`` milliseconds (inf: no per-record cost)."""
        if ms <= self.overhead_ms:
            return 0.0
        per_record = self.per_record_ms or 0.0
        return (ms - self.overhead_ms) / per_record if per_record > 0 else math.inf

    def keep_up_records(self, rate_per_ms: float) -> float:
        """The epoch size at which an epoch reads what arrives while it runs, at
        ``rate_per_ms`` records per millisecond (``n = rate * (overhead + n * cost)``);
        inf when the job cannot keep up at any size."""
        per_record = self.per_record_ms or 0.0
        if rate_per_ms * per_record >= 1:
            return math.inf
        return rate_per_ms * self.overhead_ms / (1 - rate_per_ms * per_record)


class EpochPlanner:
    """Tracks source positions; sizes epochs from their measured cost and the source's lag.

    With ``--rate`` the source only *has* ``rate * elapsed`` records; the planner waits for
    some to exist rather than spin. Epoch sizes are per split, between ``min_records`` and
    ``max_records``:

    - unpaced sources: what the job processes in the target duration, at the throughput the
      last epoch measured;
    - paced sources: from an :class:`EpochCostModel` and the arrival rate. Caught up, an epoch
      is as large as the target duration allows, but never below what keeps up with the
      arrivals (with a fixed overhead near the target, a throughput-sized epoch reads less
      than arrives while it runs, and the job falls behind for good). Behind (more records
      available than such an epoch reads), epochs grow by up to :data:`GROWTH` per epoch and
      read the whole backlog, so each reads more than arrives during it; caught up again,
      they shrink back to the target.
    """

    def __init__(
        self,
        source: Source,
        clock: Clock,
        *,
        target_ms: float,
        min_records: int,
        max_records: int,
        checkpoint_timeout_ms: float = math.inf,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.source = source
        self.clock = clock
        self.split_ids = source.split_ids()
        #: Told (event, text, level) when the source stops answering and when it answers
        #: again (the driver's console).
        self.say: Callable[[str, str, str], None] | None = None
        # Splits whose source did not answer last time, and when to ask again (monotonic ms).
        self._unanswered: dict[int, float] = {}
        self.totals = [self._total(i) for i in range(len(self.split_ids))]
        self.positions = [0] * len(self.split_ids)
        self.target_ms = target_ms
        self.min_records = min_records
        self.max_records = max_records
        self.checkpoint_timeout_ms = checkpoint_timeout_ms
        self._said_budget = False
        self._said_unreachable_for: float | None = None  # the timeout it was said for
        #: The bound (ms) that held the latest planned epoch below the size the job wanted
        #: (:meth:`_within_budget`); None: that epoch was not held back.
        self.held_within_ms: float | None = None
        # The first epoch alone, start-up included (all of it a cost per record): until the
        # cost model has an epoch, what bounds the next one by the checkpoint timeout.
        self._first_cost: EpochCostModel | None = None
        self._first = max(min_records, min(max_records, FIRST_EPOCH_RECORDS))
        self.per_split = min_records  # the first epoch: start-up; FIRST_EPOCH_RECORDS next
        # After a restore: the cap of the next epoch's size, growing by GROWTH per epoch.
        self._restart_cap: int | None = None
        self.cost = EpochCostModel()
        self.arrival_rate: float | None = None  # records/ms over all splits; None: unpaced
        self._sleep = sleep
        self._started = clock.monotonic_ms()
        self._offset_s = 0.0  # the source's clock ahead of ours: a restored position exists
        self._observed = 0
        self._planned = self.per_split  # the per-split size of the last planned epoch
        self._arrived = (self._started, 0.0)  # (monotonic ms, records arrived by then)

    def start(self) -> None:
        """Start pacing now (``--rate`` counts from the first epoch, not from start-up)."""
        self._started = self.clock.monotonic_ms()
        self._arrived = (self._started, self._arrivals(self._elapsed_s()))

    def _elapsed_s(self) -> float:
        """Seconds of the paced source's clock: since :meth:`start`, plus the offset a restore
        in a new driver needs (a position that a checkpoint holds existed already)."""
        return (self.clock.monotonic_ms() - self._started) / 1000 + self._offset_s

    @property
    def started(self) -> bool:
        """Whether an epoch ended: before, the job's Python workers are still starting (Flink's
        tasks not yet RUNNING)."""
        return self._observed > 0

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
        return int(self._lag(self._elapsed_s()))

    def unanswered_splits(self) -> list[str]:
        """The ids of the splits whose source did not answer when last asked: :meth:`lag`
        does not count them, so while there are any the job's lag is unknown."""
        return [self.split_ids[i] for i in sorted(self._unanswered)]

    def _lag(self, elapsed_s: float) -> float:
        lag = 0.0
        for i, pos in enumerate(self.positions):
            avail = self._available(i, elapsed_s)
            lag += max(0, avail - pos) if avail != math.inf else 0
        return lag

    def _available(self, split: int, elapsed_s: float) -> float:
        total = self.totals[split]
        # A source that does not answer has nothing new: its epochs read nothing of it.
        avail = self._ask(
            split, partial(self.source.available, split, elapsed_s), self.positions[split]
        )
        limits = [x for x in (total, avail) if x is not None]
        return min(limits) if limits else math.inf

    def _total(self, split: int) -> int | None:
        # None: not known yet. Its answer says nothing of the source's system: a source that
        # needs it for no total (unbounded) answers without asking.
        return self._ask(split, partial(self.source.total, split), None, answers_again=False)

    def _ask(
        self,
        split: int,
        question: Callable[[], int | None],
        unanswered: int | None,
        *,
        answers_again: bool = True,
    ) -> int | None:
        """The source's answer about ``split``, or ``unanswered`` when its system does not
        answer. The first split that stops answering, and the last that answers again (an
        answer that ``answers_again``), are told (:attr:`say`); a split that did not answer
        is asked again :data:`ASK_AGAIN_MS` later."""
        now = self.clock.monotonic_ms()
        if now < self._unanswered.get(split, -math.inf):
            return unanswered
        try:
            answer = question()
        except SourceUnavailableError as err:
            if not self._unanswered and self.say is not None:
                self.say(
                    "source_unavailable",
                    f"{str(err).rstrip('.')}; the job reads nothing of it (checkpoints go "
                    "on) until it answers again",
                    "warning",
                )
            self._unanswered[split] = now + ASK_AGAIN_MS
            return unanswered
        if answers_again and split in self._unanswered:
            del self._unanswered[split]
            if not self._unanswered and self.say is not None:
                self.say("source_available", "the source answers again", "info")
        return answer

    def _arrivals(self, elapsed_s: float) -> float:
        """Records of all splits that exist after ``elapsed_s`` (inf: unpaced source)."""
        return sum(self._available(i, elapsed_s) for i in range(len(self.split_ids)))

    def next_ranges(self, wait_ms: float = math.inf) -> list[SplitRange]:
        """The ranges of the next epoch; waits (a paced or an idle source) until some record
        exists, at most ``wait_ms``: then the ranges hold no record (:func:`holds_records`),
        so that the caller can obey a cancel, a command or a checkpoint that is due (an
        epoch with no record carries its barrier, as a Flink source with no data does)."""
        deadline = self.clock.monotonic_ms() + wait_ms
        while True:
            # A split without a total may learn it (a Redis stream reaches its --until-id).
            self.totals = [self._total(i) if t is None else t for i, t in enumerate(self.totals)]
            elapsed = self._elapsed_s()
            size = self._epoch_size(self._lag(elapsed))
            ranges = []
            for i, pos in enumerate(self.positions):
                end = int(min(self._available(i, elapsed), pos + size))
                ranges.append(SplitRange(i, self.split_ids[i], pos, max(pos, end)))
            if holds_records(ranges) or self.exhausted():
                self._planned = size
                if self._restart_cap is not None:
                    grown = self._restart_cap * GROWTH
                    self._restart_cap = grown if grown < self.max_records else None
                return ranges
            left = deadline - self.clock.monotonic_ms()
            if left <= 0:
                return ranges
            self._sleep(min(self.target_ms, 100, left) / 1000)

    def _epoch_size(self, lag: float) -> int:
        """Records per split of the next epoch: behind (a paced source whose ``lag`` is more
        than a caught-up epoch reads), grow toward the whole backlog; else ``per_split``.
        Never more than the cost model says runs within :data:`CHECKPOINT_TIMEOUT_SHARE` of
        the checkpoint timeout (:meth:`_within_budget`)."""
        cap = self.max_records if self._restart_cap is None else self._restart_cap
        if self.arrival_rate is None or lag <= self.per_split * len(self.split_ids):
            return self._within_budget(min(self.per_split, cap))
        backlog = math.ceil(lag / len(self.split_ids))
        size = max(self.per_split, min(backlog, GROWTH * self._planned, self.max_records))
        return self._within_budget(min(size, cap))

    def _within_budget(self, size: int) -> int:
        """``size``, or fewer records per split when the cost model predicts that an epoch of
        ``size`` runs longer than :data:`CHECKPOINT_TIMEOUT_SHARE` of the checkpoint timeout
        (never fewer than ``min_records``); the first time, the console says so."""
        self.held_within_ms = None
        budget_ms = CHECKPOINT_TIMEOUT_SHARE * self.checkpoint_timeout_ms
        records = size * len(self.split_ids)
        cost = self.cost if self.cost.per_record_ms is not None else self._first_cost
        # Nothing measured yet: the first epoch is small (min_records per split).
        if cost is None or cost.duration_ms(records) <= budget_ms:
            return size
        within = cost.records_within(budget_ms) / len(self.split_ids)
        bounded = int(max(self.min_records, min(size, within)))
        if cost is not self.cost:
            # The start-up epoch's cost, all of it counted per record: a pessimistic guess that
            # bounds one epoch, not a measured bound to report (240 s under a 600 s timeout).
            return bounded
        if within < self.min_records:
            self._say_unreachable(budget_ms)
        if bounded < size:
            self.held_within_ms = budget_ms
        if not self._said_budget and self.say is not None:
            self._said_budget = True
            self.say(
                "epoch_bounded",
                f"epochs are kept within {budget_ms / 1000:g} s, {CHECKPOINT_TIMEOUT_SHARE:g} of "
                f"the {self.checkpoint_timeout_ms / 1000:g} s checkpoint timeout (a checkpoint "
                "travels with an epoch, and one triggered while an epoch runs with the next), "
                f"instead of the {size:,} records per split the job would read now; with a "
                "longer --checkpoint-timeout epochs grow and a job catches up faster",
                "info",
            )
        return bounded

    def _say_unreachable(self, budget_ms: float) -> None:
        """Once: even the smallest epoch the job plans outlasts the bound (an epoch's fixed
        cost alone does, measured, not the first epoch's start-up), so its checkpoints may
        expire whatever the planner does; the console names the timeout that would do (again
        when the timeout changes)."""
        if self._said_unreachable_for == self.checkpoint_timeout_ms or self.say is None:
            return
        self._said_unreachable_for = self.checkpoint_timeout_ms
        smallest_ms = self.cost.duration_ms(self.min_records * len(self.split_ids))
        self.say(
            "epoch_bound_unreachable",
            f"checkpoints may expire: the smallest epoch this job plans ({self.min_records:,} "
            f"records per split, --min-epoch-records) takes about {smallest_ms:,.0f} ms here, "
            f"more than {budget_ms:,.0f} ms, {CHECKPOINT_TIMEOUT_SHARE:g} of the "
            f"{self.checkpoint_timeout_ms / 1000:g} s checkpoint timeout; give checkpoints a "
            f"--checkpoint-timeout of at least {timeout_fitting(smallest_ms) / 1000:g} s",
            "warning",
        )

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
        """Seek every split back to a checkpoint's positions (0 where it has none); the next
        epochs start small again (:data:`FIRST_EPOCH_RECORDS`, then growing by GROWTH)."""
        self.positions = [positions.get(sid, 0) for sid in self.split_ids]
        self._restart_cap = self._first if self._first < self.max_records else None
        # A paced source has produced at least what a checkpoint read: a driver restarted from
        # it must not wait until its own clock reaches those positions again.
        behind = self._time_of_positions() - self._elapsed_s()
        if behind > 0:
            self._offset_s += behind

    def _time_of_positions(self) -> float:
        """The source-clock second by which every split's current position existed."""
        if all(self._available(i, 0.0) >= pos for i, pos in enumerate(self.positions)):
            return 0.0
        low, high = 0.0, 1.0
        while any(self._available(i, high) < pos for i, pos in enumerate(self.positions)):
            high *= 2
            if high > 1e9:  # a position the source never reaches (it shrank): do not wait
                return 0.0
        for _ in range(50):  # bisection to well below a millisecond
            mid = (low + high) / 2
            if all(self._available(i, mid) >= pos for i, pos in enumerate(self.positions)):
                high = mid
            else:
                low = mid
        return high

    def observe(self, records: int, duration_ms: float) -> None:
        """Learn from an accepted epoch; size the next one (see the class docstring).

        Steps: (1) the arrival rate since the last epoch (paced sources), (2) the cost model
        (not from the first epoch: it is mostly Python workers starting up), (3) the size.
        """
        # Step 1
        self._observe_arrivals()
        # Step 2
        self._observed += 1
        if records <= 0 or duration_ms <= 0:
            return
        if self._observed == 1:
            self._first_cost = EpochCostModel()
            self._first_cost.observe(records, duration_ms)
            self.per_split = self._first
            return
        self.cost.observe(records, duration_ms)
        # Step 3
        splits = len(self.split_ids)
        if self.arrival_rate is None:  # the job's own throughput over the target duration
            per_split = records / duration_ms * self.target_ms / splits
        else:
            keep_up = KEEP_UP_MARGIN * self.cost.keep_up_records(self.arrival_rate)
            per_split = max(self.cost.records_within(self.target_ms), keep_up) / splits
        grown = min(per_split, self.per_split * GROWTH)  # grow gradually, shrink at once
        self.per_split = int(max(self.min_records, min(self.max_records, grown)))

    def _observe_arrivals(self) -> None:
        now = self.clock.monotonic_ms()
        arrived = self._arrivals(self._elapsed_s())
        if arrived == math.inf:
            return
        since, before = self._arrived
        self._arrived = (now, arrived)
        if now <= since:
            return
        rate = (arrived - before) / (now - since)
        previous = rate if self.arrival_rate is None else self.arrival_rate
        self.arrival_rate = RATE_SMOOTHING * rate + (1 - RATE_SMOOTHING) * previous
