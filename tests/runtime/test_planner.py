"""The epoch planner catches up with a paced source when per-epoch overhead nears the target.

A simulated job on a :class:`~sparkpoint.clock.ManualClock`: every epoch costs a fixed
overhead plus a cost per record, and the source produces ``RATE`` records/s on top of a
backlog (``GeneratorSource(backlog=...)``). The planner as it was (epochs sized by measured
throughput alone) is computed beside the new one, from the same start.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkpoint import protocol as p
from sparkpoint.clock import ManualClock
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime import driver
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.planner import (
    CHECKPOINT_TIMEOUT_SHARE,
    FIRST_EPOCH_RECORDS,
    GROWTH,
    EpochCostModel,
    EpochPlanner,
    holds_records,
)
from sparkpoint.runtime.spark import SparkEpochRunner
from sparkpoint.testing import ListSource, line_counts

RATE = 20_000  # events/s, as the demo job
BACKLOG = 2_200_000  # how far behind the demo job fell
PER_RECORD_MS = 0.02  # 50,000 records/s of processing
TARGET_MS = 1_000.0


class ThroughputPlanner(EpochPlanner):
    """The planner before: the next epoch is what the last one's throughput reads in the
    target duration, whatever the lag (the rule that unpaced sources keep)."""

    def _observe_arrivals(self) -> None:
        """Never learns an arrival rate, so the source counts as unpaced."""


@dataclass
class Epoch:
    lag: int  # records available but unread when the epoch was planned
    records: int
    duration_ms: float
    lag_after_planning: int  # the same, once the epoch's ranges are taken
    planned_at_ms: float = 0.0  # since the planner started
    held_within_ms: float | None = None  # the planner's bound that held it back, if any


def _simulate(
    kind: type[EpochPlanner],
    epochs: int,
    overhead_ms: float,
    *,
    rate: float = RATE,
    backlog: int = BACKLOG,
    per_record_ms: float = PER_RECORD_MS,
    checkpoint_timeout_ms: float = math.inf,
    said: list[str] | None = None,
) -> list[Epoch]:
    clock = ManualClock()
    source = GeneratorSource(events=None, rate=rate, splits=2, backlog=backlog if rate else 0)
    planner = kind(
        source,
        clock,
        target_ms=TARGET_MS,
        min_records=1_000,
        max_records=4_000_000,
        checkpoint_timeout_ms=checkpoint_timeout_ms,
        sleep=lambda s: clock.advance(s * 1000),
    )
    if said is not None:
        planner.say = lambda event, text, level: said.append(text)
    planner.start()
    started = clock.monotonic_ms()
    out = []
    for _ in range(epochs):
        ranges = planner.next_ranges()
        lag = planner.lag()
        planner.advance(ranges)
        records = sum(r.records for r in ranges)
        duration = overhead_ms + per_record_ms * records
        since = clock.monotonic_ms() - started
        out.append(Epoch(lag, records, duration, planner.lag(), since, planner.held_within_ms))
        clock.advance(duration)
        planner.observe(records, duration)
    return out


def test_a_loaded_job_catches_up_where_the_old_planner_falls_behind_for_good() -> None:
    overhead = 2_000.0  # a loaded machine: twice the epoch target
    old = _simulate(ThroughputPlanner, 40, overhead)
    new = _simulate(EpochPlanner, 40, overhead)
    # What arrives while a minimal epoch runs, which no planner can avoid as lag:
    # n = RATE * (overhead + n * cost) -> 66,667 records.
    floor = RATE / 1000 * overhead / (1 - RATE / 1000 * PER_RECORD_MS)
    # The old planner settles at its floor (2 x 1,000 records per 2 s) and its lag grows.
    assert [e.records for e in old[-5:]] == [2_000] * 5
    assert old[-1].lag > BACKLOG + 600_000
    assert all(b.lag > a.lag for a, b in itertools.pairwise(old[5:]))
    # The new one reads the whole backlog within 4 epochs, and within 10 its lag is down
    # to what arrives during one minimal epoch, and stays there.
    caught_up = next(i for i, e in enumerate(new) if e.lag_after_planning == 0)
    assert caught_up <= 4
    settled = next(i for i, e in enumerate(new) if e.lag <= 1.05 * floor)
    assert settled <= 10
    assert all(e.lag <= 1.05 * floor and e.lag_after_planning == 0 for e in new[settled:])
    # ... with epochs back near their minimum duration, not the catch-up epochs' 35 s.
    assert max(e.duration_ms for e in new[:settled]) > 30_000
    assert max(e.duration_ms for e in new[settled:]) < 1.05 * (overhead + PER_RECORD_MS * floor)
    # Settled, the new one reads what arrives (20,000/s); the old one ~1,000/s for good.
    assert _records_per_s(new[settled:]) == pytest.approx(RATE, rel=0.01)
    assert _records_per_s(old[10:]) < 1_000


def test_catching_up_never_grows_an_epoch_past_what_the_checkpoint_timeout_allows() -> None:
    """A job 12 M records behind its source (100 k/s; 0.3 s and 2 us a record an epoch) with
    a 3 s checkpoint timeout: catching up used to grow epochs to 8 s, so every checkpoint
    expired and each failover restored the same backlog. Now every epoch after the first
    stays within CHECKPOINT_TIMEOUT_SHARE of the timeout (a checkpoint triggered during one
    epoch rides the next), and the job still catches up."""
    costs: dict[str, Any] = {"rate": 100_000, "backlog": 12_000_000, "per_record_ms": 0.002}
    unbounded = _simulate(EpochPlanner, 40, 300.0, **costs)
    assert max(e.duration_ms for e in unbounded) > 3 * 3_000
    said: list[str] = []
    bounded = _simulate(EpochPlanner, 80, 300.0, **costs, checkpoint_timeout_ms=3_000, said=said)
    budget = CHECKPOINT_TIMEOUT_SHARE * 3_000
    assert bounded[0].records == 2 * 1_000  # min_records per split: start-up
    assert all(e.duration_ms <= budget + 1e-6 for e in bounded[1:])
    assert max(e.duration_ms for e in bounded) > 0.9 * budget  # bounded, not shrunk
    caught_up = next(i for i, e in enumerate(bounded) if e.lag_after_planning == 0)
    assert caught_up < 60  # 12 M at 375 k/s of epochs, less the 100 k/s arriving: ~45 s
    assert bounded[caught_up].planned_at_ms < 60_000
    assert all(e.lag < 100_000 * budget / 1000 for e in bounded[caught_up + 1 :])
    # The heartbeat says which epochs the bound held back: the catching-up ones, not later.
    assert bounded[2].held_within_ms == budget
    assert all(e.held_within_ms is None for e in bounded[caught_up + 2 :])
    assert all(e.held_within_ms is None for e in unbounded)
    assert said == [
        "epochs are kept within 1.2 s, 0.4 of the 3 s checkpoint timeout (a checkpoint travels "
        "with an epoch, and one triggered while an epoch runs with the next), instead of the "
        "400,000 records per split the job would read now; with a longer --checkpoint-timeout "
        "epochs grow and a job catches up faster"
    ]


def test_a_slow_function_does_not_make_the_first_epochs_outlast_the_checkpoint_timeout() -> None:
    """50 us a record and a 3 s timeout: a first epoch of FIRST_EPOCH_RECORDS per split ran
    10 s, and the checkpoint triggered during it expired on every driver start. Now the first
    epoch reads min_records per split (mostly start-up), and what it cost bounds the next."""
    costs: dict[str, Any] = {"rate": 0, "per_record_ms": 0.05}
    unbounded = _simulate(EpochPlanner, 3, 300.0, **costs)
    assert [e.records for e in unbounded[:2]] == [2 * 1_000, 2 * FIRST_EPOCH_RECORDS]
    bounded = _simulate(EpochPlanner, 20, 300.0, **costs, checkpoint_timeout_ms=3_000)
    budget = CHECKPOINT_TIMEOUT_SHARE * 3_000
    assert all(e.duration_ms <= budget + 1e-6 for e in bounded)
    assert min(e.duration_ms for e in bounded[5:]) > 0.9 * TARGET_MS  # the target, not less


def test_a_checkpoint_timeout_no_epoch_fits_in_is_named_with_one_that_does() -> None:
    """A 50 ms timeout with epochs that cost 300 ms whatever they read (the cost model says
    340 ms for the smallest after its first epochs): no planning keeps a
    checkpoint within it. The console says so once, with a timeout that would do; a feasible
    timeout says nothing of the kind, and neither does a slow first epoch alone."""
    said: list[str] = []
    _simulate(EpochPlanner, 10, 300.0, rate=0, checkpoint_timeout_ms=50, said=said)
    unreachable = [s for s in said if s.startswith("checkpoints may expire")]
    assert unreachable == [
        "checkpoints may expire: the smallest epoch this job plans (1,000 records per split, "
        "--min-epoch-records) takes about 340 ms here, more than 20 ms, 0.4 of the 0.05 s "
        "checkpoint timeout; give checkpoints a --checkpoint-timeout of at least 0.9 s"
    ]
    for timeout_ms in (1_000, 3_000):
        said.clear()
        _simulate(EpochPlanner, 10, 300.0, rate=0, checkpoint_timeout_ms=timeout_ms, said=said)
        assert not [s for s in said if s.startswith("checkpoints may expire")]


def test_a_slow_start_up_alone_reports_no_bound() -> None:
    """The start-up epoch's cost, counted per record, is a guess that bounds the next epoch
    only: under the default 600 s timeout, 5 s of start-up for 2,000 records (2.5 ms each)
    held the next epoch to 48,000 records per split, and the console, the heartbeat and the
    dashboard called it 'held within 240 s by the checkpoint timeout'."""
    clock = ManualClock()
    source = GeneratorSource(events=None, rate=0, splits=2)
    planner = EpochPlanner(
        source,
        clock,
        target_ms=TARGET_MS,
        min_records=1_000,
        max_records=4_000_000,
        checkpoint_timeout_ms=600_000,
    )
    said: list[str] = []
    planner.say = lambda event, text, level: said.append(text)
    planner.advance(planner.next_ranges())
    planner.observe(2_000, 5_000.0)
    ranges = planner.next_ranges()
    assert sum(r.records for r in ranges) == 96_000  # bounded by the guess
    assert planner.held_within_ms is None and said == []


def _records_per_s(epochs: list[Epoch]) -> float:
    return sum(e.records for e in epochs) / sum(e.duration_ms for e in epochs) * 1000


def test_an_idle_job_keeps_epochs_within_the_target_after_catching_up() -> None:
    new = _simulate(EpochPlanner, 30, 300.0)
    settled = next(i for i, e in enumerate(new) if e.lag_after_planning == 0 and e.lag < 20_000)
    assert settled <= 9  # one epoch more than before the start-up epoch
    assert all(e.duration_ms < TARGET_MS and e.lag_after_planning == 0 for e in new[settled:])


def test_a_job_started_two_million_events_behind_catches_up_by_growing_its_epochs() -> None:
    """Benchmark 5's job (20 k events/s, 2 M behind) on an idle machine's costs (0.4 s an
    epoch, a million records/s): the first epoch is start-up (min_records per split); the
    next has the default size; then epochs grow by GROWTH until one reads the whole backlog,
    and the job stays caught up: every later epoch finds less than one target duration of
    arrivals."""
    epochs = _simulate(EpochPlanner, 20, 400.0, backlog=2_000_000, per_record_ms=0.001)
    assert epochs[0].lag == 2_000_000
    assert epochs[0].records == 2_000
    assert epochs[1].records == 200_000
    assert epochs[2].records == GROWTH * epochs[1].records
    whole = next(i for i, e in enumerate(epochs) if e.lag_after_planning == 0)
    assert whole == 3
    assert epochs[whole].records == epochs[whole].lag > GROWTH * epochs[1].records
    one_epoch = RATE * TARGET_MS / 1000  # what a caught-up epoch reads at most
    caught_up = next(i for i in range(len(epochs)) if all(e.lag <= one_epoch for e in epochs[i:]))
    # The epoch that reads the rest of the backlog lasts over the target (1.4 s), so the one
    # after it still finds more than a target's arrivals; the next is caught up.
    assert caught_up == whole + 2
    assert epochs[caught_up].planned_at_ms < 10_000  # benchmark 5 asks for 60 s
    assert all(e.lag_after_planning == 0 for e in epochs[whole:])
    assert all(e.duration_ms < TARGET_MS for e in epochs[caught_up:])


def test_an_unpaced_source_keeps_epochs_sized_by_throughput() -> None:
    """Unpaced sources (the runtime tests' jobs) keep their sizing: per split, what the last
    epoch's throughput reads in the target duration, growing at most 4x (the first epoch,
    mostly start-up, reads min_records per split and is not measured)."""
    for overhead in (300.0, 2_000.0):
        epochs = _simulate(EpochPlanner, 12, overhead, rate=0)
        per_split, expected = 100_000, [2_000, 200_000]
        for e in epochs[1:-1]:
            rule = e.records / e.duration_ms * TARGET_MS / 2
            per_split = int(max(1_000, min(rule, 4 * per_split)))
            expected.append(2 * per_split)
        assert [e.records for e in epochs] == expected


def test_the_cost_model_separates_overhead_from_per_record_cost() -> None:
    model = EpochCostModel()
    model.observe(10_000, 2_000 + 0.02 * 10_000)
    assert (model.overhead_ms, model.per_record_ms) == (0.0, pytest.approx(0.22))
    model.observe(40_000, 2_000 + 0.02 * 40_000)
    assert model.overhead_ms == pytest.approx(2_000)
    assert model.per_record_ms == pytest.approx(0.02)
    assert model.keep_up_records(20.0) == pytest.approx(20 * 2_000 / 0.6)
    assert model.keep_up_records(50.0) == math.inf  # 50,000/s is all it processes
    assert model.records_within(1_000) == 0.0  # the overhead alone is over the target
    assert model.records_within(3_000) == pytest.approx(50_000)
    # The machine gets busier: within a window of epochs the fit follows.
    for i in range(8):
        records = 20_000 + 20_000 * (i % 2)
        model.observe(records, 3_000 + 0.02 * records)
    assert model.overhead_ms == pytest.approx(3_000)
    assert model.per_record_ms == pytest.approx(0.02)


# ----------------------------------------------------------------------------- on Spark

SPARK_BACKLOG = 20_000
SPARK_RATE = 5_000.0
SPARK_EVENTS = 60_000  # the last record exists 8 s after the job starts
EPOCH_DELAY_S = 1.5  # on top of Spark's own 0.3-2 s: the overhead is over the 1 s target


class SlowEpochRunner(SparkEpochRunner):
    """Spark epochs with a fixed extra cost each, as on a loaded machine."""

    def run(self, plan: EpochPlan) -> list[TaskReport]:
        time.sleep(EPOCH_DELAY_S)  # the simulated overhead, not a wait for something
        return super().run(plan)


@pytest.mark.spark
def test_a_slow_job_on_spark_catches_up_with_its_paced_source(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "SparkEpochRunner", SlowEpochRunner)
    options = JobOptions(
        job_id="catch-up",
        local_dir=str(tmp_path / "local"),
        min_epoch_records=500,
        restart_strategy={"restart-strategy.type": "none"},
    )
    env = StreamExecutionEnvironment(options)
    source = GeneratorSource(events=SPARK_EVENTS, apps=3, rate=SPARK_RATE, backlog=SPARK_BACKLOG)
    env.from_source(source, uid="events").sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    result = env.execute("catch-up", spark=spark)
    beats = [b for b in result.events.of_type(p.Heartbeat) if isinstance(b, p.Heartbeat)]
    assert result.status is p.JobStatus.FINISHED
    assert result.records == SPARK_EVENTS
    assert sum(line_counts(str(tmp_path / "out")).values()) == SPARK_EVENTS
    assert beats[-1].source_lag == 0
    # Caught up: each epoch reads what arrived while the one before ran, so the job ends a
    # few epochs after its last record exists. The old planner shrank epochs to 2 x 500
    # records per (1.5 s + Spark) and needed more than 20 epochs and 40 s.
    # Timed as the source is paced: from the first epoch (the job's start-up, seconds on a
    # loaded machine, is not the planner's doing) to the last epoch's end.
    source_s = (SPARK_EVENTS - SPARK_BACKLOG) / SPARK_RATE
    slowest_s = max(b.duration_ms for b in beats) / 1000
    seconds = (beats[-1].host_time - beats[0].host_time + beats[0].duration_ms) / 1000
    assert len(beats) <= 10, [(b.records, b.source_lag, b.duration_ms) for b in beats]
    assert seconds < source_s + 4 * slowest_s, (seconds, source_s, slowest_s)


def test_a_driver_restored_from_a_checkpoint_reads_on_at_once_from_a_paced_source() -> None:
    """A new driver (its pacing clock at zero) restored to positions that took the earlier
    driver a minute to read: the paced source has produced those already, so the planner plans
    an epoch past them at once instead of waiting a minute for its own clock to get there."""
    clock = ManualClock()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds * 1000)

    source = GeneratorSource(events=10_000_000, apps=10, rate=RATE)
    planner = EpochPlanner(
        source, clock, target_ms=TARGET_MS, min_records=1_000, max_records=4_000_000, sleep=sleep
    )
    minute = {sid: RATE * 60 // len(source.split_ids()) for sid in source.split_ids()}
    planner.reset(minute)
    planner.start()
    clock.advance(100)
    ranges = planner.next_ranges()
    assert sleeps == []
    assert [r.start for r in ranges] == list(minute.values())
    assert all(r.records > 0 for r in ranges)
    assert planner.lag() == sum(r.records for r in ranges)  # not a minute of backlog either


def test_a_restored_driver_with_a_backlog_neither_waits_nor_reads_the_backlog_again() -> None:
    """With a backlog a new driver's source has ``backlog`` records at once: restored inside
    it, the driver reads on from the checkpoint (the rest of the backlog is its lag); restored
    past it, the planner moves its clock as without a backlog, and does not wait."""
    for minutes, lag in ((1, BACKLOG - RATE * 60), (3, 0)):
        clock = ManualClock()
        sleeps: list[float] = []
        source = GeneratorSource(events=None, rate=RATE, backlog=BACKLOG)
        planner = EpochPlanner(
            source,
            clock,
            target_ms=TARGET_MS,
            min_records=1_000,
            max_records=4_000_000,
            sleep=sleeps.append,
        )
        read = {sid: RATE * 60 * minutes // 2 for sid in source.split_ids()}
        planner.reset(read)
        planner.start()
        assert planner.lag() == lag
        clock.advance(100)
        ranges = planner.next_ranges()
        assert sleeps == []
        assert [r.start for r in ranges] == list(read.values())
        assert planner.lag() == lag + RATE // 10  # and 100 ms of arrivals


def test_after_a_restore_epochs_start_small_and_grow_back_to_their_learned_size() -> None:
    # An unpaced job whose epochs had grown to the cap: a restore starts over with an epoch of
    # FIRST_EPOCH_RECORDS per split (fresh Python workers; keyed tasks wait for the source
    # stage), then GROWTH times more each epoch until the learned size again.
    clock = ManualClock()
    source = GeneratorSource(events=100_000_000, apps=10, rate=0, splits=2)
    planner = EpochPlanner(
        source, clock, target_ms=TARGET_MS, min_records=1_000, max_records=4_000_000
    )
    planner.per_split = 4_000_000  # what the throughput of earlier epochs asked for
    assert planner.next_ranges()[0].records == 4_000_000
    planner.reset({})
    sizes = []
    for _ in range(5):
        ranges = planner.next_ranges()
        sizes.append(ranges[0].records)
        planner.advance(ranges)
    assert (
        sizes
        == [FIRST_EPOCH_RECORDS, 4 * FIRST_EPOCH_RECORDS, 16 * FIRST_EPOCH_RECORDS]
        + [4_000_000] * 2
    )


def test_an_idle_source_is_waited_for_at_most_as_long_as_asked() -> None:
    """An unbounded source with nothing new: the planner hands back ranges with no record
    after ``wait_ms`` instead of waiting for ever, so that the job can see a signal, a command
    or a checkpoint that is due meanwhile."""
    clock = ManualClock()
    planner = EpochPlanner(
        ListSource(tuple(range(10)), splits=2, bounded=False),
        clock,
        target_ms=TARGET_MS,
        min_records=1_000,
        max_records=4_000_000,
        sleep=lambda s: clock.advance(s * 1000),
    )
    first = planner.next_ranges(wait_ms=250)
    assert holds_records(first) and clock.monotonic_ms() == 0
    planner.advance(first)
    before = clock.monotonic_ms()
    ranges = planner.next_ranges(wait_ms=250)
    assert not holds_records(ranges)
    assert [(r.start, r.end) for r in ranges] == [(5, 5), (5, 5)]
    assert clock.monotonic_ms() - before == 250
    assert not planner.exhausted()
