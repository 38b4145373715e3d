"""A checkpoint expires when its acknowledgements have not *arrived* by its deadline.

Acknowledgements that arrived in the events stream in time but wait there unread (an ingest
behind a burst, a control plane that restarts with a backlog) let no checkpoint expire: the
control plane judges by how far its ingest has read (``ingest_read_through``), as Flink's
JobManager processes the acknowledgements queued in its mailbox before the timeout.

A real Redis stream read by the real ``EventConsumer``, the harness's control plane, one
ManualClock for both.
"""

from __future__ import annotations

from typing import Any

from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint.transport import RedisEventSink
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats
from sparkpoint_server.storage.models import Checkpoint, Job

TIMEOUT_MS = 10_000


def _status(h: Harness, cid: int) -> tuple[str, str | None]:
    with h.sessions() as s:
        row = s.get(Checkpoint, (h.job_id, cid))
        assert row is not None
        return row.status, row.failure_message


def _ingest(h: Harness, batch_size: int) -> EventConsumer:
    """The server's wiring: the ingest tells the control plane how far it has read."""
    h.plane.track_ingest()
    consumer = EventConsumer(
        h.client,
        h.plane.handle_batch,
        IngestStats(),
        streams=h.streams,
        batch_size=batch_size,
        block_ms=0,
        clock=h.clock,
        on_read_through=h.plane.ingest_read_through,
    )
    consumer.ensure_group()
    return consumer


def _publish(h: Harness, *payloads: Any, job_id: str | None = None) -> None:
    """Events into the stream, as the job's driver sends them (they arrive now)."""
    envelopes = [p.envelope(job_id or h.job_id, 1, h.clock.now_ms(), e) for e in payloads]
    RedisEventSink(h.client, h.streams).publish(envelopes)


def _backlog(h: Harness, n: int) -> None:
    """``n`` events of another job ahead in the stream (it is unknown: dead-lettered)."""
    _publish(h, *[p.DriverHeartbeat(incarnation="x", host_time=0)] * n, job_id="another-job")


def _start(h: Harness) -> EventConsumer:
    """A running job (no periodic checkpoint in the way) and an ingest that reads 5 a time."""
    h.start(timeout_ms=TIMEOUT_MS, interval_ms=3_600_000)
    return _ingest(h, batch_size=5)


def _trigger(h: Harness) -> int:
    h.plane.trigger_checkpoint(h.job_id)
    [cid] = [c.checkpoint_id for _, c in h.commands() if isinstance(c, p.TriggerCheckpoint)]
    return cid


def _acks(h: Harness, cid: int) -> list[p.SnapshotCompleted]:
    return [h.ack(1, cid, op, i) for op in ("source", "pv") for i in range(2)]


def _drain(consumer: EventConsumer) -> None:
    while consumer.poll_once():
        pass


def test_acknowledgements_that_arrived_in_time_complete_the_checkpoint_read_late(
    harness: Harness,
) -> None:
    h = harness
    consumer = _start(h)
    _drain(consumer)  # caught up: nothing in the stream
    cid = _trigger(h)
    h.clock.advance(1_000)
    _backlog(h, 12)
    _publish(h, *_acks(h, cid))  # all in the stream 9 s before the deadline
    read_through = consumer.stats.read_through_ms  # what /metrics shows
    consumer.poll_once()  # the ingest is behind: one batch of 5 read, 11 wait
    assert consumer.stats.read_through_ms == read_through
    h.tick(TIMEOUT_MS)  # past the deadline by the clock
    assert _status(h, cid) == ("IN_PROGRESS", None)
    drained_at = h.clock.now_ms()
    _drain(consumer)
    assert consumer.stats.read_through_ms == drained_at
    h.plane.wait_idle()
    assert _status(h, cid) == ("COMPLETED", None)
    h.tick(TIMEOUT_MS)
    assert _status(h, cid) == ("COMPLETED", None)


def test_a_checkpoint_expires_once_the_ingest_has_read_past_its_deadline(
    harness: Harness,
) -> None:
    h = harness
    consumer = _start(h)
    h.tick(TIMEOUT_MS)
    assert h.command_types() == []  # no checkpoint yet; and before its first read...
    cid = _trigger(h)
    _publish(h, *_acks(h, cid)[:3])  # one subtask never acknowledges
    h.tick(TIMEOUT_MS + 5_000)
    # ... the ingest has read nothing yet: what the stream holds may complete it.
    assert _status(h, cid) == ("IN_PROGRESS", None)
    _drain(consumer)  # read through: now, past the deadline
    h.tick()
    status, message = _status(h, cid)
    assert status == "FAILED"
    assert f"expired before completing after {TIMEOUT_MS} ms: 3/4 subtasks" in (message or "")


def test_without_an_ingest_checkpoints_expire_by_the_clock(harness: Harness) -> None:
    """Events applied by hand (no ingest reports how far it read): the clock alone."""
    h = harness
    h.start(timeout_ms=TIMEOUT_MS)
    cid = h.trigger_periodic()
    h.tick(TIMEOUT_MS)
    assert _status(h, cid)[0] == "FAILED"


def test_a_driver_heartbeat_waiting_in_the_stream_keeps_the_driver(harness: Harness) -> None:
    h = harness
    h.register(heartbeat_interval_ms=10_000, interval_ms=3_600_000)
    h.running(1)
    consumer = _ingest(h, batch_size=5)
    _drain(consumer)
    h.clock.advance(40_000)
    _backlog(h, 12)
    _publish(h, p.DriverHeartbeat(incarnation="driver-1", host_time=0))
    consumer.poll_once()  # behind: the driver's heartbeat is still in the stream
    h.tick(20_000)  # 60 s since the last heartbeat read; the timeout is 50 s
    _drain(consumer)
    h.tick()
    with h.sessions() as s:
        assert s.get(Job, h.job_id).status == "RUNNING"  # type: ignore[union-attr]
    h.tick(50_000)  # now silent for 50 s, all of it read
    _drain(consumer)
    h.tick()
    with h.sessions() as s:
        assert s.get(Job, h.job_id).status != "RUNNING"  # type: ignore[union-attr]
