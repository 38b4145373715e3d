"""Commands obeyed while an epoch runs: a connected job's completed checkpoints commit at once.

The reader alone, on the real Redis (order, what waits for the epoch's end, a stop that ends
its blocking read at once), and the PV job connected to a scripted control plane in this
process: each checkpoint's sinks commit while the next epoch runs, not after it, and the
committed output is the same as without failures, also when the job fails and restores.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sparkpoint import FileSink, GeneratorSource
from sparkpoint import protocol as p
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.protocol import SinkTransactionModel
from sparkpoint.runtime import driver as driver_module
from sparkpoint.runtime import epoch_commands
from sparkpoint.runtime.driver import JobDriver, JobResult
from sparkpoint.runtime.epoch_commands import EpochCommandReader
from sparkpoint.runtime.local import LocalEpochRunner
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.testing import FailureInjection, line_counts, uncommitted_files
from sparkpoint.transport import CommandChannel, ReceivedMessage, Streams, send_command

from ..e2e.control_plane import free_port
from ..support.waiting import wait_for
from .pv_harness import APPS, expected_every_lines
from .scripted_control_plane import ScriptedControlPlane
from .test_connected import connected_options

JOB = "reader-job"


@pytest.fixture
def channel(client: redis.Redis, streams: Streams) -> Iterator[CommandChannel]:
    channel = CommandChannel(client, JOB, uuid.uuid4().hex, streams)
    channel.open()
    yield channel


def _send(client: redis.Redis, streams: Streams, *payloads: Any) -> None:
    for payload in payloads:
        send_command(client, streams, JOB, 1, 0, payload)


def _complete(cid: int) -> p.NotifyCheckpointComplete:
    return p.NotifyCheckpointComplete(checkpoint_id=cid)


def test_the_reader_obeys_in_order_and_holds_the_first_command_it_may_not_obey_and_all_after(
    client: redis.Redis, streams: Streams, channel: CommandChannel
) -> None:
    obeyed: list[int] = []

    def obey(message: ReceivedMessage) -> bool:
        if not isinstance(message.payload, p.NotifyCheckpointComplete):
            return False
        obeyed.append(message.payload.checkpoint_id)
        return True

    reader = EpochCommandReader(channel, obey)
    reader.start()
    _send(client, streams, _complete(1), _complete(2))
    wait_for("two completions obeyed", lambda: obeyed == [1, 2], 10, every_s=0.01)
    cancel = p.CancelJob(cause="stop")
    _send(client, streams, cancel, _complete(3))
    thread = reader._thread
    assert thread is not None
    wait_for("the reader to hold the cancel and stop reading", lambda: not thread.is_alive(), 10)
    reader.stop()
    # What the driver's thread obeys next, as the driver reads it: held first, then the rest.
    held = reader.held()
    after = held + channel.read()
    assert obeyed == [1, 2]
    assert reader.obeyed == 2
    assert [m.payload for m in after] == [cancel, _complete(3)]
    assert held[0].payload == cancel
    # Obeyed commands are acknowledged; held ones wait for whoever obeys them.
    assert client.xpending(channel.stream, "job")["pending"] == 2
    channel.ack([m.entry_id for m in after])
    reader.close()


def test_a_stop_ends_the_readers_blocking_read_at_once(
    channel: CommandChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read that would block for 8 s: without CLIENT UNBLOCK the stop would wait that long.
    monkeypatch.setattr(epoch_commands, "READ_BLOCK_MS", 8_000)
    reader = EpochCommandReader(channel, lambda _: True)
    reader.start()
    time.sleep(0.2)  # the thread is blocked in XREADGROUP now
    started = time.monotonic()
    reader.stop()
    assert time.monotonic() - started < 4
    assert reader.held() == []
    reader.close()


def test_an_error_on_the_readers_thread_reaches_the_drivers_thread(
    client: redis.Redis, streams: Streams, channel: CommandChannel
) -> None:
    def obey(message: ReceivedMessage) -> bool:
        raise RuntimeError(f"cannot obey {message.envelope.type}")

    reader = EpochCommandReader(channel, obey)
    reader.start()
    _send(client, streams, _complete(1))
    thread = reader._thread
    assert thread is not None
    wait_for("the reader's thread to end", lambda: not thread.is_alive(), 10)
    reader.stop()
    with pytest.raises(RuntimeError, match="cannot obey checkpoint_complete"):
        reader.held()
    reader.close()


class _WaitsForCommits(LocalEpochRunner):
    """Each epoch after one that carried a barrier starts with a wait: until the control plane
    completed that checkpoint (it withholds the job's notification), then, having sent it,
    until the job committed it (``sink_committed`` reached the control plane), at most
    ``patience_s``. A driver that obeys completions only between epochs cannot commit then."""

    def __init__(self, graph: Any, cp: ScriptedControlPlane, patience_s: float) -> None:
        super().__init__(graph)
        self.cp = cp
        self.patience_s = patience_s
        self.previous: EpochPlan | None = None
        self.waited: list[tuple[int, bool]] = []  # (checkpoint, committed while the epoch ran)

    def run(self, plan: EpochPlan) -> list[TaskReport]:
        before, self.previous = self.previous, plan
        if before is not None and before.barrier is not None and before.attempt == plan.attempt:
            cid = before.barrier.checkpoint_id
            deadline = time.monotonic() + self.patience_s
            while time.monotonic() < deadline and cid not in self.cp.completed:
                time.sleep(0.005)
            self.cp.send_withheld()
            while time.monotonic() < deadline and cid not in self._committed():
                time.sleep(0.005)
            self.waited.append((cid, cid in self._committed()))
            if cid not in self._committed():
                self.patience_s = 0  # shown once; the rest of the run goes at full speed
                self.cp.send_withheld()
        return super().run(plan)

    def _committed(self) -> set[int]:
        return {ev.checkpoint_id for _, ev in self.cp.of_type(p.SinkCommitted)}


def _run_connected_in_process(
    tmp_path: Path,
    cp: ScriptedControlPlane,
    streams: Streams,
    monkeypatch: pytest.MonkeyPatch,
    *,
    events: int,
    failure: FailureInjection | None = None,
    sink: type[FileSink] = FileSink,
    **sink_args: Any,
) -> tuple[JobResult, _WaitsForCommits, Path]:
    runners: list[_WaitsForCommits] = []

    def runner(graph: Any) -> _WaitsForCommits:
        runners.append(_WaitsForCommits(graph, cp, patience_s=10))
        return runners[-1]

    monkeypatch.setattr(driver_module, "LocalEpochRunner", runner)
    out = tmp_path / "out"
    options = connected_options(tmp_path, "during", streams)
    env = StreamExecutionEnvironment(options)
    (
        env.from_source(GeneratorSource(events=events, apps=APPS, rate=0), uid="events")
        .key_by("app_id")
        .count(uid="pv", output="pv")
        .sink_to(sink(str(out), **sink_args), uid="sink")
    )
    env.graph.name = "pv-count"
    result = JobDriver(env.graph, options, failure=failure, in_process=True).run()
    return result, runners[0], out


def test_a_completed_checkpoint_commits_while_the_next_epoch_runs(
    tmp_path: Path, client: redis.Redis, streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = 8_000  # 4 epochs of 1,000 records per split
    with ScriptedControlPlane(client, streams, completions_on_request=True) as cp:
        result, runner, out = _run_connected_in_process(
            tmp_path, cp, streams, monkeypatch, events=events
        )
    assert cp.error is None
    assert result.status is p.JobStatus.FINISHED
    assert runner.waited, "no epoch ran after an epoch that carried a barrier"
    assert all(committed for _, committed in runner.waited), runner.waited
    assert line_counts(str(out)) == expected_every_lines(events)
    assert uncommitted_files(str(out)) == []
    assert {ev.checkpoint_id for _, ev in cp.of_type(p.SinkCommitted)} == set(cp.completed)


def test_commits_during_epochs_keep_exactly_once_through_a_failure_and_restore(
    tmp_path: Path, client: redis.Redis, streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = 8_000
    failure = FailureInjection("source", subtask=1, offset=2_500)
    with ScriptedControlPlane(client, streams, completions_on_request=True) as cp:
        result, runner, out = _run_connected_in_process(
            tmp_path, cp, streams, monkeypatch, events=events, failure=failure
        )
    assert cp.error is None
    assert (result.status, result.attempt) == (p.JobStatus.FINISHED, 2)
    assert any(committed for _, committed in runner.waited)
    assert line_counts(str(out)) == expected_every_lines(events)
    assert uncommitted_files(str(out)) == []
    # One failure, reported once.
    assert len(cp.of_type(p.TaskFailed)) == 1


class _CommitFailsOnce(FileSink):
    """A file sink whose ``fail_on``-th commit (on the driver) raises, once."""

    def __init__(self, directory: str, fail_on: int) -> None:
        super().__init__(directory)
        self.fail_on = fail_on
        self.commits = 0

    def commit(self, uid: str, transaction: SinkTransactionModel) -> int:
        self.commits += 1
        if self.commits == self.fail_on:
            raise OSError(f"disk gone while committing {transaction.transaction_id}")
        return super().commit(uid, transaction)


def test_a_commit_that_fails_while_an_epoch_runs_is_reported_once_and_restored(
    tmp_path: Path, client: redis.Redis, streams: Streams, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = 8_000
    with ScriptedControlPlane(client, streams, completions_on_request=True) as cp:
        result, runner, out = _run_connected_in_process(
            tmp_path, cp, streams, monkeypatch, events=events, sink=_CommitFailsOnce, fail_on=2
        )
    assert cp.error is None
    assert (result.status, result.attempt) == (p.JobStatus.FINISHED, 2)
    (_, failed), *more = cp.of_type(p.TaskFailed)
    assert more == []
    assert re.search(r"committing checkpoint \d+ failed: disk gone while committing", failed.cause)
    # The commit failed while the next epoch ran (the epoch then waited for the decision).
    assert runner.waited[:1] == [(1, True)], runner.waited
    # The restore committed the checkpoint again; every line once.
    assert line_counts(str(out)) == expected_every_lines(events)
    assert uncommitted_files(str(out)) == []


def test_without_redis_at_an_epochs_start_its_commands_wait_for_its_end() -> None:
    gone = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    reader = EpochCommandReader(CommandChannel(gone, JOB, "c"), lambda _: True)
    reader.start()  # no thread: the driver's next read reports Redis as it always did
    assert reader._thread is None
    reader.stop()
    assert reader.held() == []
    reader.close()
