"""The Redis transport against the real Redis at 127.0.0.1:6379: events out, commands in."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis
from redis._parsers.base import BaseParser as _RespParser

from sparkpoint import protocol as p
from sparkpoint.clock import ManualClock
from sparkpoint.errors import ConfigurationError
from sparkpoint.redis_retry import RETRY_WINDOW_ENV, retry_window_s
from sparkpoint.transport import (
    COMMANDS_GROUP,
    FIELD,
    CommandChannel,
    RedisEventSink,
    RedisUnreachableError,
    Streams,
    TransportError,
    default_redis_url,
    passing_refusal,
    redis_client,
    send_command,
    send_commands,
)

from ..support.own_redis import OwnRedis


def _heartbeat(epoch: int, job_id: str = "job-1", attempt: int = 1) -> p.Envelope:
    beat = p.Heartbeat(
        epoch=epoch,
        records=10 * epoch,
        duration_ms=2.5,
        records_per_second=4.0,
        source_lag=0,
        host_time=1_700_000_000_000 + epoch,
    )
    return p.envelope(job_id, attempt, 1_700_000_000_000 + epoch, beat)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_published_events_arrive_in_order_and_decode_to_the_same_envelopes(
    client: redis.Redis, streams: Streams
) -> None:
    sent = [_heartbeat(1), _heartbeat(2), _heartbeat(3)]

    RedisEventSink(client, streams).publish(sent)

    entries = client.xrange(streams.events)
    assert [fields.keys() for _, fields in entries] == [{FIELD}] * 3
    assert [p.decode(fields[FIELD])[0] for _, fields in entries] == sent


def test_an_event_above_the_size_limit_is_refused_and_nothing_of_its_batch_is_published(
    client: redis.Redis, streams: Streams
) -> None:
    small = _heartbeat(1)
    big = p.envelope("job-1", 1, 5, p.TaskFailed(epoch=2, cause="x" * 500))
    sink = RedisEventSink(client, streams, max_bytes=400)

    with pytest.raises(p.ProtocolError, match=r"task_failed message of job job-1 is .* 400-byte"):
        sink.publish([small, big])

    assert client.xlen(streams.events) == 0


def test_commands_are_read_in_order_and_stay_pending_until_acknowledged(
    client: redis.Redis, streams: Streams
) -> None:
    channel = CommandChannel(client, "job-1", "driver-a", streams)
    channel.open()
    trigger = p.TriggerCheckpoint(checkpoint_id=7, trigger_timestamp=11, target_directory="/c")
    first = send_command(client, streams, "job-1", 2, 100, trigger)
    second, third = send_commands(
        client,
        streams,
        [
            p.envelope("job-1", 2, 101, p.NotifyCheckpointComplete(checkpoint_id=7)),
            p.envelope("job-2", 1, 102, p.CancelJob(cause="other job")),
        ],
    )

    received = channel.read()

    assert [m.entry_id for m in received] == [first, second]
    assert received[0].payload == trigger
    assert received[0].envelope.attempt == 2
    assert received[1].payload == p.NotifyCheckpointComplete(checkpoint_id=7)
    assert client.xrange(streams.commands("job-2"))[0][0].decode() == third
    assert client.xpending(streams.commands("job-1"), COMMANDS_GROUP)["pending"] == 2
    channel.ack([first, second])
    assert client.xpending(streams.commands("job-1"), COMMANDS_GROUP)["pending"] == 0
    assert channel.read(block_ms=20) == []


def test_malformed_commands_are_acknowledged_counted_and_skipped(
    client: redis.Redis, streams: Streams
) -> None:
    channel = CommandChannel(client, "job-1", "driver-a", streams)
    channel.open()
    stream = streams.commands("job-1")
    client.xadd(stream, {FIELD: b"{not json"})
    client.xadd(stream, {b"other": b"1"})
    client.xadd(stream, {FIELD: b'{"type":"explode","job_id":"job-1","attempt":1,'})
    unknown = p.envelope("job-1", 1, 5, p.CancelJob()).model_copy(update={"type": "explode"})
    client.xadd(stream, {FIELD: p.encode(unknown)})
    invalid = p.envelope("job-1", 1, 5, p.NotifyCheckpointComplete(checkpoint_id=1))
    invalid = invalid.model_copy(update={"payload": {"checkpoint_id": 0}})
    client.xadd(stream, {FIELD: p.encode(invalid)})
    client.xadd(stream, {FIELD: p.encode(_heartbeat(1))})  # an event, not a command
    good = send_command(client, streams, "job-1", 1, 6, p.CancelJob(cause="user"))

    received = channel.read()

    assert [(m.entry_id, m.payload) for m in received] == [(good, p.CancelJob(cause="user"))]
    assert channel.malformed == 6
    pending = client.xpending_range(stream, COMMANDS_GROUP, "-", "+", 10)
    assert [entry["message_id"].decode() for entry in pending] == [good]


def test_open_skips_commands_meant_for_an_earlier_driver_process(
    client: redis.Redis, streams: Streams
) -> None:
    send_command(client, streams, "job-1", 1, 1, p.NotifyCheckpointComplete(checkpoint_id=1))
    first = CommandChannel(client, "job-1", "driver-a", streams)
    first.open()  # creates the group after the existing command
    assert first.read() == []
    send_command(client, streams, "job-1", 1, 2, p.NotifyCheckpointComplete(checkpoint_id=2))
    # driver-a dies before reading; its successor opens the same stream.
    second = CommandChannel(client, "job-1", "driver-b", streams)
    second.open()
    assert second.read() == []
    new = send_command(client, streams, "job-1", 2, 3, p.CancelJob())

    assert [m.entry_id for m in second.read()] == [new]


def _unreachable_sink(streams: Streams, port: int) -> tuple[RedisEventSink, list[float]]:
    """A sink to a closed port, on a manual clock that its waits (returned) advance."""
    clock = ManualClock()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(seconds * 1000)

    client = redis_client(f"redis://127.0.0.1:{port}/0")
    return RedisEventSink(client, streams, clock=clock, sleep=sleep), waits


def test_a_publish_retries_with_backoff_then_names_the_url_and_stream(streams: Streams) -> None:
    port = _closed_port()
    sink, waits = _unreachable_sink(streams, port)

    with pytest.raises(TransportError) as caught:
        sink.publish([_heartbeat(1)])

    message = str(caught.value)
    assert f"redis://127.0.0.1:{port}/0" in message
    assert streams.events in message
    assert waits[:5] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert max(waits) == 2.0
    assert sum(waits) == pytest.approx(30.0)


def test_the_retry_window_is_set_by_the_environment(
    streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SPARKPOINT_REDIS_RETRY_WINDOW``: a Redis whose failover takes longer than 30 s is
    waited out by setting it higher (here lower, to keep the test short)."""
    monkeypatch.setenv(RETRY_WINDOW_ENV, "4.5")
    sink, waits = _unreachable_sink(streams, _closed_port())
    with pytest.raises(RedisUnreachableError, match=r"over 4\.5 s"):
        sink.publish([_heartbeat(1)])
    assert sum(waits) == pytest.approx(4.5)


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "inf", "nan"])
def test_a_malformed_retry_window_is_a_configuration_error_naming_it(raw: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{RETRY_WINDOW_ENV} must be .* got '{raw}'"):
        retry_window_s({RETRY_WINDOW_ENV: raw})
    assert retry_window_s({}) == retry_window_s({RETRY_WINDOW_ENV: " "}) == 30.0


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "redis://127.0.0.1:port/0", "x"])
def test_a_malformed_url_is_a_configuration_error_naming_it(url: str) -> None:
    with pytest.raises(ConfigurationError, match=f"invalid Redis URL '{url}'"):
        redis_client(url)


