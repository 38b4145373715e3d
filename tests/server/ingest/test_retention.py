"""What leaves Redis, against the real Redis: acknowledged events and commands, dead letters
beyond the cap, the command streams of ended jobs; never an unacknowledged entry."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint import protocol as p
from sparkpoint.clock import ManualClock
from sparkpoint.stream_retention import trim_acknowledged
from sparkpoint.transport import (
    COMMANDS_GROUP,
    EVENTS_GROUP,
    FIELD,
    CommandChannel,
    ReceivedMessage,
    RedisEventSink,
    Streams,
    send_command,
)
from sparkpoint_server.ingest import command_streams
from sparkpoint_server.ingest.command_streams import CommandStreamRetention, ended_jobs_in
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats
from sparkpoint_server.storage.models import Job

GRACE_MS = 60_000


def _ids(client: redis.Redis, stream: str) -> list[bytes]:
    return [entry_id for entry_id, _ in client.xrange(stream)]


def _fill(client: redis.Redis, stream: str, n: int) -> list[bytes]:
    return [client.xadd(stream, {FIELD: str(i).encode()}) for i in range(n)]


def _read(client: redis.Redis, stream: str, group: str, count: int) -> list[bytes]:
    answer = client.xreadgroup(group, "reader", {stream: ">"}, count=count)
    return [entry_id for entry_id, _ in answer[0][1]] if answer else []


# ----------------------------------------------------------------------------- trimming


def test_trimming_keeps_every_entry_pending_or_not_yet_read(
    client: redis.Redis, streams: Streams
) -> None:
    stream = streams.events
    ids = _fill(client, stream, 6)
    client.xgroup_create(stream, "g", id="0")
    assert _read(client, stream, "g", 4) == ids[:4]
    client.xack(stream, "g", ids[0], ids[2])  # ids[1] and ids[3] still pending

    assert trim_acknowledged(client, stream) == 1
    assert _ids(client, stream) == ids[1:]  # ids[2] is acknowledged but after a pending one

    client.xack(stream, "g", ids[1], ids[3])
    assert trim_acknowledged(client, stream) == 3
    assert _ids(client, stream) == ids[4:]  # delivered to nobody yet


def test_trimming_waits_for_the_slowest_group_and_leaves_a_stream_nobody_reads(
    client: redis.Redis, streams: Streams
) -> None:
    stream = streams.events
    ids = _fill(client, stream, 3)
    assert trim_acknowledged(client, stream) == 0  # no group: nothing is known to be read
    client.xgroup_create(stream, "fast", id="0")
    client.xgroup_create(stream, "slow", id="0")
    client.xack(stream, "fast", *_read(client, stream, "fast", 3))
    client.xack(stream, "slow", *_read(client, stream, "slow", 1))

    assert trim_acknowledged(client, stream) == 1
    assert _ids(client, stream) == ids[1:]


def test_the_consumer_trims_what_it_acknowledged_and_keeps_what_is_pending(
    client: redis.Redis, streams: Streams
) -> None:
    beat = p.Heartbeat(
        epoch=1, records=1, duration_ms=1.0, records_per_second=1.0, source_lag=0, host_time=0
    )
    sink = RedisEventSink(client, streams)
    sink.publish([p.envelope("job-1", 1, 1, beat)] * 5)
    calls: list[int] = []

    def crash_on_second_batch(batch: list[ReceivedMessage]) -> None:
        calls.append(len(batch))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies: nothing acknowledged

    stats = IngestStats()
    consumer = EventConsumer(
        client, crash_on_second_batch, stats, streams=streams, block_ms=0, trim_interval_ms=0
    )
    consumer.ensure_group()
    assert consumer.poll_once() == 5
    assert client.xlen(streams.events) == 0
    assert stats.events_trimmed == 5

    sink.publish([p.envelope("job-1", 1, 1, beat)])
    with pytest.raises(KeyboardInterrupt):
        consumer.poll_once()
    assert trim_acknowledged(client, streams.events) == 0
    assert client.xlen(streams.events) == 1  # pending: read again after the restart
    assert int(client.xpending(streams.events, EVENTS_GROUP)["pending"]) == 1


def test_the_dead_letter_stream_keeps_about_its_cap(client: redis.Redis, streams: Streams) -> None:
    for _ in range(10):
        pipe = client.pipeline(transaction=False)
        for _ in range(300):
            pipe.xadd(streams.events, {FIELD: b"{not json"})
        pipe.execute()
    stats = IngestStats()
    consumer = EventConsumer(
        client,
        lambda batch: None,
        stats,
        streams=streams,
        block_ms=0,
        dead_letter_maxlen=500,
        trim_interval_ms=0,
    )
    consumer.ensure_group()
    while consumer.poll_once():
        pass

    assert stats.dead_letters == 3000
    assert 500 <= client.xlen(streams.dead_letters) < 1000  # Redis trims whole nodes of 100
    assert client.xlen(streams.events) == 0


# ----------------------------------------------------------------------------- commands


def _command(client: redis.Redis, streams: Streams, job_id: str) -> str:
    return send_command(client, streams, job_id, 1, 1, p.CancelJob())


def test_a_driver_trims_the_commands_it_acknowledged(client: redis.Redis, streams: Streams) -> None:
    channel = CommandChannel(client, "job-1", "driver-1", streams)
    channel.open()
    first, second = _command(client, streams, "job-1"), _command(client, streams, "job-1")
    received = channel.read()
    assert [m.entry_id for m in received] == [first, second]

    channel.ack([first])
    assert _ids(client, channel.stream) == [second.encode()]
    channel.ack([second])
    assert client.xlen(channel.stream) == 0


def test_a_driver_whose_command_stream_was_deleted_reads_the_commands_sent_since(
    client: redis.Redis, streams: Streams
) -> None:
    channel = CommandChannel(client, "job-1", "driver-1", streams)
    channel.open()
    client.delete(channel.stream)  # the job had ended; it was registered again since
    resent = _command(client, streams, "job-1")

    assert channel.read() == []  # the group is re-created at the stream's start
    assert [m.entry_id for m in channel.read()] == [resent]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=int(time.time() * 1000))


def _retention(
    client: redis.Redis, streams: Streams, ended: set[str], clock: ManualClock
) -> CommandStreamRetention:
    def ended_jobs(job_ids: list[str]) -> set[str]:
        return ended & set(job_ids)

    return CommandStreamRetention(
        client, ended_jobs, streams=streams, grace_ms=GRACE_MS, clock=clock
    )


def _driver(client: redis.Redis, streams: Streams, job_id: str, *, obey: bool) -> None:
    """A driver that opened its channel, got a command, and obeyed it (or died first)."""
    channel = CommandChannel(client, job_id, "driver-1", streams)
    channel.open()
    _command(client, streams, job_id)
    if obey:
        channel.ack(m.entry_id for m in channel.read())


def test_an_ended_jobs_command_stream_is_deleted_once_its_driver_acknowledged_everything(
    client: redis.Redis, streams: Streams, clock: ManualClock
) -> None:
    _driver(client, streams, "done", obey=True)
    _driver(client, streams, "running", obey=True)
    _driver(client, streams, "unread", obey=False)  # its driver died before reading
    _command(client, streams, "no-driver")  # sent when no driver listened
    retention = _retention(client, streams, {"done", "unread", "no-driver"}, clock)

    assert retention.sweep() == ["done"]
    assert not client.exists(streams.commands("done"))
    for kept in ("running", "unread", "no-driver"):
        assert client.exists(streams.commands(kept))

    clock.advance(GRACE_MS + 1000)  # nobody read them in that time: nobody will
    assert retention.sweep() == ["no-driver", "unread"]
    assert client.exists(streams.commands("running"))


def test_a_command_added_while_checking_keeps_the_stream(
    client: redis.Redis, streams: Streams, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _driver(client, streams, "done", obey=True)
    real: Callable[..., object] = command_streams.consumption

    def resent_meanwhile(conn: redis.Redis, stream: str) -> object:
        state = real(conn, stream)
        _command(client, streams, "done")  # a restarted control plane re-sends
        return state

    monkeypatch.setattr(command_streams, "consumption", resent_meanwhile)

    assert _retention(client, streams, {"done"}, clock).sweep() == []
    assert client.xlen(streams.commands("done")) == 1
    assert client.xinfo_groups(streams.commands("done"))[0]["name"] == COMMANDS_GROUP.encode()


def test_ended_jobs_are_the_finished_canceled_and_failed_ones_in_the_database(
    sessions: sessionmaker[Session],
) -> None:
    statuses = {"a": "FINISHED", "b": "CANCELED", "c": "FAILED", "d": "RUNNING", "e": "CREATED"}
    with sessions() as session:
        for job_id, status in statuses.items():
            session.add(
                Job(
                    job_id=job_id, name=job_id, status=status, attempt=1, created_at=0,
                    updated_at=0, start_time=0, graph={}, config={}, checkpoint_config={},
                    restart_strategy={},
                )
            )  # fmt: skip
        session.commit()

    assert ended_jobs_in(sessions)([*statuses, "unknown"]) == {"a", "b", "c"}
