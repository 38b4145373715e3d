"""The ingest enforces the protocol's limits: an oversize message, an out-of-range number or an
invalid job id goes to the dead letters with the reason and never reaches the handler."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from sparkpoint import protocol as p
from sparkpoint.clock import ManualClock
from sparkpoint.transport import FIELD, ReceivedMessage, Streams
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats

PATTERN = "(pattern ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$)"


class Applied:
    """A handler that records the job ids of the events it applied."""

    def __init__(self) -> None:
        self.job_ids: list[str] = []
        self.payloads: list[Any] = []

    def __call__(self, batch: list[ReceivedMessage]) -> None:
        self.job_ids += [m.envelope.job_id for m in batch]
        self.payloads += [m.payload for m in batch]


def _raw(job_id: str, kind: str, payload: dict[str, Any]) -> bytes:
    """A message as a writer that bypasses ``protocol.encode`` would put it on the stream."""
    message = {"type": kind, "job_id": job_id, "attempt": 1, "timestamp": 1, "payload": payload}
    return json.dumps(message).encode()


def _registration(parallelism: int, max_parallelism: int | None = None) -> dict[str, Any]:
    vertex = {"id": "pv", "name": "pv", "parallelism": parallelism, "operators": ["pv"]}
    if max_parallelism is not None:
        vertex["max_parallelism"] = max_parallelism
    return {"job_name": "pv", "vertices": [vertex], "edges": [], "config": {}}


def _ingest(client: redis.Redis, streams: Streams, raw: bytes) -> tuple[Applied, list[str]]:
    """Publish ``raw`` between two valid events, poll once; the handler and the dead letters'
    reasons (without their ``entry <id>: `` prefix)."""
    valid = _raw("ok-1", "end_of_input", {"epoch": 1})
    for message in (valid, raw, valid):
        client.xadd(streams.events, {FIELD: message})
    applied = Applied()
    consumer = EventConsumer(
        client, applied, IngestStats(), streams=streams, block_ms=0, clock=ManualClock()
    )
    consumer.ensure_group()
    assert consumer.poll_once() == 3
    reasons = []
    for _, letter in client.xrange(streams.dead_letters):
        prefix = f"entry {letter[b'source_id'].decode()}: "
        reason = letter[b"reason"].decode()
        assert reason.startswith(prefix)
        reasons.append(reason.removeprefix(prefix))
    return applied, reasons


def test_a_message_above_the_size_limit_is_dead_lettered_unread(
    client: redis.Redis, streams: Streams
) -> None:
    raw = _raw("ok-2", "task_failed", {"epoch": 1, "cause": "x" * (8 << 20)})

    applied, [reason] = _ingest(client, streams, raw)

    assert applied.job_ids == ["ok-1", "ok-1"]
    assert reason == f"message of {len(raw)} bytes is above the 1048576-byte limit"


def test_a_message_at_the_size_limit_is_applied(client: redis.Redis, streams: Streams) -> None:
    empty = _raw("ok-2", "task_failed", {"epoch": 1, "cause": ""})
    raw = _raw("ok-2", "task_failed", {"epoch": 1, "cause": "x" * ((1 << 20) - len(empty))})
    assert len(raw) == p.DEFAULT_MAX_MESSAGE_BYTES

    applied, reasons = _ingest(client, streams, raw)

    assert (applied.job_ids, reasons) == (["ok-1", "ok-2", "ok-1"], [])


def test_a_long_failure_cause_is_applied_cut_to_its_beginning_and_end(
    client: redis.Redis, streams: Streams
) -> None:
    cause = "RuntimeError: " + "a" * 500_000 + " the end"
    raw = _raw("ok-2", "task_failed", {"epoch": 1, "cause": cause})

    applied, reasons = _ingest(client, streams, raw)

    assert (applied.job_ids, reasons) == (["ok-1", "ok-2", "ok-1"], [])
    cut = len(cause) - 8192
    assert applied.payloads[1].cause == (
        f"{cause[:4096]}\n... ({cut} characters cut) ...\n{cause[-4096:]}"
    )


@pytest.mark.parametrize(
    ("registration", "reason"),
    [
        (
            _registration(1_000_000),
            "vertices.0.parallelism: Input should be less than or equal to 32768",
        ),
        (
            _registration(8, max_parallelism=40_000),
            "vertices.0.max_parallelism: Input should be less than or equal to 32768",
        ),
        (
            _registration(200, max_parallelism=128),
            "vertices.0: parallelism 200 of pv is above its max parallelism 128",
        ),
        (
            {**_registration(2), "heartbeat_interval_ms": 10**29},
            "heartbeat_interval_ms: Input should be less than or equal to 31536000000",
        ),
        (
            {**_registration(2), "job_name": "n" * 201},
            "job_name: String should have at most 200 characters",
        ),
        (
            {
                **_registration(2),
                "vertices": [{**_registration(2)["vertices"][0], "id": "u" * 201}],
            },
            "vertices.0.id: String should have at most 200 characters",
        ),
        (
            {**_registration(2), "incarnation": "i" * 65},
            "incarnation: String should have at most 64 characters",
        ),
    ],
    ids=[
        "parallelism",
        "max-parallelism",
        "above-max-parallelism",
        "heartbeat-interval",
        "job-name",
        "operator-uid",
        "incarnation",
    ],
)
def test_a_registration_out_of_bounds_is_dead_lettered_with_the_reason(
    client: redis.Redis, streams: Streams, registration: dict[str, Any], reason: str
) -> None:
    applied, reasons = _ingest(client, streams, _raw("big", "job_registered", registration))

    assert applied.job_ids == ["ok-1", "ok-1"]
    assert reasons == [f"invalid job_registered payload for job big: {reason}"]


@pytest.mark.parametrize(
    ("kind", "payload", "reason"),
    [
        (
            "snapshot_completed",
            {
                "checkpoint_id": 2**31,
                "operator_id": "pv",
                "subtask": 0,
                "epoch": 1,
                "ack_timestamp": 1,
                "start_delay_ms": 0,
                "alignment_duration_ms": 0,
                "alignment_buffered_bytes": 0,
                "sync_duration_ms": 0,
                "async_duration_ms": 0,
                "state_size": 0,
                "checkpointed_size": 0,
            },
            "checkpoint_id: Input should be less than or equal to 2147483647",
        ),
        (
            "barrier_received",
            {
                "checkpoint_id": 1,
                "operator_id": "pv",
                "subtask": 32768,
                "channel": 0,
                "timestamp": 1,
            },
            "subtask: Input should be less than 32768",
        ),
        (
            "heartbeat",
            {
                "epoch": 1,
                "records": 2**63,
                "duration_ms": 1,
                "records_per_second": 1,
                "source_lag": 0,
                "host_time": 1,
            },
            "records: Input should be less than or equal to 9223372036854775807",
        ),
        (
            "heartbeat",
            {
                "epoch": 1,
                "records": 1,
                "duration_ms": 1e400,
                "records_per_second": 1,
                "source_lag": 0,
                "host_time": 1,
            },
            "duration_ms: Input should be a finite number",
        ),
    ],
    ids=["checkpoint-id", "subtask", "records", "infinite-duration"],
)
def test_an_event_with_a_number_out_of_bounds_is_dead_lettered_with_the_reason(
    client: redis.Redis, streams: Streams, kind: str, payload: dict[str, Any], reason: str
) -> None:
    applied, reasons = _ingest(client, streams, _raw("ok-2", kind, payload))

    assert applied.job_ids == ["ok-1", "ok-1"]
    assert reasons == [f"invalid {kind} payload for job ok-2: {reason}"]


@pytest.mark.parametrize(
    ("job_id", "problem"),
    [
        ("a/b", "'a/b': it must start with a letter or a digit, then only letters, digits, . _ -"),
        ("..", "'..': it must start with a letter or a digit, then only letters, digits, . _ -"),
        (
            "a\0b",
            "'a\\x00b': it must start with a letter or a digit, then only letters, digits, . _ -",
        ),
        (
            "a\nb",
            "'a\\nb': it must start with a letter or a digit, then only letters, digits, . _ -",
        ),
        ("j" * 65, f"'{'j' * 65}': it has 65 characters, more than 64"),
        ("", "'': it is empty"),
    ],
    ids=["slash", "dot-dot", "nul", "newline", "too-long", "empty"],
)
def test_an_event_with_an_invalid_job_id_is_dead_lettered_with_the_reason(
    client: redis.Redis, streams: Streams, job_id: str, problem: str
) -> None:
    applied, reasons = _ingest(client, streams, _raw(job_id, "job_registered", _registration(2)))

    assert applied.job_ids == ["ok-1", "ok-1"]
    assert reasons == [f"malformed message: job_id: invalid job id {problem} {PATTERN}"]


@pytest.mark.parametrize(
    "job_id", ["pv-shared-a", "0f8b7c2a9d3e4f5a8b6c7d9e0f1a2b3c", "a.b_c-D", "j" * 64]
)
def test_job_ids_in_the_pattern_are_applied(
    client: redis.Redis, streams: Streams, job_id: str
) -> None:
    applied, reasons = _ingest(client, streams, _raw(job_id, "end_of_input", {"epoch": 1}))

    assert (applied.job_ids, reasons) == (["ok-1", job_id, "ok-1"], [])
