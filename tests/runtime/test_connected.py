"""The connected driver against a scripted control plane, through the real Redis.

Each test runs the PV job with ``standalone=False`` on its own streams, while a
:class:`ScriptedControlPlane` thread plays the control plane's documented role (ids, triggers,
``_metadata``, completions, failovers) and whatever the test scripts on top of it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from examples import pv_count
from sparkpoint import protocol as p
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sources import GeneratorSource
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime.connected import ControlPlaneTimeoutError
from sparkpoint.runtime.driver import JobDriver, JobFailedError, JobResult
from sparkpoint.signing import JOB_KEY_ENV
from sparkpoint.testing import FailureInjection, line_counts, uncommitted_files
from sparkpoint.transport import COMMANDS_GROUP, FIELD, Streams

from ..support.redis_server import REDIS_URL
from ..support.waiting import wait_for
from .pv_harness import APPS, EPOCH_RECORDS, expected_every_lines, run_pv
from .scripted_control_plane import ScriptedControlPlane


def connected_options(
    base: Path, name: str, streams: Streams, *, timeout_ms: int = 60_000, **extra: Any
) -> JobOptions:
    return JobOptions(
        job_id=f"pv-{name}",
        standalone=False,
        redis_url=REDIS_URL,
        stream_prefix=streams.prefix,
        control_plane_timeout_ms=timeout_ms,
        checkpoint=CheckpointConfig(),
        checkpoint_dir=f"file://{base / name / 'chk'}",
        checkpoint_storage="filesystem",
        local_dir=str(base / name / "local"),
        max_epoch_records=EPOCH_RECORDS,
        min_epoch_records=EPOCH_RECORDS,
        **extra,
    )


def run_connected(
    spark: Any,
    options: JobOptions,
    out: Path,
    events: int,
    failure: FailureInjection | None = None,
) -> JobResult:
    """Run the PV job (``--emit every``, unpaced) connected to the control plane."""
    env = StreamExecutionEnvironment(options)
    argv = ["--events", str(events), "--apps", str(APPS), "--rate", "0", "--output", str(out)]
    pv_count.build(env, argv)
    env.graph.name = "pv-count"
    return JobDriver(env.graph, options, spark=spark, failure=failure).run()


def lines_up_to(positions: dict[str, int], events: int) -> Counter[str]:
    """The PV lines of every event before ``positions`` (a checkpoint's source positions)."""
    src = GeneratorSource(events=events, apps=APPS, rate=0)
    counts: Counter[str] = Counter()
    for split_id, offset in positions.items():
        split = src.split_ids().index(split_id)
        counts.update(src.read(split, 0, offset).column("app_id").tolist())
    return Counter(
        f'{{"app_id": "{app}", "pv": {k}}}' for app, n in counts.items() for k in range(1, n + 1)
    )


def statuses(cp: ScriptedControlPlane) -> list[tuple[int, str]]:
    return [(e.attempt, ev.status.value) for e, ev in cp.of_type(p.JobStatusChanged)]


def regular_completed(cp: ScriptedControlPlane) -> list[int]:
    return sorted(i for i, c in cp.completed.items() if c.kind is p.CheckpointKind.CHECKPOINT)


def job_types(cp: ScriptedControlPlane) -> set[str]:
    return {e.type for e, _ in cp.received}


pytestmark = pytest.mark.spark


def test_a_connected_job_commits_the_output_of_a_standalone_run(
    spark: Any, tmp_path: Path, client: redis.Redis, streams: Streams
) -> None:
    events = 6_000
    standalone, standalone_out = run_pv(spark, tmp_path, "standalone", events=events)
    out = tmp_path / "out"
    options = connected_options(tmp_path, "connected", streams)
    with ScriptedControlPlane(client, streams) as cp:
        result = run_connected(spark, options, out, events)
    assert cp.error is None
    assert line_counts(str(out)) == line_counts(standalone_out) == expected_every_lines(events)
    assert uncommitted_files(str(out)) == []
    assert (result.status, result.attempt, result.restores) == (p.JobStatus.FINISHED, 1, [])
    # Registered under attempt 0 with this process's incarnation, then obeyed restore(1).
    (registered_env, registered), *_ = cp.of_type(p.JobRegistered)
    assert registered_env.attempt == 0
    assert registered.incarnation is not None and len(registered.incarnation) == 32
    assert registered.config["from_checkpoint"] is None
    assert [r.checkpoint_id for _, r in cp.of_type(p.JobRestored)] == [None]
    assert statuses(cp) == [(1, "RUNNING"), (1, "FINISHED")]
    # The control plane's ids only: the job asked for the final checkpoint and committed what
    # the control plane completed, without deciding about checkpoints itself.
    assert len(cp.of_type(p.EndOfInput)) == 1
    finals = [c.checkpoint_id for c in cp.sent_payloads(p.TriggerCheckpoint) if c.is_final]
    assert finals == [max(cp.completed)]
    assert result.completed_checkpoints == sorted(cp.completed)
    committed = {ev.checkpoint_id for _, ev in cp.of_type(p.SinkCommitted)}
    assert committed == set(cp.completed)
    decisions = {"checkpoint_triggered", "checkpoint_completed", "checkpoint_aborted"}
    assert not job_types(cp) & decisions
    # (Liveness heartbeats carry the attempt of their instant: 0 until the first restore.)
    events = [e for e, _ in cp.received[1:] if e.type != "driver_heartbeat"]
    assert {e.attempt for e in events} == {1}
    # RUNNING names the session's Spark application, and each checkpoint's barrier epoch ran
    # as the Spark job group that the control plane shows beside the checkpoint.
    assert standalone.events is not None
    running = [
        ev
        for ev in (
            *standalone.events.of_type(p.JobStatusChanged),
            *(e for _, e in cp.of_type(p.JobStatusChanged)),
        )
        if isinstance(ev, p.JobStatusChanged) and ev.status is p.JobStatus.RUNNING
    ]
    sc = spark.sparkContext
    assert [(ev.spark_application_id, ev.spark_ui_url) for ev in running] == [
        (sc.applicationId, sc.uiWebUrl)
    ] * 2
    # The acknowledgements stand for their subtasks' barrier events: none reaches the control
    # plane, and each acknowledgement says when its subtask injected or received the barrier
    # (in the epoch of its checkpoint) and what its alignment held back.
    acks = [(env, ev) for env, ev in cp.of_type(p.SnapshotCompleted)]
    assert acks and not job_types(cp) & {
        "barrier_injected",
        "barrier_received",
        "alignment_completed",
        "sink_pre_committed",
    }
    for _, ack in acks:
        assert ack.barrier_timestamp is not None and ack.alignment_buffered_records is not None
        assert ack.barrier_timestamp <= ack.ack_timestamp
    carried = {ev.checkpoint_id: (env.attempt, ev.epoch) for env, ev in acks if ev.source_positions}
    assert set(cp.completed) <= set(carried)
    tracker = sc.statusTracker()
    for attempt, epoch in carried.values():
        assert tracker.getJobIdsForGroup(p.spark_job_group("pv-count", attempt, epoch))


def test_a_failure_is_restored_by_the_control_plane_and_stale_commands_are_ignored(
    spark: Any, tmp_path: Path, client: redis.Redis, streams: Streams
) -> None:
    events = 8_000
    stale: list[str] = []

    def after_failover(cp: ScriptedControlPlane, env: p.Envelope, event: Any) -> None:
        if isinstance(event, p.JobRestored) and env.attempt == 2 and not stale:
            # Commands of attempt 1, and restores that are not newer than attempt 2.
            cp.send(p.CancelJob(), attempt=1)
            cp.send(p.TriggerCheckpoint(checkpoint_id=999, trigger_timestamp=0), attempt=1)
            cp.send(p.RestoreJob(new_attempt=1), attempt=1)
            cp.send(p.RestoreJob(new_attempt=2), attempt=2)
            stale.append(cp.sent_ids[-1])

    out = tmp_path / "out"
    options = connected_options(tmp_path, "failover", streams)
    failure = FailureInjection("source", subtask=1, offset=2500)
    with ScriptedControlPlane(client, streams, on_event=after_failover) as cp:
        result = run_connected(spark, options, out, events, failure)
    assert cp.error is None
    assert line_counts(str(out)) == expected_every_lines(events)
    ((failed_env, failed),) = cp.of_type(p.TaskFailed)
    assert failed_env.attempt == 1 and "injected failure" in failed.cause
    # The whole job restarts (one region), and the report names the subtask that raised it.
    assert (failed.operator_id, failed.subtask, failed.region) == ("events", 1, None)
    # The control plane restored its latest completed checkpoint under attempt 2.
    restore = next(c for c in cp.sent_payloads(p.RestoreJob) if c.new_attempt == 2)
    restored = [(e.attempt, r.checkpoint_id) for e, r in cp.of_type(p.JobRestored)]
    assert restored == [(1, None), (2, restore.checkpoint_id)]
    assert result.restores == [restore.checkpoint_id]
    assert (result.status, result.attempt) == (p.JobStatus.FINISHED, 2)
    assert statuses(cp) == [(1, "RUNNING"), (2, "RESTARTING"), (2, "RUNNING"), (2, "FINISHED")]
    # RESTARTING says why, as the control plane told it (the console shows it).
    [restarting] = [
        ev for _, ev in cp.of_type(p.JobStatusChanged) if ev.status.value == "RESTARTING"
    ]
    assert "injected failure in source events[1]" in (restarting.cause or "")
    # The stale commands were read and acknowledged, and changed nothing.
    group = next(
        g
        for g in client.xinfo_groups(streams.commands(options.job_id))
        if g["name"].decode() == COMMANDS_GROUP
    )
    assert stale and _entry(group["last-delivered-id"]) >= _entry(stale[0])
    assert group["pending"] == 0
    barriers = [*cp.of_type(p.BarrierInjected), *cp.of_type(p.SnapshotCompleted)]
    assert 999 not in {ev.checkpoint_id for _, ev in barriers}


def test_restoring_an_earlier_checkpoint_while_running_replays_from_it(
    spark: Any, tmp_path: Path, client: redis.Redis, streams: Streams
) -> None:
    events = 12_000
    asked: dict[str, int] = {}

    def restore_first(cp: ScriptedControlPlane, env: p.Envelope, event: Any) -> None:
        regular = regular_completed(cp)
        if len(regular) >= 2 and not asked:
            asked.update(earlier=regular[0], committed=regular[-1])
            cp.restore_to(regular[0])

    out = tmp_path / "out"
    options = connected_options(tmp_path, "restore-to", streams)
    with ScriptedControlPlane(client, streams, on_event=restore_first) as cp:
        result = run_connected(spark, options, out, events)
    assert cp.error is None
    earlier, committed = asked["earlier"], asked["committed"]
    assert result.restores == [earlier] and result.attempt == 2
    # Sinks cannot un-commit: what was committed after the earlier checkpoint comes again.
    replayed = lines_up_to(cp.completed[committed].source_positions(), events) - lines_up_to(
        cp.completed[earlier].source_positions(), events
    )
    assert replayed
    assert line_counts(str(out)) == expected_every_lines(events) + replayed
    assert [e.attempt for e, _ in cp.of_type(p.JobRestored)] == [1, 2]
    # Checkpoint ids keep increasing after the restore.
    after = [c for c in cp.completed.values() if c.attempt == 2]
    assert after and min(c.checkpoint_id for c in after) > committed


def test_a_cancel_stops_the_job_without_committing_anything_further(
    spark: Any, tmp_path: Path, client: redis.Redis, streams: Streams
) -> None:
    events = 12_000

    def cancel_after_first(cp: ScriptedControlPlane, env: p.Envelope, event: Any) -> None:
        if regular_completed(cp) and not cp.sent_payloads(p.CancelJob):
            cp.cancel(cause="a user's request")

    out = tmp_path / "out"
    options = connected_options(tmp_path, "cancel", streams)
    with ScriptedControlPlane(client, streams, on_event=cancel_after_first) as cp:
        result = run_connected(spark, options, out, events)
    assert cp.error is None
    assert result.status is p.JobStatus.CANCELED
    (first,) = cp.completed
    assert result.completed_checkpoints == [first]
    assert line_counts(str(out)) == lines_up_to(cp.completed[first].source_positions(), events)
    assert statuses(cp)[-1] == (1, "CANCELED")
    assert {ev.checkpoint_id for _, ev in cp.of_type(p.SinkCommitted)} == {first}


def test_stop_with_savepoint_finishes_the_job_and_a_new_job_resumes_from_it(
    spark: Any,
    tmp_path: Path,
    client: redis.Redis,
    streams: Streams,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = 12_000
    savepoint: list[int] = []

    def stop_after_first(cp: ScriptedControlPlane, env: p.Envelope, event: Any) -> None:
        if regular_completed(cp) and not savepoint:
            savepoint.append(cp.stop_with_savepoint())

    out = tmp_path / "out"
    options = connected_options(tmp_path, "stop", streams)
    with ScriptedControlPlane(client, streams, on_event=stop_after_first) as cp:
        result = run_connected(spark, options, out, events)
    assert cp.error is None
    (sp,) = savepoint
    stopped = cp.completed[sp]
    assert stopped.kind is p.CheckpointKind.SAVEPOINT
    assert result.status is p.JobStatus.FINISHED and result.completed_checkpoints[-1] == sp
    assert not cp.of_type(p.EndOfInput)  # it stopped before its input ended
    # The driver's console names the savepoint it stopped with (the control plane decided it).
    assert f"savepoint {sp} completed" in capsys.readouterr().err
    positions = stopped.source_positions()
    assert sum(positions.values()) < events
    assert line_counts(str(out)) == lines_up_to(positions, events)
    # A new job from the savepoint's path finishes the input: exactly once over both.
    resumed = connected_options(
        tmp_path, "resumed", Streams(f"{streams.prefix}-2"), from_checkpoint=stopped.external_path
    )
    with ScriptedControlPlane(client, Streams(f"{streams.prefix}-2")) as cp2:
        result2 = run_connected(spark, resumed, out, events)
    assert cp2.error is None
    assert result2.status is p.JobStatus.FINISHED and result2.restores == [sp]
    assert line_counts(str(out)) == expected_every_lines(events)


def test_a_cancel_as_failed_fails_the_driver_with_the_cause(
    spark: Any, tmp_path: Path, client: redis.Redis, streams: Streams
) -> None:
    out = tmp_path / "out"
    options = connected_options(tmp_path, "fails", streams)
    failure = FailureInjection("source", subtask=0, offset=500)
    with (
        ScriptedControlPlane(client, streams, max_failovers=0) as cp,
        pytest.raises(JobFailedError, match=r"no more restarts after: .*injected failure"),
    ):
        run_connected(spark, options, out, 4_000, failure)
    assert cp.error is None
    assert statuses(cp)[-1][1] == "FAILED"
    assert "injected failure" in (cp.of_type(p.JobStatusChanged)[-1][1].cause or "")
    assert line_counts(str(out)) == Counter()


def test_back_pressure_runs_no_epoch_while_nine_checkpoints_wait_for_completion(
    spark: Any, tmp_path: Path, client: redis.Redis, streams: Streams
) -> None:
    events = 24_000  # 12 epochs
    out = tmp_path / "out"
    options = connected_options(tmp_path, "backpressure", streams)
    results: list[JobResult] = []
    with ScriptedControlPlane(client, streams, withhold_completions=True, burst=12) as cp:
        job = threading.Thread(
            target=lambda: results.append(run_connected(spark, options, out, events))
        )
        job.start()
        wait_for("nine completed checkpoints", lambda: len(cp.withheld) >= 9, every_s=0.05)
        time.sleep(1.5)  # a driver without back-pressure runs several more epochs meanwhile
        assert len(cp.of_type(p.Heartbeat)) == 9
        assert cp.withheld == list(range(1, 10))
        assert line_counts(str(out)) == Counter()
        cp.release()
        job.join(timeout=120)
    assert cp.error is None
    assert results and results[0].status is p.JobStatus.FINISHED
    assert line_counts(str(out)) == expected_every_lines(events)


def test_no_answer_from_the_control_plane_fails_after_the_timeout(
    tmp_path: Path,
    client: redis.Redis,
    streams: Streams,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(JOB_KEY_ENV, "00" * 32)  # no control plane, but a key to sign with
    options = connected_options(tmp_path, "alone", streams, timeout_ms=300)
    env = StreamExecutionEnvironment(options)
    pv_count.build(env, ["--events", "100", "--output", str(tmp_path / "out")])
    driver = JobDriver(env.graph, options)  # no Spark: the wait comes before it starts
    with pytest.raises(ControlPlaneTimeoutError, match=r"registration within 0\.3 s") as err:
        driver.run()
    assert f"job {options.job_id}" in str(err.value)
    assert streams.commands(options.job_id) in str(err.value)
    sent = [p.decode(f[FIELD]) for _, f in client.xrange(streams.events)]
    sent = [(e, payload) for e, payload in sent if e.type != "driver_heartbeat"]
    assert [(e.type, e.attempt) for e, _ in sent] == [("job_registered", 0), ("job_status", 0)]
    assert sent[1][1].status is p.JobStatus.FAILED
    # The user was told at once what the job waits for, then how it ended.
    said = capsys.readouterr().err
    assert f"waiting for the control plane's answer on {streams.commands(options.job_id)}" in said
    assert "FAILED" in said.splitlines()[-1]


def _entry(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, seq = text.split("-")
    return int(ms), int(seq)
