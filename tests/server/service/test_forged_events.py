"""Authenticated events on the real ingest path: forged and replayed events are dead-lettered,
a redelivered entry is applied once, and commands leave signed (``sparkpoint.signing``)."""

from __future__ import annotations

import pytest
from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint.signing import CommandVerifier, Signer, job_key, read_secret, verify
from sparkpoint.transport import FIELD, RedisEventSink
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats
from sparkpoint_server.storage.models import Checkpoint, EventSender


def _consumer(harness: Harness, stats: IngestStats) -> EventConsumer:
    consumer = EventConsumer(
        harness.client,
        harness.plane.handle_batch,
        stats,
        streams=harness.streams,
        verifier=harness.plane.verify_event,
    )
    consumer.ensure_group()
    return consumer


def _drain(consumer: EventConsumer, harness: Harness) -> None:
    while consumer.poll_once():
        pass
    harness.plane.wait_idle()


def _key(harness: Harness) -> bytes:
    secret = read_secret(harness.settings.data_dir)
    assert secret is not None
    return job_key(secret, harness.job_id)


def _status(harness: Harness, cid: int) -> str:
    with harness.sessions() as s:
        row = s.get(Checkpoint, (harness.job_id, cid))
        assert row is not None
        return row.status


def _letters(harness: Harness) -> list[str]:
    return [f[b"reason"].decode() for _, f in harness.client.xrange(harness.streams.dead_letters)]


def _acks(harness: Harness, cid: int) -> list[p.Envelope]:
    now = harness.clock.now_ms()
    return [
        p.envelope(harness.job_id, 1, now, harness.ack(1, cid, op, i))
        for op in ("source", "pv")
        for i in range(2)
    ]


@pytest.mark.parametrize("forgery", ["unsigned", "wrong key", "tampered"])
def test_a_forged_acknowledgement_is_dead_lettered_and_the_checkpoint_does_not_complete(
    harness: Harness, forgery: str
) -> None:
    stats = IngestStats()
    consumer = _consumer(harness, stats)
    harness.start()
    cid = harness.trigger_periodic()
    genuine = RedisEventSink(
        harness.client, harness.streams, signer=Signer(lambda _: _key(harness), "driver-1")
    )
    acks = _acks(harness, cid)
    genuine.publish(acks[:3])  # three subtasks snapshotted; the fourth never did
    forged = acks[3]
    if forgery == "wrong key":
        forged = Signer(lambda _: b"x" * 32, "driver-1").sign([forged])[0]
    elif forgery == "tampered":  # a genuine signature, on another subtask's acknowledgement
        signed = Signer(lambda _: _key(harness), "driver-9").sign([acks[0]])[0]
        forged = signed.model_copy(update={"payload": acks[3].payload})
    harness.client.xadd(harness.streams.events, {FIELD: p.encode(forged)})

    _drain(consumer, harness)

    [reason] = _letters(harness)
    assert f"forged snapshot_completed event of job {harness.job_id}" in reason
    expected = "unsigned (no sig, sender or seq)" if forgery == "unsigned" else "bad signature"
    assert reason.endswith(f": {expected}")
    assert _status(harness, cid) == "IN_PROGRESS"
    assert stats.events_ingested == 3 and stats.dead_letters == 1


def test_a_replayed_copy_of_a_genuine_event_is_dead_lettered_also_after_a_restart(
    harness: Harness,
) -> None:
    stats = IngestStats()
    consumer = _consumer(harness, stats)
    harness.start()
    cid = harness.trigger_periodic()
    sink = RedisEventSink(
        harness.client, harness.streams, signer=Signer(lambda _: _key(harness), "driver-1")
    )
    sink.publish([p.envelope(harness.job_id, 1, harness.clock.now_ms(), p.EndOfInput(epoch=3))])
    [(_, fields)] = harness.client.xrange(harness.streams.events)
    copied = fields[FIELD]  # what anyone reading the stream sees
    _drain(consumer, harness)
    harness.client.xadd(harness.streams.events, {FIELD: copied})  # a copy, re-sent
    _drain(consumer, harness)
    harness.new_control_plane()  # a restart: the last seq is in the database
    harness.client.xadd(harness.streams.events, {FIELD: copied})
    _drain(_consumer(harness, stats), harness)

    letters = _letters(harness)
    assert len(letters) == 2
    for reason in letters:
        assert reason.startswith(f"replayed end_of_input event of job {harness.job_id}: seq 1")
    assert stats.events_ingested == 1
    with harness.sessions() as s:
        row = s.get(EventSender, (harness.job_id, "driver-1"))
        assert row is not None and row.last_seq == 1
    assert _status(harness, cid) == "IN_PROGRESS"


def test_a_redelivered_entry_after_a_consumer_crash_is_applied_once(harness: Harness) -> None:
    """The consumer crashed after the database committed a batch and before it acknowledged
    it: it reads the same entries again, skips them as applied, and dead-letters nothing."""
    stats = IngestStats()
    consumer = _consumer(harness, stats)
    harness.start()
    cid = harness.trigger_periodic()
    sink = RedisEventSink(
        harness.client, harness.streams, signer=Signer(lambda _: _key(harness), "driver-1")
    )
    acks = _acks(harness, cid)
    sink.publish(acks[:2])
    applied: list[str] = []

    def crash_after_commit(batch: list) -> None:  # type: ignore[type-arg]
        harness.plane.handle_batch(batch)
        applied.extend(m.entry_id for m in batch)
        raise SystemExit("the consumer dies before XACK")

    crashing = EventConsumer(
        harness.client,
        crash_after_commit,
        IngestStats(),
        streams=harness.streams,
        verifier=harness.plane.verify_event,
    )
    with pytest.raises(SystemExit):
        crashing.poll_once()
    assert len(applied) == 2
    assert harness.client.xpending(harness.streams.events, "control-plane")["pending"] == 2
    with harness.sessions() as s:
        acked = s.get(Checkpoint, (harness.job_id, cid))
        assert acked is not None
    sink.publish(acks[2:])

    harness.new_control_plane()  # the restarted control plane re-reads its pending entries
    consumer = _consumer(harness, stats)
    _drain(consumer, harness)

    assert _letters(harness) == []
    assert _status(harness, cid) == "COMPLETED"
    assert stats.events_ingested == 4  # two redelivered (skipped as applied), two new
    assert harness.client.xpending(harness.streams.events, "control-plane")["pending"] == 0


def test_commands_are_signed_with_the_jobs_key(harness: Harness) -> None:
    harness.register()
    harness.running(1)
    harness.tick(1000)  # a periodic trigger
    commands = [env for env, _ in harness.commands()]
    assert [env.type for env in commands] == ["restore", "trigger_checkpoint"]
    assert commands and all(verify(_key(harness), env) is None for env in commands)
    check = CommandVerifier(_key(harness))
    assert [check(env) for env in commands] == [None] * len(commands)
    assert check(commands[0]) is not None  # the same command again: replayed
    assert check(commands[0].model_copy(update={"sig": None})) == "unsigned (no sig, sender or seq)"
