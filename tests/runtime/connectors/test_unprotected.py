"""RedisListSource (pops, counts what it popped) and AppendFileSink (appends at once), on a
real Redis and a real directory; their failure behaviour on Spark is in
``tests/runtime/test_consistency_table_spark.py``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sparkpoint.connectors.sinks import WriterContext
from sparkpoint.connectors.unprotected import AppendFileSink, RedisListSource
from sparkpoint.errors import ConfigurationError
from sparkpoint.records import Batch

from ...support.redis_server import REDIS_URL


@pytest.fixture
def key() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    name = f"unprotected-{uuid.uuid4().hex}"
    yield name
    client.delete(name, f"{name}:sparkpoint:popped")
    client.close()


def test_reads_pop_in_order_and_available_counts_popped_and_queued(key: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    client.rpush(key, json.dumps({"n": 0}), json.dumps({"n": 1}), "plain text")
    source = RedisListSource(REDIS_URL, [key])
    assert source.split_ids() == [f"redis-list:{key}"]
    assert source.total(0) is None and not source.resettable
    assert source.available(0, 0.0) == 3
    assert source.read(0, 0, 2).rows == [{"n": 0}, {"n": 1}]
    assert client.llen(key) == 1
    # Asked for more than is queued: it pops what is there and does not wait.
    assert source.read(0, 2, 5).rows == ["plain text"]
    assert source.read(0, 5, 6).rows == []
    assert source.available(0, 0.0) == 3  # three popped, none queued
    client.rpush(key, "later")
    assert source.available(0, 0.0) == 4
    # Read "again" from an old offset: a popped entry is gone, the next one comes.
    assert source.read(0, 0, 1).rows == ["later"]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("", ["k"]), {}, "needs the URL"),
        ((REDIS_URL, "k"), {}, "list of one or more"),
        ((REDIS_URL, ["k", "k"]), {}, "repeat a key"),
        ((REDIS_URL, ["k"]), {"count": -1}, "count must be >= 0"),
    ],
)
def test_bad_configuration_is_named(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RedisListSource(*args, **kwargs)


def test_the_sink_appends_at_once_and_each_barrier_reports_what_it_covers(tmp_path: Path) -> None:
    sink = AppendFileSink(str(tmp_path / "out"))
    assert sink.delivery == "none"
    ctx = WriterContext(job_id="j", uid="out", subtask=1, attempt=1, epoch=1, task_attempt=0)
    writer = sink.writer(ctx, None)
    writer.write(Batch.of_rows([{"a": 1}, {"a": 2}]))
    first = writer.pre_commit(1)
    assert (first.records, first.parts) == (2, [])
    writer.write(Batch.of_rows([{"a": 3}]))
    carried = writer.close_epoch()  # the next epoch continues what the next barrier covers
    writer = sink.writer(ctx, carried)
    writer.write(Batch.of_rows([{"a": 4}]))
    assert writer.pre_commit(2).records == 2
    writer.close_epoch()
    lines = (tmp_path / "out" / "out-1.jsonl").read_text().splitlines()
    assert [json.loads(x)["a"] for x in lines] == [1, 2, 3, 4]
    # A replay appends again: nothing to commit, nothing to take back.
    assert sink.commit("out", first) == 0
    assert sink.abort_uncommitted("j", "out", set()) == 0
    with pytest.raises(ConfigurationError, match="needs a directory"):
        AppendFileSink("")
