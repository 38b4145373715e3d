"""Periodic checkpoints of an attempt wait until its tasks run: the end of its first epoch.

A driver that registers with ``first_epoch_heartbeat`` runs each attempt's first epoch at once
and ends it with a heartbeat. That epoch starts Spark's Python workers (on a cluster, maybe
executors) and whatever the job's functions load: a barrier triggered meanwhile would wait it
out and could expire, failing the job over at every start. Flink triggers no checkpoint before
all tasks run (``NOT_ALL_REQUIRED_TASKS_RUNNING``); the control plane waits for that heartbeat.
"""

from __future__ import annotations

from service_harness import NO_DELAY, Harness

from sparkpoint import protocol as p
from sparkpoint_server.storage.models import Operation


def _triggers(h: Harness) -> list[int]:
    return [c.checkpoint_id for _, c in h.commands() if isinstance(c, p.TriggerCheckpoint)]


def _start(h: Harness) -> None:
    h.register(first_epoch_heartbeat=True, restart_strategy=NO_DELAY)
    h.running(1)
    h.commands()


def test_periodic_checkpoints_start_when_the_first_epoch_of_the_attempt_ended(
    harness: Harness,
) -> None:
    _start(harness)
    harness.tick(5000)  # five intervals while the first epoch starts Spark's workers
    assert _triggers(harness) == []
    harness.epoch_ended(1, 0)
    harness.tick(0)
    assert _triggers(harness) == [1]  # the interval is long over: at once
    # A failover: the new attempt's first epoch is waited for again.
    harness.send(1, p.TaskFailed(epoch=1, cause="boom"))
    harness.tick(0)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert restore.new_attempt == 2
    harness.running(2)
    harness.epoch_ended(1, 1)  # a late heartbeat of attempt 1 says nothing of attempt 2
    harness.tick(3000)
    assert _triggers(harness) == []
    harness.epoch_ended(2, 2)
    harness.tick(0)
    assert _triggers(harness) == [2]


def test_a_manual_checkpoint_waits_in_the_queue_and_a_savepoint_is_triggered(
    harness: Harness,
) -> None:
    """A manual checkpoint would count against the tolerable failures if it expired: it is
    queued (its request IN_PROGRESS), as when max concurrent checkpoints are pending, and
    triggered ahead of periodic ones. A savepoint, whose failure fails no job, is triggered
    at once and rides the epoch after the first."""
    _start(harness)
    request = harness.plane.trigger_checkpoint(harness.job_id)
    harness.tick(0)
    assert _triggers(harness) == []
    with harness.sessions() as s:
        op = s.get(Operation, request)
        assert op is not None and op.status == "IN_PROGRESS"
    harness.new_control_plane()  # the queue survives a restart of the control plane
    harness.epoch_ended(1, 0)
    harness.tick(0)
    assert _triggers(harness) == [1]
    with harness.sessions() as s:
        op = s.get(Operation, request)
        assert op is not None and op.checkpoint_id == 1
    harness.plane.trigger_savepoint(harness.job_id, None, cancel_job=False)
    assert _triggers(harness) == [2]


def test_a_savepoint_is_not_held(harness: Harness) -> None:
    _start(harness)
    harness.plane.trigger_savepoint(harness.job_id, None, cancel_job=False)
    assert _triggers(harness) == [1]


def test_a_restarted_control_plane_knows_whether_the_first_epoch_ended(harness: Harness) -> None:
    _start(harness)
    harness.new_control_plane()  # restarted during the first epoch: still held
    harness.tick(3000)
    assert _triggers(harness) == []
    harness.epoch_ended(1, 0)
    harness.new_control_plane()  # restarted after it: the heartbeat's row says it ended
    harness.tick(1000)
    assert _triggers(harness) == [1]


def test_a_driver_that_does_not_say_is_checkpointed_from_running_on(harness: Harness) -> None:
    harness.register(restart_strategy=NO_DELAY)
    harness.running(1)
    harness.commands()
    harness.tick(1000)
    assert _triggers(harness) == [1]
