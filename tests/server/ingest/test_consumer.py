"""The event consumer against the real Redis at 127.0.0.1:6379: at-least-once, in order, and
bad events to the dead letters with a reason."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from unittest import mock

import pytest
import redis
from tests.support.waiting import wait_for

from sparkpoint import protocol as p
from sparkpoint.clock import ManualClock
from sparkpoint.transport import (
    EVENTS_GROUP,
    FIELD,
    ReceivedMessage,
    RedisEventSink,
    Streams,
    redis_client,
)
from sparkpoint_server.ingest.consumer import (
    EventConsumer,
    IngestStats,
    RejectedEvent,
    TransientIngestError,
)


class Crash(BaseException):
    """The control plane process dying in the middle of a batch."""


class RecordingHandler:
    """Applies batches by recording them; ``fail(batch)`` may raise instead."""

    def __init__(self, fail: Callable[[list[ReceivedMessage]], None] = lambda batch: None):
        self.fail = fail
        self.calls: list[list[int]] = []  # the epochs of every call, failed ones too
        self.applied: list[list[int]] = []  # the epochs of the calls that returned

    def __call__(self, batch: list[ReceivedMessage]) -> None:
        epochs = [m.payload.epoch for m in batch]  # type: ignore[attr-defined]
        self.calls.append(epochs)
        self.fail(batch)
        self.applied.append(epochs)


def _heartbeat(epoch: int) -> p.Envelope:
    beat = p.Heartbeat(
        epoch=epoch, records=epoch, duration_ms=1.0, records_per_second=1.0, source_lag=0,
        host_time=epoch,
    )  # fmt: skip
    return p.envelope("job-1", 1, 1_700_000_000_000 + epoch, beat)


def _publish(client: redis.Redis, streams: Streams, *epochs: int) -> None:
    RedisEventSink(client, streams).publish([_heartbeat(e) for e in epochs])


def _consumer(
    client: redis.Redis,
    streams: Streams,
    handler: RecordingHandler,
    stats: IngestStats | None = None,
    batch_size: int = 1000,
) -> EventConsumer:
    consumer = EventConsumer(
        client,
        handler,
        stats or IngestStats(),
        streams=streams,
        batch_size=batch_size,
        block_ms=0,
        clock=ManualClock(start_ms=1_700_000_123_000),
    )
    consumer.ensure_group()
    return consumer


def _pending(client: redis.Redis, streams: Streams) -> int:
    return int(client.xpending(streams.events, EVENTS_GROUP)["pending"])


def _dead_letters(client: redis.Redis, streams: Streams) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in client.xrange(streams.dead_letters)]


def test_events_published_before_the_group_existed_are_applied_in_order_in_batches(
    client: redis.Redis, streams: Streams
) -> None:
    _publish(client, streams, 1, 2, 3, 4, 5)
    handler = RecordingHandler()
    stats = IngestStats()
    consumer = _consumer(client, streams, handler, stats, batch_size=2)

    counts = [consumer.poll_once() for _ in range(4)]

    assert counts == [2, 2, 1, 0]
    assert handler.applied == [[1, 2], [3, 4], [5]]
    assert _pending(client, streams) == 0
    assert (stats.events_ingested, stats.batches, stats.last_batch_size) == (5, 3, 1)
    assert (stats.dead_letters, stats.handler_errors) == (0, 0)


def test_events_are_acknowledged_only_after_the_handler_returned(
    client: redis.Redis, streams: Streams
) -> None:
    _publish(client, streams, 1, 2, 3)
    pending_during_calls: list[int] = []
    failures = [TransientIngestError("database unreachable")]

    def unavailable_once(batch: list[ReceivedMessage]) -> None:
        pending_during_calls.append(_pending(client, streams))
        if failures:
            raise failures.pop()

    handler = RecordingHandler(unavailable_once)
    stats = IngestStats()
    consumer = _consumer(client, streams, handler, stats)

    with pytest.raises(TransientIngestError):
        consumer.poll_once()
    assert _pending(client, streams) == 3
    assert handler.applied == []

    assert consumer.poll_once() == 3  # re-read from the pending entries
    assert handler.calls == [[1, 2, 3], [1, 2, 3]]
    assert handler.applied == [[1, 2, 3]]
    assert pending_during_calls == [3, 3]
    assert _pending(client, streams) == 0
    assert stats.events_ingested == 3
    assert _dead_letters(client, streams) == []


def test_a_handler_failing_once_on_a_batch_applies_its_events_one_by_one(
    client: redis.Redis, streams: Streams
) -> None:
    _publish(client, streams, 1, 2)
    failures = [RuntimeError("deadlock detected")]

    def fail_once(batch: list[ReceivedMessage]) -> None:
        if failures:
            raise failures.pop()

    handler = RecordingHandler(fail_once)
    stats = IngestStats()

    assert _consumer(client, streams, handler, stats).poll_once() == 2

    assert handler.applied == [[1], [2]]
    assert (stats.events_ingested, stats.handler_errors, stats.dead_letters) == (2, 0, 0)
    assert _pending(client, streams) == 0


def test_pending_events_of_a_crashed_consumer_are_read_first_after_a_restart(
    client: redis.Redis, streams: Streams
) -> None:
    _publish(client, streams, 1, 2)

    def crash(batch: list[ReceivedMessage]) -> None:
        raise Crash

    with pytest.raises(Crash):
        _consumer(client, streams, RecordingHandler(crash)).poll_once()
    assert _pending(client, streams) == 2
    _publish(client, streams, 3)

    handler = RecordingHandler()
    restarted = _consumer(client, streams, handler)  # same consumer name, new instance

    assert restarted.poll_once() == 3
    assert handler.applied == [[1, 2], [3]]
    assert _pending(client, streams) == 0


def _unknown_type() -> bytes:
    return p.encode(_heartbeat(9).model_copy(update={"type": "explode"}))


def _invalid_payload() -> bytes:
    return p.encode(_heartbeat(9).model_copy(update={"payload": {"records": -1}}))


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({FIELD: b"{not json"}, "malformed message: invalid JSON (key must be a string"),
        ({FIELD: _unknown_type()}, "unknown message type 'explode' (job job-1)"),
        ({FIELD: _invalid_payload()}, "invalid heartbeat payload for job job-1: epoch"),
        ({b"other": b"x"}, "has no 'm' field"),
        ({FIELD: p.encode(p.envelope("job-1", 1, 5, p.CancelJob()))}, "cancel is a command"),
    ],
    ids=["malformed-json", "unknown-type", "invalid-payload", "missing-field", "command"],
)
def test_an_event_that_does_not_decode_goes_to_the_dead_letters_with_the_reason(
    client: redis.Redis, streams: Streams, fields: dict[bytes, bytes], reason: str
) -> None:
    _publish(client, streams, 1)
    bad_id = client.xadd(streams.events, fields).decode()
    _publish(client, streams, 2)
    handler = RecordingHandler()
    stats = IngestStats()

    assert _consumer(client, streams, handler, stats).poll_once() == 3

    assert handler.applied == [[1, 2]]
    [letter] = _dead_letters(client, streams)
    assert letter[FIELD] == fields.get(FIELD, b"")
    assert reason in letter[b"reason"].decode()
    assert letter[b"source_id"].decode() == bad_id
    assert letter[b"timestamp"] == b"1700000123000"
    assert (stats.dead_letters, stats.events_ingested) == (1, 2)
    assert _pending(client, streams) == 0


def test_a_poison_event_goes_to_the_dead_letters_and_the_rest_of_its_batch_is_applied(
    client: redis.Redis, streams: Streams
) -> None:
    _publish(client, streams, 1, 2, 3)
    poison_id, poison_raw = client.xrange(streams.events)[1]

    def poison(batch: list[ReceivedMessage]) -> None:
        if any(m.payload.epoch == 2 for m in batch):  # type: ignore[attr-defined]
            raise ValueError("epoch 2 breaks a constraint")

    handler = RecordingHandler(poison)
    stats = IngestStats()

    assert _consumer(client, streams, handler, stats).poll_once() == 3

    assert handler.calls == [[1, 2, 3], [1], [2, 3], [2], [3]]  # halved, doubled, halved
    assert handler.applied == [[1], [3]]
    [letter] = _dead_letters(client, streams)
    assert letter[b"reason"] == b"handler failed: ValueError: epoch 2 breaks a constraint"
    assert letter[b"source_id"] == poison_id
    assert letter[FIELD] == poison_raw[FIELD]
    assert (stats.handler_errors, stats.dead_letters, stats.events_ingested) == (1, 1, 2)
    assert _pending(client, streams) == 0

    # The count survives a restart of the control plane.
    fresh = IngestStats()
    _consumer(client, streams, RecordingHandler(), fresh)
    assert fresh.dead_letters == 1


def test_run_applies_events_until_stopped(client: redis.Redis, streams: Streams) -> None:
    handler = RecordingHandler()
    stats = IngestStats()
    consumer = EventConsumer(client, handler, stats, streams=streams, block_ms=20)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,))
    thread.start()
    try:
        _publish(client, streams, 1, 2)
        wait_for("2 events ingested", lambda: stats.events_ingested == 2, 10, every_s=0.01)
        _publish(client, streams, 3)
        wait_for("3 events ingested", lambda: stats.events_ingested == 3, 10, every_s=0.01)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert [e for batch in handler.applied for e in batch] == [1, 2, 3]


def test_run_survives_an_unreachable_redis_and_stops_when_asked(streams: Streams) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stats = IngestStats()
    health: list[bool] = []
    consumer = EventConsumer(
        redis_client(f"redis://127.0.0.1:{port}/0"),
        RecordingHandler(),
        stats,
        streams=streams,
        on_health=health.append,
    )
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,))
    thread.start()
    try:
        wait_for("two failed attempts", lambda: stats.redis_errors >= 2, 10, every_s=0.01)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert health == [False]  # told once, not at every attempt


def test_run_tells_when_it_reads_again_after_a_transient_failure(
    client: redis.Redis, streams: Streams
) -> None:
    failures = [TransientIngestError("database unreachable")]

    def unavailable_once(batch: list[ReceivedMessage]) -> None:
        if failures:
            raise failures.pop()

    handler = RecordingHandler(unavailable_once)
    health: list[bool] = []
    consumer = EventConsumer(
        client, handler, IngestStats(), streams=streams, block_ms=20, on_health=health.append
    )
    _publish(client, streams, 1)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,))
    thread.start()
    try:
        wait_for("the event applied", lambda: bool(handler.applied), 10, every_s=0.01)
        wait_for("health reported", lambda: health == [False, True], 10, every_s=0.01)
    finally:
        stop.set()
        thread.join(timeout=10)


def test_events_the_handler_rejects_are_dead_lettered_and_the_rest_of_the_batch_applied(
    client: redis.Redis, streams: Streams
) -> None:
    _publish(client, streams, 1, 2, 3)
    rejected_id = client.xrange(streams.events)[1][0].decode()

    def reject_epoch_2(batch: list[ReceivedMessage]) -> list[RejectedEvent]:
        return [
            RejectedEvent(m.entry_id, "unknown job") for m in batch if m.entry_id == rejected_id
        ]

    calls: list[list[str]] = []

    def handler(batch: list[ReceivedMessage]) -> list[RejectedEvent]:
        calls.append([m.entry_id for m in batch])
        return reject_epoch_2(batch)

    stats = IngestStats()
    consumer = EventConsumer(client, handler, stats, streams=streams, block_ms=0)
    consumer.ensure_group()

    assert consumer.poll_once() == 3

    assert len(calls) == 1  # one call applied the batch: no retry, no split
    [letter] = _dead_letters(client, streams)
    assert (letter[b"source_id"].decode(), letter[b"reason"]) == (rejected_id, b"unknown job")
    assert (stats.events_ingested, stats.dead_letters, stats.handler_errors) == (2, 1, 0)
    assert _pending(client, streams) == 0


@pytest.mark.parametrize(("poisoned", "most_calls"), [({17}, 20), (set(range(64)), 64 + 6)])
def test_a_failing_batch_is_split_so_poison_costs_few_handler_calls(
    client: redis.Redis, streams: Streams, poisoned: set[int], most_calls: int
) -> None:
    """One poison event in 64: about 3 log2(64) calls, not 65; all 64 poisoned: one call per
    event plus the halvings, not more."""
    _publish(client, streams, *range(64))

    def poison(batch: list[ReceivedMessage]) -> None:
        if any(m.payload.epoch in poisoned for m in batch):  # type: ignore[attr-defined]
            raise ValueError("poison")

    handler = RecordingHandler(poison)
    stats = IngestStats()

    assert _consumer(client, streams, handler, stats).poll_once() == 64

    assert len(handler.calls) <= most_calls
    assert sorted(e for batch in handler.applied for e in batch) == sorted(
        set(range(64)) - poisoned
    )  # in order, each once
    assert [e for batch in handler.applied for e in batch] == sorted(set(range(64)) - poisoned)
    assert stats.dead_letters == len(poisoned) == len(_dead_letters(client, streams))
    assert _pending(client, streams) == 0


def test_a_batch_of_malformed_events_is_dead_lettered_in_one_redis_transaction(
    client: redis.Redis, streams: Streams
) -> None:
    for _ in range(200):
        client.xadd(streams.events, {FIELD: b"{not json"})
    _publish(client, streams, 1)
    handler = RecordingHandler()
    stats = IngestStats()
    consumer = _consumer(client, streams, handler, stats)
    pipelines: list[bool] = []
    real_pipeline = client.pipeline

    def counting_pipeline(transaction: bool = True, **kwargs: object) -> redis.client.Pipeline:
        pipelines.append(transaction)
        return real_pipeline(transaction=transaction, **kwargs)  # type: ignore[arg-type]

    consumer.client = mock.Mock(wraps=client, pipeline=counting_pipeline)

    assert consumer.poll_once() == 201

    assert pipelines.count(True) == 1  # the dead letters and their acknowledgement
    assert handler.applied == [[1]]
    assert stats.dead_letters == 200 == len(_dead_letters(client, streams))
    assert _pending(client, streams) == 0
