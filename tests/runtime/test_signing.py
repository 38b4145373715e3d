"""Signed messages (``sparkpoint.signing``): what a signature covers, and a driver's refusal
of unsigned, forged and replayed commands on the real Redis."""

from __future__ import annotations

import redis

from sparkpoint import protocol as p
from sparkpoint.signing import CommandVerifier, Signer, verify
from sparkpoint.transport import FIELD, CommandChannel, Streams, send_command

KEY = bytes(range(32))


def test_a_signature_survives_the_wire_and_covers_every_field() -> None:
    beat = p.Heartbeat(
        epoch=3,
        records=7,
        duration_ms=0.1 + 0.2,
        records_per_second=1e-7,
        source_lag=0,
        host_time=1,
    )
    [signed] = Signer(lambda _: KEY, "driver-1").sign([p.envelope("job-1", 2, 5, beat)])
    decoded, _ = p.decode(p.encode(signed))
    assert verify(KEY, decoded) is None
    assert verify(bytes(32), decoded) == "bad signature"
    for change in (
        {"attempt": 3},
        {"job_id": "job-2"},
        {"seq": 2},
        {"sender": "other"},
        {"payload": {**decoded.payload, "records": 8}},
    ):
        assert verify(KEY, decoded.model_copy(update=change)) == "bad signature", change


def test_the_driver_refuses_unsigned_forged_and_replayed_commands(
    client: redis.Redis, streams: Streams
) -> None:
    channel = CommandChannel(client, "job-1", "driver-a", streams, verifier=CommandVerifier(KEY))
    channel.open()
    signer = Signer(lambda _: KEY, "control-plane-1")
    cancel = p.CancelJob(cause="user")
    send_command(client, streams, "job-1", 1, 1, cancel)  # unsigned
    send_command(client, streams, "job-1", 1, 2, cancel, signer=Signer(lambda _: b"k", "cp"))
    good = send_command(
        client, streams, "job-1", 1, 3, p.NotifyCheckpointComplete(checkpoint_id=4), signer=signer
    )
    [(_, fields)] = client.xrange(streams.commands("job-1"), min=good, max=good)
    client.xadd(streams.commands("job-1"), {FIELD: fields[FIELD]})  # a copy, replayed
    received = channel.read()
    assert [m.entry_id for m in received] == [good]
    assert channel.malformed == 3
