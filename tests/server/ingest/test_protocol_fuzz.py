"""A protocol fuzzer on the real ingest path: hostile stream entries never hurt a genuine job.

Each example runs a control plane on SQLite with the real Redis and the real
:class:`EventConsumer`, and a genuine job (two vertices, parallelism 2) that registers,
runs and acknowledges the checkpoints the control plane triggers, its events shuffled and some
duplicated. Between them hypothesis puts what a broken or hostile writer could add to the
events stream: random bytes, entries without the message field, valid JSON of the wrong
shape, deep nesting, oversize messages, envelopes of every type (events and commands) with
mutated fields (wrong types, huge, negative and NaN numbers, unicode, missing and extra
fields), events of unknown jobs, and checkpoint events of the genuine job naming unknown
subtasks, checkpoints never triggered, older or newer attempts.

After every round: the consumer kept consuming and nothing is pending; every entry was
either applied or dead-lettered with a reason, and no reason is a handler's crash; every
malformed entry and every event the rules refuse is among the dead letters; the genuine
events were all applied; and every checkpoint of the genuine job completed with exactly the
acknowledgements and barriers it sent (its rows compared field by field), nothing more.
The consumer runs without the control plane's signature check (``verifier``): that check
dead-letters every entry not signed with the job's key, so this fuzzes what is behind it, as
if a writer holding a key (a buggy driver) sent these. ``derandomize=True``: the same
examples on every run (CI); about 20 s here.
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sparkpoint import protocol as p
from sparkpoint.transport import FIELD, Streams
from sparkpoint_server.ingest.consumer import EventConsumer, IngestStats
from sparkpoint_server.storage.db import create_db_engine, session_factory
from sparkpoint_server.storage.models import Base, Checkpoint, CheckpointSubtask

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuzz_inputs import (
    ACK,
    ANY,
    COMMAND_TYPES,
    DEAD,
    GENUINE_UNSAFE,
    ROUND,
    TEMPLATES,
    Hostile,
    dumps,
)
from service_harness import TASKS, VERTICES, Harness

pytestmark = pytest.mark.slow  # generated hostile streams for half a minute: make test-slow

# ----------------------------------------------------------------------------- one example


def checkpoint_message(spec: dict[str, Any], h: Harness, cid: int) -> tuple[Hostile, str] | None:
    """The event of ``spec`` for round ``cid``, or None when it would be a forgery of the
    genuine job's own subtask (authenticity is the signatures' job, not the ingest's)."""
    target = {"pending": cid, "previous": cid - 1, "next": cid + 1, "never": 10_000}
    checkpoint = target[spec["checkpoint"]]
    if checkpoint < 1:
        return None
    slot = spec["operator"] in TASKS and spec["subtask"] < TASKS[spec["operator"]]
    if slot and spec["attempt"] == 1 and spec["checkpoint"] in ("pending", "previous"):
        return None  # the genuine subtask's own event, forged
    base: dict[str, Any] = {
        "checkpoint_id": checkpoint,
        "operator_id": spec["operator"],
        "subtask": spec["subtask"],
    }
    kind, size = spec["kind"], spec["size"]
    extra: dict[str, Any] = {
        "snapshot_completed": {**ACK, **base, "state_size": size, "checkpointed_size": size},
        "checkpoint_declined": {"reason": "fuzz"},
        "barrier_injected": {"epoch": 1, "split_id": "s", "offset": size, "timestamp": 1},
        "barrier_received": {"channel": 0, "timestamp": 1},
        "alignment_completed": {"duration_ms": 1.0, "buffered_bytes": size},
        "sink_committed": {"transaction_id": "t", "parts": 1},
    }[kind]
    if kind == "alignment_completed":
        extra["buffered_records"] = size
    payload = {**base, **extra}
    message = {
        "type": kind,
        "job_id": h.job_id,
        "attempt": spec["attempt"],
        "timestamp": 1,
        "payload": payload,
    }
    # The rules: an event of an older attempt is ignored (counted as stale); an
    # acknowledgement or a decline that names no subtask of the job, a checkpoint never
    # triggered or a newer attempt is refused; so is a barrier or an alignment of a subtask
    # the job does not have or of a newer attempt (one of a checkpoint never triggered is
    # ignored); a sink commit that matches no transaction changes nothing.
    if spec["attempt"] == 0 or kind == "sink_committed":
        must = ANY
    elif kind in ("snapshot_completed", "checkpoint_declined"):
        never = spec["checkpoint"] in ("next", "never")
        must = DEAD if spec["attempt"] > 1 or never or not slot else ANY
    else:
        must = DEAD if spec["attempt"] > 1 or not slot else ANY
    return Hostile({FIELD: dumps(message)}, f"{kind} {spec}"), must


