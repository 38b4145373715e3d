"""A source whose system does not answer (a Redis down or restarting) stops no job.

The driver asks a source how much it holds (``available``, ``total``) to plan each epoch, and
tells it when a checkpoint completed (``notify_checkpoint_complete``). A Redis that went away
for seconds used to end the job there, with a traceback and no restart. Now the planner reads
nothing of the source while it does not answer (the job's epochs and checkpoints go on, as a
Flink source whose system is away reads nothing), a completion that cannot be told waits for
the next one, and the console says each once per outage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sparkpoint import protocol as p
from sparkpoint.clock import ManualClock
from sparkpoint.connectors.redis_source import RedisStreamSource
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.connectors.sources import SourceUnavailableError, unanswered_text
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.runtime.planner import ASK_AGAIN_MS, EpochPlanner, holds_records
from sparkpoint.testing import ListSource, committed_lines

from ...support.own_redis import OwnRedis
from ..pv_harness import job_options


def _fill(redis_server: OwnRedis, stream: str, n: int) -> None:
    with redis_server.client() as client:
        for i in range(n):
            client.xadd(stream, {"n": str(i)})


def test_a_redis_that_does_not_answer_is_a_source_unavailable_error(
    own_redis: OwnRedis,
) -> None:
    _fill(own_redis, "ev", 30)
    source = RedisStreamSource(own_redis.url, ["ev"], splits_per_stream=1, until_id="9" * 15)
    assert source.available(0, 0.0) == 30
    own_redis.kill()
    for ask in (
        lambda: source.available(0, 0.0),
        lambda: source.total(0),
        lambda: source.notify_checkpoint_complete(1, {source.split_ids()[0]: 10}),
    ):
        with pytest.raises(SourceUnavailableError, match="the Redis of streams ev does not answer"):
            ask()
    own_redis.start()  # its append-only file brings the stream back
    assert source.available(0, 0.0) == 30


def test_the_planner_reads_nothing_of_a_source_that_does_not_answer_and_says_so_once(
    own_redis: OwnRedis,
) -> None:
    _fill(own_redis, "ev", 40)
    source = _Counted(own_redis.url, ["ev"], splits_per_stream=2)
    clock = ManualClock()
    planner = EpochPlanner(source, clock, target_ms=1000, min_records=5, max_records=5)
    said: list[tuple[str, str]] = []
    planner.say = lambda event, text, level: said.append((event, level))
    first = planner.next_ranges(wait_ms=0)
    assert holds_records(first)
    planner.advance(first)
    own_redis.kill()
    asked = len(source.asked)
    for _ in range(3):  # each epoch planned while it is down reads nothing
        assert not holds_records(planner.next_ranges(wait_ms=0))
    assert said == [("source_unavailable", "warning")]
    # Its lag is unknown, not 0: the heartbeat names the splits the lag leaves out.
    assert planner.unanswered_splits() == ["redis:ev#0/2", "redis:ev#1/2"]
    # Each split was asked once: not again before ASK_AGAIN_MS (a timeout each, maybe).
    assert sorted(source.asked[asked:]) == [0, 1]
    own_redis.start()
    clock.advance(ASK_AGAIN_MS)
    again = planner.next_ranges(wait_ms=0)
    assert [(r.start, r.end) for r in again] == [(r.end, r.end + 5) for r in first]
    assert said == [("source_unavailable", "warning"), ("source_available", "info")]
    assert planner.unanswered_splits() == []


class _Counted(RedisStreamSource):
    """The Redis source, counting the driver's questions of how much a split holds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[int] = []

    def available(self, split: int, elapsed_s: float) -> int | None:
        self.asked.append(split)
        return super().available(split, elapsed_s)


@dataclass(frozen=True)
class _AwaySource(ListSource):
    """Records from a list. Its system does not answer the driver's questions of how much a
    split holds number ``asked_from`` to ``asked_from + asked_for - 1`` (counted from 1), nor
    its first ``away`` notifications. The driver's own copy counts them; the tasks read
    copies."""

    away: int = 0
    asked_from: int = 0
    asked_for: int = 0
    asked: list[int] = field(default_factory=list, compare=False)
    told: list[int] = field(default_factory=list, compare=False)

    def available(self, split: int, elapsed_s: float) -> int | None:
        self.asked.append(split)
        if self.asked_from <= len(self.asked) < self.asked_from + self.asked_for:
            raise SourceUnavailableError("the source's system does not answer")
        return super().available(split, elapsed_s)

    def notify_checkpoint_complete(self, checkpoint_id: int, positions: dict[str, int]) -> None:
        self.told.append(checkpoint_id)
        if len(self.told) <= self.away:
            raise SourceUnavailableError("the source's system does not answer")


def test_a_completion_a_source_cannot_be_told_waits_for_the_next_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = job_options("away", tmp_path, "job", epoch_records=10)
    env = StreamExecutionEnvironment(options)
    records: tuple[Any, ...] = tuple({"n": i} for i in range(100))
    source = _AwaySource(records, splits=1, away=3)
    env.from_source(source, uid="events").sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    result = JobDriver(env.graph, options, in_process=True).run()
    assert result.status is p.JobStatus.FINISHED and result.restores == []
    assert sorted(committed_lines(str(tmp_path / "out"))) == sorted(
        f'{{"n": {i}}}' for i in range(100)
    )
    told = source.told
    assert len(told) > 3  # the completions after the outage told it
    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if "was not told" in line] == [
        f"sparkpoint away: WARNING: source events was not told that checkpoint {told[0]} "
        "completed: the source's system does not answer; a later completed checkpoint tells it"
    ]
    assert [line for line in lines if "was told again" in line] == [
        f"sparkpoint away: source events was told again (checkpoint {told[3]} completed)"
    ]


def _run_counts(base: Path, name: str, source: _AwaySource, fail_after: int | None) -> list[str]:
    """The committed output of a running count per key over ``source``."""
    options = job_options(name, base, name, epoch_records=50, fail_after=fail_after)
    env = StreamExecutionEnvironment(options)
    env.from_source(source, uid="events").key_by("app").count(uid="pv", output="pv").sink_to(
        FileSink(str(base / name / "out")), uid="sink"
    )
    result = JobDriver(env.graph, options, in_process=True).run()
    assert result.status is p.JobStatus.FINISHED
    assert len(result.restores) == (0 if fail_after is None else 1)
    return sorted(committed_lines(str(base / name / "out")))


def test_a_job_through_a_source_outage_and_a_restore_commits_exactly_once(
    tmp_path: Path,
) -> None:
    """The source's system goes away while the job runs (the planner's questions and two
    notifications go unanswered), and a task fails: the restored job commits exactly what a
    run without either commits."""
    records: tuple[Any, ...] = tuple({"app": f"a{i % 5}", "n": i} for i in range(400))
    expected = _run_counts(tmp_path, "clean", _AwaySource(records), None)
    assert len(expected) == 400
    away = _AwaySource(records, away=2, asked_from=3, asked_for=4)
    assert _run_counts(tmp_path, "away", away, fail_after=150) == expected
    assert len(away.asked) >= 7 and len(away.told) > 2  # the outage happened, and ended


def test_the_splits_that_do_not_answer_are_named_as_a_sentence_says_them() -> None:
    assert unanswered_text(["redis:a"]) == "redis:a does"
    assert unanswered_text(["redis:a", "redis:b"]) == "redis:a and redis:b do"
    assert unanswered_text(["a", "b", "c"]) == "a, b and c do"
    assert unanswered_text(["a", "b", "c", "d"]) == "a, b, c and d do"
    assert unanswered_text(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more splits do"
