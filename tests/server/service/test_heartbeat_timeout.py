"""A driver that stops sending heartbeats fails its job over (Flink's ``heartbeat.timeout``).

The control plane's clock is a ManualClock: the timeout passes by advancing it, never by
sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint_server.storage import queries
from sparkpoint_server.storage.models import Job, Operation

TIMEOUT_MS = 50_000  # the default SPARKPOINT_HEARTBEAT_TIMEOUT
INTERVAL_MS = 10_000
FIXED_DELAY = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": 3,
    "restart-strategy.fixed-delay.delay": "5 s",
}


def _iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _job(h: Harness) -> Job:
    with h.sessions() as s:
        job = s.get(Job, h.job_id)
        assert job is not None
        return job


def _exceptions(h: Harness) -> list[dict[str, Any]]:
    with h.sessions() as s:
        entries: list[dict[str, Any]] = queries.exception_history(s, h.job_id, 100)["entries"]
    return entries


def _restores(h: Harness) -> list[p.RestoreJob]:
    return [c for _, c in h.commands() if isinstance(c, p.RestoreJob)]


def _start_watched(h: Harness) -> None:
    """A watched driver, RUNNING, with no periodic checkpoint in the way (1 h interval)."""
    h.register(
        heartbeat_interval_ms=INTERVAL_MS, restart_strategy=FIXED_DELAY, interval_ms=3_600_000
    )
    h.running(1)
    h.commands()


def test_a_running_job_whose_heartbeats_stop_fails_over_with_the_cause(harness: Harness) -> None:
    _start_watched(harness)
    for _ in range(8):  # 80 s of a live driver (no epoch ended: no per-epoch heartbeat)
        harness.tick(INTERVAL_MS)
        harness.driver_heartbeat(1)
    last = harness.clock.now_ms()
    harness.tick(TIMEOUT_MS - 1)
    assert _job(harness).status == "RUNNING"
    harness.tick(1)
    job = _job(harness)
    assert (job.status, job.restart_due_at) == ("RESTARTING", harness.clock.now_ms() + 5000)
    [entry] = _exceptions(harness)
    assert entry["exceptionName"] == "HEARTBEAT_TIMEOUT" and entry["attempt"] == 1
    assert "no heartbeat from the driver" in entry["stacktrace"]
    assert "for 50 s" in entry["stacktrace"] and harness.job_id in entry["stacktrace"]
    assert f"the last one arrived at {_iso(last)}" in entry["stacktrace"]
    assert entry["action"].startswith("restart in 5 s (")
    harness.tick(5000)  # the fixed delay: the restore is decided, and kept for a new driver
    [restore] = _restores(harness)
    assert restore.new_attempt == 2
    harness.tick(10 * TIMEOUT_MS)  # nobody answers: the silence is not counted again
    assert len(_exceptions(harness)) == 1 and _job(harness).status == "RESTARTING"


def test_without_a_restart_left_a_silent_driver_fails_the_job(harness: Harness) -> None:
    harness.register(
        heartbeat_interval_ms=INTERVAL_MS, restart_strategy={"restart-strategy.type": "none"}
    )
    harness.running(1)
    harness.commands()
    harness.tick(TIMEOUT_MS)
    job = _job(harness)
    assert job.status == "FAILED" and job.end_time == harness.clock.now_ms()
    [cancel] = [c for _, c in harness.commands() if isinstance(c, p.CancelJob)]
    assert cancel.status is p.JobStatus.FAILED and "no heartbeat" in (cancel.cause or "")
    [entry] = _exceptions(harness)
    assert entry["exceptionName"] == "HEARTBEAT_TIMEOUT" and entry["action"].startswith(
        "no restart"
    )


def test_a_driver_that_registered_and_died_before_running_fails_over(harness: Harness) -> None:
    harness.register(heartbeat_interval_ms=INTERVAL_MS, restart_strategy=FIXED_DELAY)
    harness.commands()
    harness.tick(TIMEOUT_MS - 1)
    assert _job(harness).status == "CREATED"
    harness.tick(1)
    assert _job(harness).status == "RESTARTING"
    [entry] = _exceptions(harness)
    assert entry["exceptionName"] == "HEARTBEAT_TIMEOUT"


def test_a_driver_that_dies_after_its_restore_fails_over_again(harness: Harness) -> None:
    _start_watched(harness)
    harness.send(1, p.TaskFailed(epoch=3, cause="boom"))
    harness.tick(5000)  # the delay is over: the restore of attempt 2 goes out
    assert [r.new_attempt for r in _restores(harness)] == [2]
    harness.driver_heartbeat(1)  # still attempt 1: it has not read the restore yet
    harness.tick(TIMEOUT_MS - 1)  # it never reports RUNNING: it died restoring
    assert _job(harness).status == "RESTARTING" and len(_exceptions(harness)) == 1
    harness.tick(1)
    kinds = [e["exceptionName"] for e in _exceptions(harness)]
    assert kinds == ["HEARTBEAT_TIMEOUT", "TASK_FAILURE"]
    assert _job(harness).restart_due_at == harness.clock.now_ms() + 5000


def test_heartbeats_of_a_driver_switching_attempts_keep_it_alive(harness: Harness) -> None:
    _start_watched(harness)
    harness.send(1, p.TaskFailed(epoch=3, cause="boom"))
    harness.tick(5000)
    assert [r.new_attempt for r in _restores(harness)] == [2]
    for _ in range(10):  # a long restore: heartbeats still under attempt 1, then 2
        harness.tick(INTERVAL_MS)
        harness.driver_heartbeat(1)
    harness.running(2)
    for _ in range(10):
        harness.tick(INTERVAL_MS)
        harness.driver_heartbeat(2)
    assert _job(harness).status == "RUNNING" and len(_exceptions(harness)) == 1


def test_epoch_heartbeats_keep_a_driver_alive_and_other_drivers_do_not(harness: Harness) -> None:
    _start_watched(harness)
    for epoch in range(1, 8):
        harness.tick(INTERVAL_MS)
        harness.driver_heartbeat(1, incarnation="another-process")  # not this driver's
        harness.epoch_ended(1, epoch)
    assert _job(harness).status == "RUNNING"
    harness.tick(TIMEOUT_MS)
    assert _job(harness).status == "RESTARTING"


def test_a_new_driver_gets_the_restore_decided_when_the_old_one_went_silent(
    harness: Harness,
) -> None:
    _start_watched(harness)
    harness.plane.trigger_checkpoint(harness.job_id)
    [cid] = [c.checkpoint_id for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    harness.ack_all(1, cid)
    harness.commands()
    harness.tick(TIMEOUT_MS)
    harness.tick(5000)
    [decided] = _restores(harness)
    assert (decided.new_attempt, decided.checkpoint_id) == (2, cid)
    # `sparkpoint run` restarts the driver: its command stream skipped the restore above.
    harness.register(
        "driver-2",
        heartbeat_interval_ms=INTERVAL_MS,
        previous_failure="the driver's JVM was killed (exit code 137)",
    )
    [again] = _restores(harness)
    assert again == decided  # the same decision, not one more failover
    harness.running(2)
    job = _job(harness)
    assert (job.status, job.attempt, job.restarts) == ("RUNNING", 2, 1)
    driver, lost = _exceptions(harness)
    assert lost["exceptionName"] == "HEARTBEAT_TIMEOUT"
    assert driver["exceptionName"] == "DRIVER_RESTART"
    assert "the driver's JVM was killed (exit code 137)" in driver["stacktrace"]
    harness.tick(TIMEOUT_MS)  # the new driver is watched in turn
    assert _job(harness).status == "RESTARTING" and len(_exceptions(harness)) == 3


def test_a_new_driver_during_the_restart_delay_waits_for_it(harness: Harness) -> None:
    _start_watched(harness)
    harness.tick(TIMEOUT_MS)
    harness.register("driver-2", heartbeat_interval_ms=INTERVAL_MS)
    assert _restores(harness) == []  # the restart strategy's delay is not over
    harness.tick(5000)
    assert [r.new_attempt for r in _restores(harness)] == [2]


def test_a_restarted_driver_names_why_its_predecessor_ended(harness: Harness) -> None:
    _start_watched(harness)
    harness.register(
        "driver-2",
        heartbeat_interval_ms=INTERVAL_MS,
        previous_failure="driver exited with code 1: OutOfMemoryError",
    )
    assert [r.new_attempt for r in _restores(harness)] == [2]
    [entry] = _exceptions(harness)
    assert entry["exceptionName"] == "DRIVER_RESTART"
    assert entry["stacktrace"].endswith("driver exited with code 1: OutOfMemoryError")


def test_a_driver_without_heartbeats_is_not_watched(harness: Harness) -> None:
    harness.start()  # an older driver: its registration announces no heartbeat interval
    harness.tick(10 * TIMEOUT_MS)
    assert _job(harness).status == "RUNNING" and _exceptions(harness) == []


def test_a_restarted_control_plane_gives_every_driver_a_full_timeout(harness: Harness) -> None:
    _start_watched(harness)
    harness.tick(INTERVAL_MS)
    harness.driver_heartbeat(1)
    last = harness.clock.now_ms()
    harness.clock.advance(5 * TIMEOUT_MS)  # the control plane was down meanwhile
    harness.new_control_plane()
    started = harness.clock.now_ms()
    harness.tick(TIMEOUT_MS - 1)
    assert _job(harness).status == "RUNNING"
    harness.tick(1)
    assert _job(harness).status == "RESTARTING"
    [entry] = _exceptions(harness)
    assert f"the last one arrived at {_iso(last)}" in entry["stacktrace"]
    assert f"none since the control plane started at {_iso(started)}" in entry["stacktrace"]


def test_a_restarted_control_plane_does_not_count_a_lost_driver_twice(harness: Harness) -> None:
    _start_watched(harness)
    harness.tick(TIMEOUT_MS)
    harness.tick(5000)
    harness.commands()
    harness.new_control_plane()
    harness.register("driver-2", heartbeat_interval_ms=INTERVAL_MS)
    assert [r.new_attempt for r in _restores(harness)] == [2]  # not one more failover
    assert [e["exceptionName"] for e in _exceptions(harness)] == [
        "DRIVER_RESTART",
        "HEARTBEAT_TIMEOUT",
    ]


def test_no_driver_is_declared_lost_while_the_ingest_cannot_read(harness: Harness) -> None:
    _start_watched(harness)
    harness.plane.ingest_health(False)  # Redis or the database is away: no heartbeat arrives
    harness.tick(5 * TIMEOUT_MS)
    assert _job(harness).status == "RUNNING"
    harness.plane.ingest_health(True)
    harness.tick(TIMEOUT_MS - 1)  # a full timeout from the moment it reads again
    assert _job(harness).status == "RUNNING"
    harness.tick(1)
    assert _job(harness).status == "RESTARTING"


def _operation_status(h: Harness, request_id: str) -> str:
    with h.sessions() as s:
        op = s.get(Operation, request_id)
        assert op is not None
        return op.status


def test_a_job_whose_driver_dies_while_cancelling_is_canceled(harness: Harness) -> None:
    _start_watched(harness)
    request = harness.plane.cancel(harness.job_id)
    assert _job(harness).status == "CANCELLING"
    harness.tick(TIMEOUT_MS)  # the driver never reports CANCELED
    job = _job(harness)
    assert job.status == "CANCELED" and job.end_time == harness.clock.now_ms()
    assert _operation_status(harness, request) == "COMPLETED"
    assert _exceptions(harness) == []  # a cancel, not a failure: the restart strategy is out


def test_cancelling_a_job_whose_driver_is_lost_cancels_it_at_once(harness: Harness) -> None:
    _start_watched(harness)
    harness.tick(TIMEOUT_MS)
    assert _job(harness).status == "RESTARTING"
    request = harness.plane.cancel(harness.job_id)
    job = _job(harness)
    assert (job.status, job.restart_due_at) == ("CANCELED", None)
    assert _operation_status(harness, request) == "COMPLETED"
    harness.tick(10_000)  # the restart it was waiting for is off
    assert _restores(harness) == []


def test_a_driver_declared_lost_that_speaks_again_is_watched_again(harness: Harness) -> None:
    _start_watched(harness)
    harness.tick(TIMEOUT_MS)  # it hung for longer than the timeout: lost, restart decided
    harness.tick(5000)
    assert [r.new_attempt for r in _restores(harness)] == [2]
    harness.tick(1000)
    harness.driver_heartbeat(1)  # it was not gone: it reads the restore and goes on
    harness.running(2)
    harness.new_control_plane()  # heard from after its loss: still watched after a restart
    harness.tick(TIMEOUT_MS - 1)
    assert _job(harness).status == "RUNNING"
    harness.tick(1)  # now it is gone for good: lost again, a failure of attempt 2
    assert _job(harness).status == "RESTARTING"
    assert [(e["exceptionName"], e["attempt"]) for e in _exceptions(harness)] == [
        ("HEARTBEAT_TIMEOUT", 2),
        ("HEARTBEAT_TIMEOUT", 1),
    ]


def test_a_driver_heartbeat_interval_too_long_for_the_timeout_is_warned_about(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    harness.register(heartbeat_interval_ms=30_000)
    assert (
        f"job {harness.job_id}: its driver sends a heartbeat every 30000 ms, too rarely for "
        "the heartbeat timeout of 50000 ms" in caplog.text
    )


@pytest.mark.parametrize("interval_ms", [TIMEOUT_MS, 60_000])
def test_a_driver_heartbeat_interval_not_below_the_timeout_is_refused(
    harness: Harness, interval_ms: int
) -> None:
    # Every heartbeat would come late: the job would fail over between any two of them.
    harness.register(heartbeat_interval_ms=interval_ms)
    [cancel] = [c for _, c in harness.commands()]
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert cancel.cause == (
        f"the control plane refused job {harness.job_id}: its driver sends a heartbeat every "
        f"{interval_ms // 1000} s (SPARKPOINT_HEARTBEAT_INTERVAL), not more often than the "
        "control plane's heartbeat timeout of 50 s (SPARKPOINT_HEARTBEAT_TIMEOUT): the job "
        "would be declared lost between any two heartbeats. Set the interval below 25 s, half "
        "the timeout"
    )
    with harness.sessions() as s:
        assert s.get(Job, harness.job_id) is None  # nothing started, nothing to clean up
