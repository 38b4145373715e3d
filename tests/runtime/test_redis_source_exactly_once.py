"""Exactly-once from a Redis stream: Redis source -> key_by -> count -> FileSink on Spark.

Every run's committed output must equal a failure-free run's and what a plain-Python count of
the stream says (pv 1..n for a user with n entries). The consumer group must never be ahead of
the latest completed checkpoint, and a new driver that resumes from a checkpoint reads the
entries added meanwhile exactly once.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from sparkpoint import protocol as p
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.redis_source import (
    EntryId,
    RedisStreamSource,
    format_entry_id,
    parse_entry_id,
)
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.events import EventSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import JobStatus
from sparkpoint.runtime.driver import JobDriver, JobFailedError, JobResult
from sparkpoint.testing import FailureInjection, line_counts, uncommitted_files
from sparkpoint.transport import Streams

from ..support.redis_server import REDIS_URL

pytestmark = pytest.mark.spark

USERS = 7
ENTRIES = 3_000
EPOCH_RECORDS = 250  # per split: about six epochs, a checkpoint in each


def add(client: redis.Redis, stream: str, n: int, first: int = 0) -> None:
    pipe = client.pipeline()
    for i in range(first, first + n):
        pipe.xadd(stream, {"user": f"u{(i * 7919) % USERS}", "n": str(i)})
    pipe.execute()


def oracle(client: redis.Redis, streams: Sequence[str]) -> Counter[str]:
    """What the job must commit, counted in plain Python from the streams themselves."""
    users: Counter[str] = Counter()
    for stream in streams:
        for _, fields in cast("list[tuple[bytes, dict[bytes, bytes]]]", client.xrange(stream)):
            users[fields[b"user"].decode()] += 1
    return Counter(
        json.dumps({"user": user, "pv": k}) for user, n in users.items() for k in range(1, n + 1)
    )


class GroupWatch(EventSink):
    """Records, with every event the driver publishes, where the consumer group stands."""

    def __init__(self, client: redis.Redis, streams: Sequence[str], group: str) -> None:
        self.client, self.streams, self.group = client, streams, group
        self.seen: list[tuple[p.Envelope, dict[str, EntryId]]] = []

    def publish(self, events: Sequence[p.Envelope]) -> None:
        for envelope in events:
            self.seen.append((envelope, {s: self.last_delivered(s) for s in self.streams}))

    def last_delivered(self, stream: str) -> EntryId:
        for info in cast("list[dict[str, Any]]", self.client.xinfo_groups(stream)):
            if info["name"].decode() == self.group:
                return parse_entry_id(info["last-delivered-id"].decode(), "id")
        return (0, 0)


def run_job(
    spark: Any,
    base: Path,
    name: str,
    source: RedisStreamSource,
    out: str,
    *,
    failure: FailureInjection | None = None,
    restart: str = "fixed-delay",
    from_checkpoint: str | None = None,
    watch: GroupWatch | None = None,
) -> JobResult:
    options = JobOptions(
        job_id=f"redis-{name}",
        checkpoint=CheckpointConfig(mode=p.CheckpointingMode.EXACTLY_ONCE, interval_ms=1),
        checkpoint_dir=f"file://{base / name / 'chk'}",
        local_dir=str(base / name / "local"),
        parallelism=2,
        max_epoch_records=EPOCH_RECORDS,
        min_epoch_records=EPOCH_RECORDS,
        restart_strategy={
            "restart-strategy.type": restart,
            "restart-strategy.fixed-delay.attempts": "2",
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
        from_checkpoint=from_checkpoint,
    )
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(source, uid="events")
        .key_by("user")
        .count(uid="pv", output="pv")
        .sink_to(FileSink(out), uid="sink")
    )
    env.graph.name = "redis-pv"
    return JobDriver(env.graph, options, spark=spark, events=watch, failure=failure).run()


def fail_mid_way(
    spark: Any, base: Path, source: RedisStreamSource, out: str, watch: GroupWatch
) -> None:
    """Run 1 of ``source`` (job ``redis-first``) fails for good (no restart) in its third
    epoch, after some checkpoints completed."""
    with pytest.raises(JobFailedError, match="injected failure"):
        run_job(
            spark,
            base,
            "first",
            source,
            out,
            restart="none",
            failure=FailureInjection("keyed", subtask=0, records=20, at_epoch=3),
            watch=watch,
        )


@pytest.fixture(scope="module")
def one_stream(spark: Any) -> Iterator[tuple[str, redis.Redis]]:
    """A bounded stream of ENTRIES entries (its last id is the bound), deleted afterwards."""
    client = redis.Redis.from_url(REDIS_URL)
    stream = f"redis-source-eo-{uuid.uuid4().hex}:events"
    add(client, stream, ENTRIES)
    yield stream, client
    for key in client.scan_iter(match=f"{stream}*"):
        client.delete(key)
    client.close()


def source_of(stream: str, client: redis.Redis, group: str) -> RedisStreamSource:
    ((last_id, _),) = cast("list[tuple[bytes, Any]]", client.xrevrange(stream, count=1))
    return RedisStreamSource(
        REDIS_URL, [stream], group=group, splits_per_stream=2, until_id=last_id.decode()
    )


@pytest.fixture(scope="module")
def baseline(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, one_stream: tuple[str, redis.Redis]
) -> Counter[str]:
    stream, client = one_stream
    out = str(tmp_path_factory.mktemp("baseline") / "out")
    result = run_job(spark, Path(out).parent, "baseline", source_of(stream, client, "base"), out)
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    assert len(result.completed_checkpoints) >= 4
    return line_counts(out)


def test_failure_free_run_commits_the_plain_python_count(
    baseline: Counter[str], one_stream: tuple[str, redis.Redis]
) -> None:
    stream, client = one_stream
    assert baseline == oracle(client, [stream])
    assert sum(baseline.values()) == ENTRIES


def completed_positions(watch: GroupWatch) -> dict[int, dict[str, int]]:
    """Each completed checkpoint's positions, from the barriers the source tasks injected."""
    barriers: dict[int, dict[str, int]] = {}
    completed: dict[int, dict[str, int]] = {}
    for envelope, _ in watch.seen:
        if envelope.type == "barrier_injected":
            cp = envelope.payload["checkpoint_id"]
            barriers.setdefault(cp, {})[envelope.payload["split_id"]] = envelope.payload["offset"]
        elif envelope.type == "checkpoint_completed":
            cp = envelope.payload["checkpoint_id"]
            completed[cp] = barriers[cp]
    return completed


