"""The control plane's frequent calls leave no reference cycles that grow with their input.

Objects in a reference cycle are freed only by Python's cyclic garbage collector, which holds
the interpreter for as long as it traverses: under 200 jobs a collection paused the server
(REST requests included) for 40-80 ms. Two calls made most of that garbage: ``GET /jobs`` and
the metrics built an alias of the checkpoints table per call (a copy of every column), and the
replay screen of every ingest batch built a ``(job, sender)`` tuple expression per sender.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from service_harness import Harness
from sqlalchemy.sql.elements import Tuple
from sqlalchemy.sql.schema import Column

from sparkpoint import protocol as p
from sparkpoint.transport import ReceivedMessage
from sparkpoint_server.service.senders import screen
from sparkpoint_server.storage.models import EventSender
from sparkpoint_server.storage.queries import list_jobs, metrics_snapshot


@contextmanager
def cyclic_garbage() -> Iterator[list[object]]:
    """The objects that only the cyclic collector frees, made inside the block."""
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what a collection finds, to look at it
    found: list[object] = []
    try:
        yield found
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()


def _messages(job_id: str, senders: int, seq: int = 1, entry: str = "1") -> list[ReceivedMessage]:
    messages = []
    for i in range(senders):
        env = p.Envelope(
            type="heartbeat",
            job_id=job_id,
            attempt=1,
            timestamp=1,
            payload={},
            sender=f"sender-{i}",
            seq=seq,
        )
        messages.append(ReceivedMessage(f"{entry}-{i}", env, env))  # screen reads no payload
    return messages


def test_the_jobs_list_and_the_metrics_copy_no_table_per_call(harness: Harness) -> None:
    with harness.sessions() as session:
        list_jobs(session, harness.clock.now_ms())  # statements compiled and cached
        metrics_snapshot(session)
        with cyclic_garbage() as garbage:
            for _ in range(3):
                list_jobs(session, harness.clock.now_ms())
                metrics_snapshot(session)
    assert [o for o in garbage if isinstance(o, Column)] == []


def test_the_replay_screen_builds_no_expression_per_sender(harness: Harness) -> None:
    with harness.sessions() as session:
        fresh, replays = screen(session, _messages(harness.job_id, 3))  # compiled and cached
        assert (len(fresh), replays) == (3, [])
        session.rollback()
        with cyclic_garbage() as garbage:
            fresh, replays = screen(session, _messages(harness.job_id, 200))
        assert (len(fresh), replays) == (200, [])
    assert [o for o in garbage if isinstance(o, Tuple)] == []


def test_the_replay_screen_keeps_each_senders_highest_seq_within_a_batch(
    harness: Harness,
) -> None:
    # The screen keeps the batch's sequence numbers in a dict and writes the rows once.
    [one], [two], [again] = (
        _messages(harness.job_id, 1, seq, entry) for seq, entry in ((1, "5"), (2, "6"), (1, "7"))
    )
    with harness.sessions() as session:
        fresh, replays = screen(session, [one, two, again])
        session.commit()
        row = session.get(EventSender, (harness.job_id, "sender-0"))
        assert row is not None
        stored = (row.last_seq, row.last_entry_id)
    assert [m.entry_id for m in fresh] == ["5-0", "6-0"]
    assert [r.entry_id for r in replays] == ["7-0"]
    assert "seq 1 of sender sender-0 is not above the last applied, 2 (entry 6-0)" in (
        replays[0].reason
    )
    assert stored == (2, "6-0")
