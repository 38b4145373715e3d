"""Storage that hangs or raises: the savepoint or checkpoint fails alone, nothing else waits."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fsspec.implementations.webhdfs import WebHDFS
from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint.transport import ReceivedMessage
from sparkpoint_server.config import load_settings
from sparkpoint_server.errors import ConflictError
from sparkpoint_server.service import completions
from sparkpoint_server.storage.models import Checkpoint, JobException, Operation

TIMEOUT_S = 4.0  # the storage timeout of these tests
PROMPT_S = 0.8  # how long a call that must not wait for storage may take


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a hung namenode)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def _configure(h: Harness, roots: str) -> None:
    h.settings = load_settings(
        data_dir=str(h.tmp / "data"), storage_timeout=TIMEOUT_S, storage_roots=roots
    )
    h.new_control_plane()


def _second_job(h: Harness) -> Harness:
    """Another job on the same control plane, with its own checkpoint directory."""
    other = Harness(h.tmp / "other", h.sessions, h.client, h.streams, clock=h.clock)
    other.cp = h.plane
    return other


def _acks(h: Harness, checkpoint_id: int) -> list[ReceivedMessage]:
    acks = [
        h.ack(1, checkpoint_id, op, i) for op, n in {"source": 2, "pv": 2}.items() for i in range(n)
    ]
    return [
        ReceivedMessage(f"0-{i}", p.envelope(h.job_id, 1, h.clock.now_ms(), a), a)
        for i, a in enumerate(acks)
    ]


def _row(h: Harness, checkpoint_id: int) -> Checkpoint:
    with h.sessions() as s:
        row = s.get(Checkpoint, (h.job_id, checkpoint_id))
        assert row is not None
        return row


def _op(h: Harness, request_id: str) -> Operation:
    with h.sessions() as s:
        op = s.get(Operation, request_id)
        assert op is not None
        return op


def _within(seconds: float, fn: Any, *args: Any) -> None:
    """Run ``fn`` on a thread; fail if it has not returned after ``seconds`` (it hangs)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__} blocked for more than {seconds} s"
    if errors:
        raise errors[0]


def test_a_hung_savepoint_target_blocks_neither_ingest_nor_other_jobs(
    harness: Harness, silent_listener: int
) -> None:
    target = f"webhdfs://127.0.0.1:{silent_listener}/savepoints"
    _configure(harness, f"{harness.tmp},{target}")
    other = _second_job(harness)
    harness.start()
    other.start()
    request = harness.plane.trigger_savepoint(harness.job_id, target, cancel_job=False)
    [trigger] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    # The last acknowledgement completes the savepoint; its copy to the silent target hangs,
    # outside the lock: the batch returns at once.
    _within(PROMPT_S, harness.plane.handle_batch, _acks(harness, trigger.checkpoint_id))
    assert _row(harness, trigger.checkpoint_id).status == "IN_PROGRESS"
    # Meanwhile the other job checkpoints, and REST mutations answer.
    other.clock.advance(1000)
    _within(PROMPT_S, other.plane.tick)
    [cid] = [c.checkpoint_id for _, c in other.commands() if isinstance(c, p.TriggerCheckpoint)]
    _within(PROMPT_S, other.plane.handle_batch, _acks(other, cid))
    _within(PROMPT_S, other.plane.update_checkpoint_config, other.job_id, {"retained": 2})
    deadline = time.monotonic() + PROMPT_S
    while _row(other, cid).status != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _row(other, cid).status == "COMPLETED"
    assert _row(harness, trigger.checkpoint_id).status == "IN_PROGRESS"
    # After the storage timeout the savepoint fails alone, naming the cause.
    harness.plane.wait_idle()
    row = _row(harness, trigger.checkpoint_id)
    assert (row.status, row.failure_reason) == ("FAILED", "FINALIZE_CHECKPOINT_FAILURE")
    assert f"did not answer within {TIMEOUT_S:g} s" in (row.failure_message or "")
    assert target in (row.failure_message or "")
    op = _op(harness, request)
    assert op.status == "FAILED" and "did not answer" in (op.failure_cause or "")
    # The job went on: its periodic checkpoint was triggered (at the other job's tick).
    commands = [c for _, c in harness.commands()]
    assert [type(c).__name__ for c in commands] == ["TriggerCheckpoint", "NotifyCheckpointAborted"]
    assert commands[0].checkpoint_id == trigger.checkpoint_id + 1
    assert harness.plane.jobs[harness.job_id].status is p.JobStatus.RUNNING


def test_a_storage_error_of_any_type_fails_the_savepoint_alone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_credentials(*_: Any, **__: Any) -> None:  # as s3 raises without credentials
        raise RuntimeError("Unable to locate credentials")

    monkeypatch.setattr(WebHDFS, "makedirs", no_credentials)
    target = "webhdfs://127.0.0.1:9/sp"
    _configure(harness, f"{harness.tmp},{target}")
    harness.start()
    request = harness.plane.trigger_savepoint(harness.job_id, target, False)
    [trigger] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    # The acknowledgements are applied (the batch does not fail: nothing is dead-lettered).
    harness.plane.handle_batch(_acks(harness, trigger.checkpoint_id))
    harness.plane.wait_idle()
    row = _row(harness, trigger.checkpoint_id)
    assert (row.status, row.num_acknowledged_subtasks) == ("FAILED", 4)
    assert "RuntimeError: Unable to locate credentials" in (row.failure_message or "")
    assert "missing" not in (row.failure_message or "")
    assert "Unable to locate credentials" in (_op(harness, request).failure_cause or "")
    assert "checkpoint_abort" in harness.command_types()
    # Periodic checkpoints go on and complete.
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid)
    assert _row(harness, cid).status == "COMPLETED"