def assert_group_never_ahead(watch: GroupWatch, source: RedisStreamSource) -> None:
    """At every event, the group stands at most at the latest completed checkpoint's ids."""
    positions = completed_positions(watch)
    split_ids = source.split_ids()
    covered = (0, 0)
    moved = False
    (stream,) = source.streams
    for envelope, where in watch.seen:
        if envelope.type == "checkpoint_completed":
            at = positions[envelope.payload["checkpoint_id"]]
            ids = [
                source.covered_through(i, source.entry_id_at(i, offset))
                for i, offset in ((split_ids.index(s), offset) for s, offset in at.items())
            ]
            covered = max(covered, min(ids))
        assert where[stream] <= covered, f"group ahead of the checkpoints at {envelope.type}"
        moved = moved or where[stream] > (0, 0)
    assert moved


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(FailureInjection("keyed", subtask=1, records=20, at_epoch=3), id="mid-epoch"),
        pytest.param(
            FailureInjection("before_commit", checkpoint_id=3),
            id="checkpoint-completed-before-commit",
        ),
    ],
)
def test_exactly_once_after_failure_and_the_group_follows_completed_checkpoints(
    spark: Any,
    tmp_path: Path,
    baseline: Counter[str],
    one_stream: tuple[str, redis.Redis],
    failure: FailureInjection,
) -> None:
    stream, client = one_stream
    group = f"failed-{failure.where}"
    source = source_of(stream, client, group)
    watch = GroupWatch(client, [stream], group)
    out = str(tmp_path / "out")
    result = run_job(spark, tmp_path, "failed", source, out, failure=failure, watch=watch)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2 and len(result.restores) == 1
    assert line_counts(out) == baseline == oracle(client, [stream])
    assert uncommitted_files(out) == []
    assert_group_never_ahead(watch, source)
    # The final checkpoint covers the whole stream: the group stands at its last entry.
    ((last_id, _),) = cast("list[tuple[bytes, Any]]", client.xrevrange(stream, count=1))
    assert format_entry_id(watch.last_delivered(stream)) == last_id.decode()


