"""A flood of junk events (malformed, of unknown jobs) through the real ingest path: it is
dead-lettered in bulk with the reasons, and a live job's checkpoints keep completing."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from service_harness import Harness
from tests.support.waiting import wait_for

from sparkpoint import protocol as p
from sparkpoint.transport import FIELD, RedisEventSink
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats
from sparkpoint_server.storage.models import Checkpoint, Job

JUNK_PER_CHECKPOINT = 5_000  # half malformed, half of unknown jobs
CHECKPOINTS = 4  # 20,000 junk events in all
COMPLETION_LIMIT_S = 2.0  # after the acknowledgements were sent, behind the junk
# events/s. Batched, the ingest dead-letters 12-17 k junk events/s here; with one Redis and
# one database transaction per event (what this floor catches) about 2,000. A CI run that met
# a slow moment of the disk measured 4.9 k, so the floor sits between the two, not near 5 k.
JUNK_RATE_FLOOR = 3_000
MALFORMED = b'{"v": 1, "type": "heartbeat"'


def _junk_beat(i: int) -> p.Envelope:
    beat = p.Heartbeat(
        epoch=i, records=1, duration_ms=1.0, records_per_second=1.0, source_lag=0, host_time=0
    )
    return p.envelope(f"junk-{i}", 1, 1_700_000_000_000, beat)  # a different job each time


def _publish_junk(harness: Harness, first: int, count: int) -> None:
    """``count`` junk events, alternately malformed JSON and a heartbeat of an unknown job."""
    encoded = [p.encode(_junk_beat(i)) for i in range(first, first + count, 2)]
    pipe = harness.client.pipeline(transaction=False)
    for raw in encoded:
        pipe.xadd(harness.streams.events, {FIELD: MALFORMED})
        pipe.xadd(harness.streams.events, {FIELD: raw})
    pipe.execute()


@pytest.fixture
def ingest(harness: Harness) -> Iterator[IngestStats]:
    """The real consumer on its own thread, and the harness's events sent through Redis."""
    stats = IngestStats()
    consumer = EventConsumer(
        harness.client, harness.plane.handle_batch, stats, streams=harness.streams, block_ms=20
    )
    consumer.ensure_group()
    sink = RedisEventSink(harness.client, harness.streams)

    def send_through_redis(attempt: int, *payloads: Any, job_id: str | None = None) -> None:
        now = harness.clock.now_ms()
        sink.publish([p.envelope(job_id or harness.job_id, attempt, now, x) for x in payloads])

    harness.send = send_through_redis  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), name="test-ingest")
    thread.start()
    yield stats
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()


def _status(harness: Harness, model: Any, key: Any) -> str | None:
    with harness.sessions() as session:
        row = session.get(model, key)
        return None if row is None else str(row.status)


@pytest.mark.serial  # a throughput floor: no test of another xdist worker shares the CPU
def test_a_live_job_completes_its_checkpoints_promptly_during_a_flood_of_junk(
    harness: Harness, ingest: IngestStats
) -> None:
    harness.start()  # registered and RUNNING through the events stream
    wait_for("the job runs", lambda: _status(harness, Job, harness.job_id) == "RUNNING", 60, 0.005)
    completions: list[float] = []
    started = time.monotonic()
    for n in range(CHECKPOINTS):
        harness.plane.trigger_checkpoint(harness.job_id)
        [cid] = [
            c.checkpoint_id for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)
        ]
        _publish_junk(harness, n * JUNK_PER_CHECKPOINT, JUNK_PER_CHECKPOINT)
        harness.ack_all(1, cid)  # the job's acknowledgements, behind the junk
        acked = time.monotonic()
        wait_for(
            f"checkpoint {cid} completes",
            lambda cid=cid: _status(harness, Checkpoint, (harness.job_id, cid)) == "COMPLETED",
            60,
            0.005,
        )
        completions.append(time.monotonic() - acked)
    total = CHECKPOINTS * JUNK_PER_CHECKPOINT
    wait_for("all junk dead-lettered", lambda: ingest.dead_letters == total, 60, 0.005)
    elapsed = time.monotonic() - started
    print(
        f"\n{total} junk events + {CHECKPOINTS} checkpoints in {elapsed:.2f} s "
        f"({total / elapsed:,.0f} junk events/s); completion after the acks: "
        f"max {max(completions):.3f} s, mean {sum(completions) / len(completions):.3f} s"
    )

    assert max(completions) <= COMPLETION_LIMIT_S, completions
    assert total / elapsed >= JUNK_RATE_FLOOR
    letters = harness.client.xrange(harness.streams.dead_letters)
    assert len(letters) == total
    reasons = Counter(
        "malformed" if b"invalid JSON" in f[b"reason"] else f[b"reason"].split(b" junk-")[0]
        for _, f in letters
    )
    assert reasons == {"malformed": total // 2, b"heartbeat event of unknown job": total // 2}
    assert ingest.handler_errors == 0  # refused, not failed: their batches were applied
    pending = harness.client.xpending(harness.streams.events, "control-plane")
    assert pending["pending"] == 0
