"""The connected driver's life between epochs, without Spark, on the real Redis.

Its heartbeats: it tells the control plane it is alive on a timer from its registration on,
also while it waits for its first command (Spark starts only after it). Its cancel by a
signal (``Authority.request_cancel``): at the next epoch boundary it reports CANCELLING and
CANCELED, so the control plane neither restarts it nor waits for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from examples import pv_count
from sparkpoint import protocol as p
from sparkpoint.errors import ConfigurationError
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime.connected import ControlPlaneAuthority
from sparkpoint.runtime.driver import JobDriver
from sparkpoint.runtime.epochs import EpochRunner, unacknowledged
from sparkpoint.runtime.heartbeats import heartbeat_interval_ms, previous_failure
from sparkpoint.runtime.planner import holds_records
from sparkpoint.signing import JOB_KEY_ENV, Signer
from sparkpoint.transport import FIELD, Streams, send_command

from ..support.acks import bare_ack
from ..support.redis_server import REDIS_URL
from ..support.waiting import wait_for

KEY = bytes(range(32))  # the drivers' job key (SPARKPOINT_JOB_KEY): commands are signed with it
SIGNER = Signer(lambda _: KEY, "test-control-plane")


@pytest.fixture(autouse=True)
def _job_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOB_KEY_ENV, KEY.hex())


def _events(client: redis.Redis, streams: Streams) -> list[tuple[p.Envelope, Any]]:
    return [p.decode(f[FIELD]) for _, f in client.xrange(streams.events)]


def _driver(streams: Streams, tmp_path: Path, *job_args: str) -> JobDriver:
    """A connected PV job's driver (Spark is never started); ``job_args``: the job's own."""
    options = JobOptions(
        job_id=f"hb-{uuid.uuid4().hex[:8]}",
        standalone=False,
        redis_url=REDIS_URL,
        stream_prefix=streams.prefix,
        control_plane_timeout_ms=30_000,
        checkpoint_dir=f"file://{tmp_path / 'chk'}",
        local_dir=str(tmp_path / "local"),
    )
    env = StreamExecutionEnvironment(options)
    pv_count.build(env, ["--events", "10", "--output", str(tmp_path / "out"), *job_args])
    return JobDriver(env.graph, options)


def _registered(driver: JobDriver, client: redis.Redis, streams: Streams) -> threading.Thread:
    """The driver's ``prepare`` on a thread, once it registered: it waits for the first
    restore (or a cancel)."""
    waiting = threading.Thread(target=driver.authority.prepare)
    waiting.start()
    wait_for(
        "the registration",
        lambda: any(isinstance(ev, p.JobRegistered) for _, ev in _events(client, streams)),
        20,
        every_s=0.02,
    )
    return waiting


def _statuses(client: redis.Redis, streams: Streams) -> list[str]:
    return [
        ev.status.value for _, ev in _events(client, streams) if isinstance(ev, p.JobStatusChanged)
    ]


def test_a_waiting_driver_sends_heartbeats_and_says_why_its_predecessor_ended(
    client: redis.Redis, streams: Streams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKPOINT_HEARTBEAT_INTERVAL", "0.05")
    monkeypatch.setenv("SPARKPOINT_PREVIOUS_DRIVER_FAILURE", "driver exited\nwith code 137")
    driver = _driver(streams, tmp_path)
    options = driver.options
    waiting = threading.Thread(target=driver.authority.prepare)
    waiting.start()  # registers, then waits for the control plane's answer
    try:
        beats = wait_for(
            "three driver heartbeats",
            lambda: [
                (e, ev) for e, ev in _events(client, streams) if isinstance(ev, p.DriverHeartbeat)
            ][2:],
            20,
            every_s=0.02,
        )
    finally:
        send_command(client, streams, options.job_id, 0, 0, p.CancelJob(), signer=SIGNER)
        waiting.join(timeout=20)
    [registered] = [ev for _, ev in _events(client, streams) if isinstance(ev, p.JobRegistered)]
    assert registered.heartbeat_interval_ms == 50
    assert registered.previous_failure == "driver exited with code 137"
    assert {ev.incarnation for _, ev in beats} == {registered.incarnation}
    assert {e.job_id for e, _ in beats} == {options.job_id}
    driver.authority.close()
    count = len(_events(client, streams))
    time.sleep(0.2)  # four intervals: a stopped sender sends nothing more
    assert len(_events(client, streams)) == count


def test_the_heartbeat_interval_and_the_previous_failure_come_from_the_environment() -> None:
    assert heartbeat_interval_ms("j", {}) == 10_000
    assert heartbeat_interval_ms("j", {"SPARKPOINT_HEARTBEAT_INTERVAL": "2.5"}) == 2500
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ConfigurationError, match="job j: SPARKPOINT_HEARTBEAT_INTERVAL"):
            heartbeat_interval_ms("j", {"SPARKPOINT_HEARTBEAT_INTERVAL": bad})
    assert previous_failure({}) is None
    assert previous_failure({"SPARKPOINT_PREVIOUS_DRIVER_FAILURE": "  "}) is None
    assert previous_failure({"SPARKPOINT_PREVIOUS_DRIVER_FAILURE": "x" * 5000}) == "x" * 1000


def test_a_signal_while_waiting_for_the_first_restore_cancels_the_job(
    client: redis.Redis, streams: Streams, tmp_path: Path
) -> None:
    driver = _driver(streams, tmp_path)
    waiting = _registered(driver, client, streams)
    driver.authority.request_cancel()  # what the driver's SIGTERM handler calls
    waiting.join(timeout=20)
    assert not waiting.is_alive()
    driver.authority.close()
    assert _statuses(client, streams) == ["CANCELLING", "CANCELED"]
    assert driver.job.status is p.JobStatus.CANCELED


def test_a_signal_cancels_a_running_job_at_the_next_epoch_boundary(
    client: redis.Redis, streams: Streams, tmp_path: Path
) -> None:
    driver = _driver(streams, tmp_path)
    starting = _registered(driver, client, streams)
    send_command(
        client, streams, driver.options.job_id, 1, 0, p.RestoreJob(new_attempt=1), signer=SIGNER
    )
    starting.join(timeout=20)
    driver.authority.request_cancel()  # what the driver's SIGTERM handler calls
    # No epoch may start: the runner is never called (it would fail on a plain object).
    driver.authority.run(cast(EpochRunner, object()))
    driver.authority.close()
    assert _statuses(client, streams) == ["RUNNING", "CANCELLING", "CANCELED"]
    assert driver.job.epoch == 0


def test_a_checkpoint_timeout_the_control_plane_changed_bounds_the_epochs(
    client: redis.Redis, streams: Streams, tmp_path: Path
) -> None:
    # PATCH /jobs/{id}/checkpoints/config: the planner keeps two epochs within the timeout
    # the control plane expires checkpoints by, not the one the job started with.
    driver = _driver(streams, tmp_path)
    authority = driver.authority
    assert isinstance(authority, ControlPlaneAuthority)
    assert driver.job.planner.checkpoint_timeout_ms == 600_000
    for changes, timeout in (
        ({"timeout_ms": 5_000, "retained": 3}, 5_000),
        ({"retained": 2}, 5_000),
    ):
        command = p.ConfigurationChanged(changes=changes)
        authority._obey_one(p.envelope(driver.job_id, 1, 0, command), command)
        assert driver.job.planner.checkpoint_timeout_ms == timeout
    driver.authority.close()


def test_only_the_barrier_events_of_subtasks_that_acknowledged_are_left_to_their_acks() -> None:
    """A connected job leaves out the barrier, alignment and pre-commit events of a subtask
    whose acknowledgement of that checkpoint goes out in the same epoch; a subtask that
    declined (or another checkpoint's events) keeps them: they say how far it got."""

    def received(cid: int, op: str, i: int) -> p.BarrierReceived:
        return p.BarrierReceived(
            checkpoint_id=cid, operator_id=op, subtask=i, channel=0, timestamp=1
        )

    pre_commit = p.SinkPreCommitted(
        checkpoint_id=4,
        operator_id="pv",
        subtask=0,
        transaction=p.SinkTransactionModel(transaction_id="t", parts=[]),
    )
    failed = p.TaskFailed(operator_id="pv", subtask=1, epoch=3, cause="boom")
    events = [
        received(4, "pv", 0),
        pre_commit,
        received(4, "pv", 1),  # pv[1] declined checkpoint 4
        received(5, "pv", 0),  # checkpoint 5 not acknowledged in this epoch
        failed,
    ]
    assert unacknowledged(events, [bare_ack(4, "pv", 0, epoch=3)]) == [
        received(4, "pv", 1),
        received(5, "pv", 0),
        failed,
    ]
    assert unacknowledged(events, []) == events


@pytest.mark.parametrize(("attempt", "took_over_at"), [(3, 3), (1, None)])
def test_a_driver_whose_first_restore_is_a_later_attempt_took_over_the_job(
    client: redis.Redis, streams: Streams, tmp_path: Path, attempt: int, took_over_at: int | None
) -> None:
    """The supervisor's next driver (the one before died) gets attempt 3 first: its console's
    end line counts from there. A first driver gets attempt 1."""
    driver = _driver(streams, tmp_path)
    waiting = _registered(driver, client, streams)
    job_id = driver.options.job_id
    send_command(
        client, streams, job_id, attempt, 0, p.RestoreJob(new_attempt=attempt), signer=SIGNER
    )
    waiting.join(timeout=20)
    assert not waiting.is_alive()
    driver.authority.close()
    assert driver.job.attempt == attempt
    assert driver.console.took_over_at == took_over_at


def test_an_attempts_first_epoch_runs_at_once_even_with_nothing_to_read(
    client: redis.Redis, streams: Streams, tmp_path: Path
) -> None:
    """Its heartbeat tells the control plane that the attempt's tasks run (the registration
    says it comes): periodic checkpoints wait for it, so an idle job that ran no epoch until
    a barrier came would never be checkpointed. After it, an idle job waits for commands."""
    idle = ("--source-redis", REDIS_URL, "--redis-stream", f"idle-{uuid.uuid4().hex[:8]}")
    driver = _driver(streams, tmp_path, *idle)
    starting = _registered(driver, client, streams)
    [registered] = [ev for _, ev in _events(client, streams) if isinstance(ev, p.JobRegistered)]
    assert registered.first_epoch_heartbeat
    send_command(
        client, streams, driver.options.job_id, 1, 0, p.RestoreJob(new_attempt=1), signer=SIGNER
    )
    starting.join(timeout=20)
    authority = driver.authority
    assert isinstance(authority, ControlPlaneAuthority)
    first = authority._next_epoch()
    assert first is not None
    ranges, barrier = first
    assert not holds_records(ranges) and barrier is None
    authority._epoch_attempt = 1  # what run() records once that epoch ended
    assert authority._next_epoch() is None
    authority.close()