def test_a_new_driver_resumes_from_the_checkpointed_ids_and_reads_new_entries_once(
    spark: Any, tmp_path: Path, streams: Streams, client: redis.Redis
) -> None:
    keys = [f"{streams.prefix}:a", f"{streams.prefix}:b"]
    for k, key in enumerate(keys):
        add(client, key, 1_200, first=k * 100_000)
    last = max(
        parse_entry_id(cast("list[Any]", client.xrevrange(k, count=1))[0][0].decode(), "id")
        for k in keys
    )
    until = format_entry_id((last[0] + 60_000, 0))  # not in the streams yet: unbounded for now

    def source() -> RedisStreamSource:
        return RedisStreamSource(REDIS_URL, keys, group="resume", until_id=until)

    out = str(tmp_path / "out")
    # Run 1 fails for good (no restart) mid-way, after some checkpoints completed.
    watch = GroupWatch(client, keys, "resume")
    fail_mid_way(spark, tmp_path, source(), out, watch)
    positions = completed_positions(watch)
    latest = max(positions)
    read_before = sum(positions[latest].values())
    assert 0 < read_before < 2_400
    acknowledged = {k: watch.last_delivered(k) for k in keys}
    # Meanwhile the streams grow, and reach the bound.
    for k, key in enumerate(keys):
        add(client, key, 300, first=k * 100_000 + 1_200)
        client.xadd(key, {"user": "u0", "n": "end"}, id=until)
    # Run 2: a new driver and a new source object, restored from the checkpoint's path.
    chk = tmp_path / "first" / "chk" / "redis-first" / f"chk-{latest}"
    resumed = source()
    result = run_job(spark, tmp_path, "second", resumed, out, from_checkpoint=f"file://{chk}")
    assert result.status is JobStatus.FINISHED
    assert result.restores == [latest]
    assert result.records == 2 * 1_501 - read_before  # every entry after the checkpoint, once
    assert line_counts(out) == oracle(client, keys)
    for key in keys:
        assert watch.last_delivered(key) > acknowledged[key]
        ((last_id, _),) = cast("list[tuple[bytes, Any]]", client.xrevrange(key, count=1))
        assert format_entry_id(watch.last_delivered(key)) == last_id.decode()


@pytest.mark.parametrize(
    ("damage", "refusal"),
    [
        # Trimmed 50 entries past what the checkpoint covers: they were never read.
        ("trim", "left the stream before the job read it"),
        # Redis restarted without persistence: stream and anchors gone, a new stream written.
        ("lost", "Redis holds no anchor of it at or past that offset"),
    ],
)
def test_a_restore_past_entries_the_stream_lost_fails_and_commits_nothing_more(
    spark: Any, tmp_path: Path, streams: Streams, client: redis.Redis, damage: str, refusal: str
) -> None:
    key = f"{streams.prefix}:events"
    add(client, key, 1_200)
    ids = [entry_id.decode() for entry_id, _ in cast("list[Any]", client.xrange(key))]

    def source() -> RedisStreamSource:
        return RedisStreamSource(REDIS_URL, [key], group="damaged")

    out = str(tmp_path / "out")
    watch = GroupWatch(client, [key], "damaged")
    fail_mid_way(spark, tmp_path, source(), out, watch)
    latest = max(completed_positions(watch))
    committed = line_counts(out)
    acknowledged = format_entry_id(watch.last_delivered(key))
    assert committed and acknowledged in ids[:-100]
    if damage == "trim":
        client.xtrim(key, minid=ids[ids.index(acknowledged) + 51], approximate=False)
    else:
        client.delete(*client.scan_iter(match=f"{key}*"))
        add(client, key, 1_200)
    chk = tmp_path / "first" / "chk" / "redis-first" / f"chk-{latest}"
    with pytest.raises(JobFailedError, match=refusal):
        run_job(
            spark,
            tmp_path,
            "second",
            source(),
            out,
            restart="none",
            from_checkpoint=f"file://{chk}",
            watch=watch,
        )
    assert line_counts(out) == committed  # no output without the entries the stream lost
    if damage == "trim":
        assert format_entry_id(watch.last_delivered(key)) == acknowledged