def expectation(entry: Hostile, h: Harness) -> tuple[Hostile, str] | None:
    """Resolve ``GENUINE`` to the job's id; what must happen to the entry (None: skip it)."""
    raw = entry.fields.get(FIELD)
    if raw is None:
        return entry, DEAD
    if entry.genuine_target:
        raw = raw.replace(b'"GENUINE"', json.dumps(h.job_id).encode())
        entry = Hostile({FIELD: raw}, entry.label, True)
    try:
        env, _ = p.decode(raw)
    except p.ProtocolError:
        return entry, DEAD
    except Exception as err:  # decode must raise nothing else
        pytest.fail(f"protocol.decode raised {type(err).__name__} on {entry.label}: {err}")
    if env.type in COMMAND_TYPES:
        return entry, DEAD
    if env.job_id == h.job_id:
        if env.type in GENUINE_UNSAFE or env.type in {
            "snapshot_completed",
            "checkpoint_declined",
            "barrier_injected",
            "barrier_received",
            "alignment_completed",
            "sink_committed",
        }:
            return None  # a valid event of the genuine job: checkpoint_event covers those
        return entry, ANY
    if env.type in ("job_registered", "driver_heartbeat"):
        return entry, ANY  # a new job; a heartbeat of nobody is ignored
    return entry, DEAD  # an event of an unknown job


def registration(h: Harness) -> p.JobRegistered:
    """The genuine job's registration (as ``Harness.register``, but sent through Redis)."""
    config = h.config(retained=2)
    del config["restart_strategy"]  # none given: the control plane's default
    return p.JobRegistered(
        job_name="pv",
        vertices=VERTICES,
        edges=[("source", "pv")],
        config=config,
        incarnation="driver-1",
    )


def run_example(
    tmp: Path, sessions: sessionmaker[Session], client: redis.Redis, rounds: list[dict[str, Any]]
) -> None:
    streams = Streams(prefix=f"fuzz-{uuid.uuid4().hex[:10]}")
    try:
        _run(tmp / uuid.uuid4().hex[:8], sessions, client, streams, rounds)
    finally:
        keys = list(client.scan_iter(match=f"{streams.prefix}:*"))
        if keys:
            client.delete(*keys)


def _run(
    tmp: Path,
    sessions: sessionmaker[Session],
    client: redis.Redis,
    streams: Streams,
    rounds: list[dict[str, Any]],
) -> None:
    h = Harness(tmp, sessions, client, streams)
    stats = IngestStats()
    consumer = EventConsumer(client, h.plane.handle_batch, stats, streams=streams, block_ms=0)
    consumer.ensure_group()
    expected: dict[str, tuple[Hostile, str]] = {}  # entry id -> (entry, must)
    genuine: set[str] = set()
    sent: dict[int, dict[tuple[str, int], Any]] = {}  # checkpoint -> subtask -> its ack
    barriers: dict[int, dict[tuple[str, int], int]] = {}

    def write(fields: dict[bytes, bytes]) -> str:
        return client.xadd(streams.events, fields).decode()  # type: ignore[arg-type,union-attr]

    def publish(attempt: int, payload: Any) -> None:
        env = p.envelope(h.job_id, attempt, h.clock.now_ms(), payload)
        genuine.add(write({FIELD: p.encode(env)}))

    def drain() -> None:
        while consumer.poll_once():
            pass
        h.plane.wait_idle()

    publish(0, registration(h))
    publish(1, p.JobStatusChanged(status=p.JobStatus.RUNNING))
    drain()
    h.commands()
    for spec in rounds:
        cid = h.trigger_periodic()
        rng = spec["seed"]
        own: list[tuple[str, Any]] = [("event", b) for b in h.barriers(cid, epoch=cid)]
        acks = [h.ack(1, cid, op, i) for op, n in TASKS.items() for i in range(n)]
        own += [("event", a) for a in acks]
        rng.shuffle(own)  # out of order: acknowledgements before barriers
        dupes = [("event", rng.choice([e for _, e in own])) for _ in range(spec["duplicates"])]
        hostile: list[tuple[str, Any]] = []
        for item in spec["hostile"]:
            resolved = (
                checkpoint_message(item, h, cid) if isinstance(item, dict) else expectation(item, h)
            )
            if resolved is not None:
                hostile.append(("hostile", resolved))
        stream = own + hostile
        rng.shuffle(stream)
        stream += dupes  # exact copies, after the originals (at-least-once delivery)
        sent[cid] = {(a.operator_id, a.subtask): a for a in acks}
        barriers[cid] = {
            (b.operator_id, b.subtask): b.timestamp
            for _, b in own
            if isinstance(b, p.BarrierInjected)
        }
        for what, item in stream:
            if what == "event":
                publish(1, item)
            else:
                entry, must = item
                event(f"{entry.label.split(' {')[0]}: {must}")
                expected[write(entry.fields)] = (entry, must)
        drain()
        # A refused event rolls its batch back and reloads the job from the database; a
        # completion whose _metadata was being written then is completed again at the next
        # timer tick (the server ticks every 50 ms).
        h.tick()
        completes = [
            payload.checkpoint_id
            for _, payload in h.commands()
            if isinstance(payload, p.NotifyCheckpointComplete)
        ]
        assert cid in completes, f"checkpoint {cid} did not complete"
    # The consumer still consumes: a last genuine event is applied.
    publish(1, p.Heartbeat(**TEMPLATES["heartbeat"]))
    drain()
    check(h, client, streams, stats, expected, genuine, sent, barriers)


