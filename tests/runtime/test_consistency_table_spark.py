"""The weak cells of the seeds' consistency table, run on Spark with a failure.

A resettable source into a sink without replay protection (:class:`AppendFileSink`) is
at-least-once: after a failure nothing is lost and the replayed records are written twice. A
source that cannot replay (:class:`RedisListSource`) is at-most-once even into a
two-phase-commit sink: nothing is committed twice and the entries that the failed epoch popped
are lost. Both against a failure-free run of the same job; the exactly-once cells have their
own tests (``test_exactly_once.py``, ``test_redis_source_exactly_once.py``, the sinks' tests).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sparkpoint.connectors.sinks import FileSink, TwoPhaseCommitSink
from sparkpoint.connectors.sources import GeneratorSource, Source
from sparkpoint.connectors.unprotected import AppendFileSink, RedisListSource
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.guarantees import end_to_end
from sparkpoint.protocol import JobStatus
from sparkpoint.runtime.driver import JobDriver, JobResult
from sparkpoint.testing import FailureInjection, line_counts

from ..support.redis_server import REDIS_URL
from .pv_harness import job_options

pytestmark = pytest.mark.spark

EVENTS = 2_000
EPOCH_RECORDS = 200  # per split: about five epochs, a checkpoint in each
USERS = 5


def run_job(
    spark: Any,
    base: Path,
    name: str,
    source: Source,
    sink: TwoPhaseCommitSink,
    key: str,
    failure: FailureInjection | None = None,
) -> JobResult:
    job_id = f"table-{name}-{uuid.uuid4().hex[:6]}"
    options = job_options(job_id, base, name, epoch_records=EPOCH_RECORDS)
    env = StreamExecutionEnvironment(options)
    env.from_source(source, uid="events").key_by(key).count(uid="pv", output="pv").sink_to(
        sink, uid="out"
    )
    env.graph.name = f"table-{name}"
    return JobDriver(env.graph, options, spark=spark, failure=failure).run()


def appended_lines(directory: Path) -> Counter[str]:
    return Counter(
        line for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()
    )


MID_EPOCH = FailureInjection("keyed", subtask=1, records=20, at_epoch=3)


# ----------------------------------------------------------------- resettable -> no protection
def test_a_sink_without_protection_writes_replayed_records_twice_and_loses_none(
    spark: Any, tmp_path: Path
) -> None:
    source = GeneratorSource(events=EVENTS, apps=USERS, rate=0, splits=2)
    sink = AppendFileSink(str(tmp_path / "clean-out"))
    assert end_to_end({"events": source}, {"out": sink}).level == "at_least_once"
    clean = run_job(spark, tmp_path, "clean", source, sink, "app_id")
    assert clean.status is JobStatus.FINISHED and clean.restores == []
    expected = appended_lines(tmp_path / "clean-out")
    assert sum(expected.values()) == EVENTS and max(expected.values()) == 1

    failed_sink = AppendFileSink(str(tmp_path / "failed-out"))
    failed = run_job(spark, tmp_path, "failed", source, failed_sink, "app_id", MID_EPOCH)
    assert failed.status is JobStatus.FINISHED and len(failed.restores) == 1
    written = appended_lines(tmp_path / "failed-out")
    assert expected - written == Counter()  # nothing lost
    duplicates = written - expected
    assert duplicates, "the replay after the restore wrote nothing again"
    assert set(duplicates) <= set(expected)  # only the same records, again
    assert max(written.values()) == 2


# ----------------------------------------------------------------- not resettable -> 2PC
@pytest.fixture
def queue() -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(REDIS_URL)
    key = f"table-queue-{uuid.uuid4().hex}"
    yield client, key
    client.delete(key, f"{key}:sparkpoint:popped")
    client.close()


def fill(client: redis.Redis, key: str) -> None:
    client.delete(key, f"{key}:sparkpoint:popped")
    client.rpush(key, *(json.dumps({"user": f"u{i % USERS}", "n": i}) for i in range(EVENTS)))


def per_user_counts(out: Counter[str]) -> dict[str, list[int]]:
    counts: dict[str, list[int]] = {}
    for line in out.elements():
        record = json.loads(line)
        counts.setdefault(record["user"], []).append(record["pv"])
    return {user: sorted(values) for user, values in counts.items()}


def test_a_source_that_cannot_replay_loses_the_failed_epochs_entries_and_duplicates_none(
    spark: Any, tmp_path: Path, queue: tuple[redis.Redis, str]
) -> None:
    client, key = queue
    source = RedisListSource(REDIS_URL, [key], count=EVENTS)
    sink = FileSink(str(tmp_path / "clean-out"))
    guarantee = end_to_end({"events": source}, {"out": sink})
    assert guarantee.level == "at_most_once"

    fill(client, key)
    clean = run_job(spark, tmp_path, "clean", source, sink, "user")
    assert clean.status is JobStatus.FINISHED and clean.restores == []
    assert client.llen(key) == 0
    expected = per_user_counts(line_counts(str(tmp_path / "clean-out")))
    assert {u: len(v) for u, v in expected.items()} == {f"u{i}": EVENTS // USERS for i in range(5)}

    fill(client, key)
    failed = run_job(
        spark,
        tmp_path,
        "failed",
        source,
        FileSink(str(tmp_path / "failed-out")),
        "user",
        MID_EPOCH,
    )
    assert failed.status is JobStatus.FINISHED and len(failed.restores) == 1
    assert client.llen(key) == 0  # the job read the whole queue
    committed = line_counts(str(tmp_path / "failed-out"))
    assert max(committed.values()) == 1  # nothing twice: the sink is two-phase-commit
    counts = per_user_counts(committed)
    # Each user's running count goes 1, 2, ... without a gap or a repeat (the state is
    # exactly-once), but ends lower: the entries popped after the restored checkpoint's
    # barrier (the rest of its epoch, and the failed epoch) are gone.
    assert all(v == list(range(1, len(v) + 1)) for v in counts.values()), counts
    lost = EVENTS - sum(len(v) for v in counts.values())
    assert 0 < lost <= 2 * EPOCH_RECORDS, lost
