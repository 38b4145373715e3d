"""The real ingest path into the real control plane: Redis stream → consumer → database."""

from __future__ import annotations

from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint.transport import RedisEventSink
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats
from sparkpoint_server.storage.models import Checkpoint


def test_rejected_and_malformed_events_are_dead_lettered_and_the_rest_applied(
    harness: Harness,
) -> None:
    stats = IngestStats()
    consumer = EventConsumer(
        harness.client, harness.plane.handle_batch, stats, streams=harness.streams
    )
    consumer.ensure_group()
    harness.start()
    cid = harness.trigger_periodic()
    sink = RedisEventSink(harness.client, harness.streams)
    now = harness.clock.now_ms()
    acks = [harness.ack(1, cid, op, i) for op in ("source", "pv") for i in range(2)]
    sink.publish(
        [
            p.envelope(harness.job_id, 1, now, acks[0]),
            p.envelope("no-such-job", 1, now, acks[1]),  # a job nobody registered
            p.envelope(harness.job_id, 1, now, harness.ack(1, cid, "ghost", 0)),  # no such task
            p.envelope(harness.job_id, 1, now, acks[1]),
        ]
    )
    harness.client.xadd(harness.streams.events, {b"m": b'{"v": 1, "type": "heartbeat"'})
    sink.publish([p.envelope(harness.job_id, 1, now, a) for a in acks[2:]])
    while consumer.poll_once():
        pass
    harness.plane.wait_idle()
    letters = harness.client.xrange(harness.streams.dead_letters)
    reasons = sorted(fields[b"reason"].decode() for _, fields in letters)
    assert len(reasons) == 3 and stats.dead_letters == 3
    assert any("unknown job no-such-job" in r for r in reasons)
    assert any("ghost" in r and "unknown subtask" in r for r in reasons)
    assert any("invalid JSON" in r for r in reasons)
    with harness.sessions() as s:
        row = s.get(Checkpoint, (harness.job_id, cid))
        assert row is not None and row.status == "COMPLETED"  # the good events all applied
    assert stats.events_ingested == 4  # the four acknowledgements of the real job
    pending = harness.client.xpending(harness.streams.events, "control-plane")
    assert pending["pending"] == 0