def check(
    h: Harness,
    client: redis.Redis,
    streams: Streams,
    stats: IngestStats,
    expected: dict[str, tuple[Hostile, str]],
    genuine: set[str],
    sent: dict[int, dict[tuple[str, int], Any]],
    barriers: dict[int, dict[tuple[str, int], int]],
) -> None:
    # Step 1: everything was read and settled, nothing pending.
    assert client.xpending(streams.events, "control-plane")["pending"] == 0
    total = len(expected) + len(genuine)
    assert stats.events_ingested + stats.dead_letters == total
    letters = {
        fields[b"source_id"].decode(): fields[b"reason"].decode()
        for _, fields in client.xrange(streams.dead_letters)
    }
    assert stats.dead_letters == len(letters)
    # Step 2: the genuine events all applied; every bad one dead-lettered, with a reason that
    # is not a crash of the handler.
    assert not genuine & letters.keys(), [letters[g] for g in genuine & letters.keys()]
    for entry_id, (entry, must) in expected.items():
        if must == DEAD:
            assert entry_id in letters, f"{entry.label} was not dead-lettered"
    for entry_id, reason in letters.items():
        assert reason.strip(), entry_id
        # A refusal names what the event contradicts; any other error is the handler's crash.
        crashed = reason.startswith("handler failed") and "RejectedEventError" not in reason
        assert not crashed, f"{expected[entry_id][0].label}: {reason}"
    # Step 3: each checkpoint of the genuine job holds exactly what it sent.
    with h.sessions() as s:
        for cid, acks in sent.items():
            row = s.get(Checkpoint, (h.job_id, cid))
            assert row is not None and row.status == "COMPLETED", (cid, row and row.status)
            assert row.num_acknowledged_subtasks == len(acks)
            assert row.state_size == sum(a.state_size for a in acks.values())
            assert row.epoch == cid
            subtasks = s.scalars(
                select(CheckpointSubtask).where(
                    CheckpointSubtask.job_id == h.job_id, CheckpointSubtask.checkpoint_id == cid
                )
            ).all()
            assert {(t.operator_id, t.subtask) for t in subtasks} == set(acks)
            for t in subtasks:
                ack = acks[(t.operator_id, t.subtask)]
                assert t.ack == ack.model_dump(mode="json", exclude={"type"}), (cid, t.operator_id)
                assert (t.state_size, t.ack_timestamp, t.attempt) == (
                    ack.state_size,
                    ack.ack_timestamp,
                    1,
                )
                assert t.declined_reason is None
                assert t.barrier_timestamp == barriers[cid].get((t.operator_id, t.subtask))
                assert t.alignment_buffered in (None, ack.alignment_buffered_bytes)


# ----------------------------------------------------------------------------- the test


@pytest.fixture
def fuzz_sessions(sqlite_database_url: str) -> Any:
    engine = create_db_engine(sqlite_database_url)
    yield engine, session_factory(engine)
    engine.dispose()


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rounds=st.lists(ROUND, min_size=1, max_size=3))
def test_hostile_entries_never_stop_the_ingest_nor_corrupt_a_genuine_checkpoint(
    tmp_path: Path, fuzz_sessions: Any, client: redis.Redis, rounds: list[dict[str, Any]]
) -> None:
    engine, sessions = fuzz_sessions
    with engine.begin() as conn:  # each example on an empty database
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
    run_example(tmp_path, sessions, client, rounds)


def test_nan_and_infinite_numbers_are_refused() -> None:
    """A number JSON cannot hold (``NaN``, ``Infinity``) never reaches the database."""
    raw = dumps(
        {"type": "heartbeat", "job_id": "j", "attempt": 1, "timestamp": 1}
        | {"payload": {**TEMPLATES["heartbeat"], "duration_ms": math.nan}}
    )
    with pytest.raises(p.ProtocolError):
        p.decode(raw)