def test_default_redis_url_prefers_the_environment_then_the_url_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("SPARKPOINT_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_redis_url() is None

    default_dir = tmp_path / ".sparkpoint" / "server"
    default_dir.mkdir(parents=True)
    (default_dir / "redis.url").write_text("redis://127.0.0.1:7001/0\n")
    assert default_redis_url() == "redis://127.0.0.1:7001/0"

    env_dir = tmp_path / "env-dir"
    env_dir.mkdir()
    (env_dir / "redis.url").write_text("redis://127.0.0.1:7002/0\n")
    monkeypatch.setenv("SPARKPOINT_DATA_DIR", str(env_dir))
    assert default_redis_url() == "redis://127.0.0.1:7002/0"

    arg_dir = tmp_path / "arg-dir"
    arg_dir.mkdir()
    assert default_redis_url(str(arg_dir)) is None  # the argument wins, and has no file
    (arg_dir / "redis.url").write_text("redis://127.0.0.1:7003/0")
    assert default_redis_url(str(arg_dir)) == "redis://127.0.0.1:7003/0"

    monkeypatch.setenv("REDIS_URL", "redis://redis.example:6380/2")
    assert default_redis_url(str(arg_dir)) == "redis://redis.example:6380/2"


@pytest.fixture
def refusing_redis(own_redis: OwnRedis) -> OwnRedis:
    """A Redis of the test's own that refuses writes with ``MISCONF`` (a failing disk)."""
    own_redis.refuse_writes()
    return own_redis


def test_a_publish_waits_out_redis_refusing_writes_while_its_disk_fails(
    refusing_redis: OwnRedis, streams: Streams
) -> None:
    clock = ManualClock()
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the disk is freed during the third wait
        waits.append(seconds)
        clock.advance(seconds * 1000)
        if len(waits) == 3:
            refusing_redis.accept_writes()

    with refusing_redis.client() as client:
        RedisEventSink(client, streams, clock=clock, sleep=sleep).publish([_heartbeat(1)])
        assert client.xlen(streams.events) == 1
    assert waits == pytest.approx([0.1, 0.2, 0.4])


def test_a_refusal_that_outlasts_the_retries_ends_as_redis_unavailable(
    refusing_redis: OwnRedis, streams: Streams
) -> None:
    clock = ManualClock()

    def sleep(seconds: float) -> None:
        clock.advance(seconds * 1000)

    with refusing_redis.client() as client:
        sink = RedisEventSink(client, streams, clock=clock, sleep=sleep)
        with pytest.raises(RedisUnreachableError) as caught:
            sink.publish([_heartbeat(1)])
    assert f"Redis at {refusing_redis.url} refusing after " in str(caught.value)
    assert "over 30 s: " in str(caught.value)
    assert "MISCONF" in str(caught.value)


def test_a_wrong_password_is_not_retried(own_redis: OwnRedis, streams: Streams) -> None:
    with own_redis.client() as client:
        client.config_set("requirepass", "the-right-one")
    waits: list[float] = []
    wrong = redis_client(f"redis://:a-wrong-one@127.0.0.1:{own_redis.port}/0")
    sink = RedisEventSink(wrong, streams, sleep=waits.append)

    with pytest.raises(TransportError, match=r"refused: invalid username-password pair") as caught:
        sink.publish([_heartbeat(1)])

    assert not isinstance(caught.value, RedisUnreachableError)
    assert waits == []


def test_a_refusal_of_the_request_itself_is_not_retried(
    client: redis.Redis, streams: Streams
) -> None:
    client.set(streams.events, "not a stream")  # XADD to it: WRONGTYPE, whenever retried
    waits: list[float] = []
    sink = RedisEventSink(client, streams, sleep=waits.append)

    with pytest.raises(TransportError, match=r"refused: .* WRONGTYPE") as caught:
        sink.publish([_heartbeat(1)])

    assert not isinstance(caught.value, RedisUnreachableError)
    assert waits == []


@pytest.mark.parametrize(
    ("reply", "passes"),
    [
        ("MISCONF Errors writing to the AOF file: No space left on device", True),
        ("READONLY You can't write against a read only replica.", True),
        ("OOM command not allowed when used memory > 'maxmemory'.", True),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", True),
        ("NOREPLICAS Not enough good replicas to write.", True),
        ("ERR Error running script (call to f_1): @user_script:2: -MISCONF Redis is ...", True),
        ("NOPERM this user has no permissions to run the 'xadd' command", False),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", False),
        ("ERR unknown command 'XAUTOCLAIM'", False),
        ("ERR invalid stream ID for job OOM in XADD", False),
    ],
)
def test_which_refusals_pass_by_themselves(reply: str, passes: bool) -> None:
    err = _RespParser.parse_error(reply)  # as redis-py raises it: some codes become classes
    assert passing_refusal(err) is passes
    wrapped = type(err)(f"Command # 1 (XADD s * m x) of pipeline caused error: {err}")
    assert passing_refusal(wrapped) is passes