def test_a_checkpoint_whose_metadata_write_raises_fails_alone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.start()
    cid = harness.trigger_periodic()
    rt = harness.plane.jobs[harness.job_id]

    def broken(*_: Any) -> str:
        raise ValueError("malformed URL")

    monkeypatch.setattr(rt.storage, "write_metadata", broken)
    harness.plane.handle_batch(_acks(harness, cid))
    harness.plane.wait_idle()
    row = _row(harness, cid)
    assert (row.status, row.failure_reason) == ("FAILED", "FINALIZE_CHECKPOINT_FAILURE")
    assert "ValueError: malformed URL" in (row.failure_message or "")


def test_a_completion_whose_write_cannot_start_fails_alone_and_the_next_ones_complete(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the write raised (its metadata, or a thread that cannot start): before, the
    error escaped the unit after its commit, hid the one before it, and the job's later
    completions waited for that write for good."""
    harness.start()
    cid = harness.trigger_periodic()
    writer = completions.completion_writer

    def cannot_start(*_: Any) -> None:
        monkeypatch.setattr(completions, "completion_writer", writer)  # once
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(completions, "completion_writer", cannot_start)
    harness.ack_all(1, cid)  # the unit commits; its completion's write fails at once
    row = _row(harness, cid)
    assert (row.status, row.failure_reason) == ("FAILED", "FINALIZE_CHECKPOINT_FAILURE")
    assert "RuntimeError: can't start new thread" in (row.failure_message or "")
    nxt = harness.trigger_periodic()
    harness.ack_all(1, nxt)
    assert _row(harness, nxt).status == "COMPLETED"


def test_a_completion_whose_finishing_unit_failed_completes_at_the_next_tick(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.start()
    cid = harness.trigger_periodic()
    finish = completions.finish_completion

    def database_gone(*_: Any) -> None:
        monkeypatch.setattr(completions, "finish_completion", finish)  # once
        raise RuntimeError("database gone")

    monkeypatch.setattr(completions, "finish_completion", database_gone)
    harness.ack_all(1, cid)  # written, but not recorded: the job is rebuilt from its rows
    assert _row(harness, cid).status == "IN_PROGRESS"
    assert "checkpoint_complete" not in harness.command_types()
    harness.tick()
    row = _row(harness, cid)
    assert (row.status, row.num_acknowledged_subtasks) == ("COMPLETED", 4)
    assert harness.command_types() == ["checkpoint_complete"]
    harness.new_control_plane()  # and a restart finds it completed, retained
    assert harness.plane.jobs[harness.job_id].coordinator.store.get(cid) is not None


def _write_blocked(h: Harness, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The job's ``_metadata`` writes wait until the returned event is set."""
    storage = h.plane.jobs[h.job_id].storage
    write, release = storage.write_metadata, threading.Event()

    def slow(*args: Any) -> Any:
        release.wait(5)
        return write(*args)

    monkeypatch.setattr(storage, "write_metadata", slow)
    return release


def test_a_failover_while_metadata_is_written_restores_the_last_written_checkpoint(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.start()
    first = harness.trigger_periodic()
    harness.ack_all(1, first)
    second = harness.trigger_periodic()
    release = _write_blocked(harness, monkeypatch)
    harness.commands()
    with monkeypatch.context() as m:  # the second's _metadata is still being written when...
        m.setattr(harness.plane, "wait_idle", lambda: None)
        harness.ack_all(1, second)
        harness.register(incarnation="driver-2")  # ...the driver restarts: a failover
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, first)
    row = _row(harness, second)
    assert (row.status, row.failure_reason) == ("FAILED", "FINALIZE_CHECKPOINT_FAILURE")
    assert "failed over" in (row.failure_message or "")
    release.set()
    harness.plane.wait_idle()
    assert _row(harness, second).status == "FAILED"
    assert "checkpoint_complete" not in harness.command_types()
    assert not os.path.exists(os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{second}"))


def test_a_restore_while_metadata_is_written_fails_that_completion_first(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.start(retained=2)
    first = harness.trigger_periodic()
    harness.ack_all(1, first)
    second = harness.trigger_periodic()
    release = _write_blocked(harness, monkeypatch)
    harness.commands()
    with monkeypatch.context() as m:
        m.setattr(harness.plane, "wait_idle", lambda: None)
        harness.ack_all(1, second)
    with pytest.raises(ConflictError, match=f"checkpoint {second} of job .* still being written"):
        harness.plane.restore(harness.job_id, second, None)
    harness.plane.restore(harness.job_id, first, None)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, first)
    row = _row(harness, second)
    assert row.status == "FAILED"
    assert f"restore of checkpoint {first} requested before" in (row.failure_message or "")
    with harness.sessions() as s:  # a restore, not a job failure (tolerable failures: 0)
        assert s.query(JobException).filter_by(job_id=harness.job_id).count() == 0
    release.set()
    harness.plane.wait_idle()
    assert "checkpoint_complete" not in harness.command_types()
