"""Failure policy and restart strategies, decided by the control plane on an injected clock."""

from __future__ import annotations

from typing import Any

import pytest
from service_harness import Harness
from sqlalchemy import select

from sparkpoint import protocol as p
from sparkpoint_server.storage.models import Job, JobException


def _job(h: Harness) -> Job:
    with h.sessions() as s:
        job = s.get(Job, h.job_id)
        assert job is not None
        return job


def _restores(h: Harness) -> list[p.RestoreJob]:
    return [c for _, c in h.commands() if isinstance(c, p.RestoreJob)]


def _fail(h: Harness, attempt: int, epoch: int) -> None:
    h.send(attempt, p.TaskFailed(epoch=epoch, cause=f"boom at epoch {epoch}"))


def test_past_tolerable_failures_the_job_fails_over_to_the_latest_checkpoint(
    harness: Harness,
) -> None:
    harness.start(
        tolerable_failures=1,
        timeout_ms=2000,
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 5,
            "restart-strategy.fixed-delay.delay": "3 s",
        },
    )
    first = harness.trigger_periodic()
    harness.ack_all(1, first)
    harness.commands()
    harness.trigger_periodic()  # checkpoint 2 expires: one failure, tolerated
    harness.tick(2000)
    assert _job(harness).status == "RUNNING"
    harness.trigger_periodic()  # checkpoint 3 expires: two consecutive, one too many
    harness.tick(2000)
    job = _job(harness)
    assert (job.status, job.restart_due_at) == ("RESTARTING", harness.clock.now_ms() + 3000)
    harness.commands()
    harness.tick(2999)
    assert _restores(harness) == []  # the fixed delay is not over
    harness.tick(1)
    [restore] = _restores(harness)
    assert (restore.new_attempt, restore.checkpoint_id) == (2, first)
    assert restore.external_path is not None and restore.external_path.endswith(f"chk-{first}")
    # The driver's console says why it restarts, as a standalone job's does.
    assert (restore.cause or "").startswith("Exceeded checkpoint tolerable failure threshold.")
    with harness.sessions() as s:
        [exc] = s.scalars(select(JobException).where(JobException.job_id == harness.job_id))
    assert exc.kind == "CHECKPOINT_FAILURE" and "tolerable failure threshold" in exc.cause
    harness.running(2)
    assert (_job(harness).status, _job(harness).attempt, _job(harness).restarts) == (
        "RUNNING",
        2,
        1,
    )


def _strategy(kind: str, **keys: Any) -> dict[str, Any]:
    prefix = f"restart-strategy.{kind}."
    return {"restart-strategy.type": kind, **{prefix + k: v for k, v in keys.items()}}


def test_no_restart_strategy_fails_the_job_at_the_first_failure(harness: Harness) -> None:
    harness.start(restart_strategy={"restart-strategy.type": "none"})
    _fail(harness, 1, 4)
    job = _job(harness)
    assert job.status == "FAILED" and job.end_time == harness.clock.now_ms()
    [cancel] = [c for _, c in harness.commands() if isinstance(c, p.CancelJob)]
    assert cancel.status is p.JobStatus.FAILED and "boom at epoch 4" in (cancel.cause or "")


def test_a_failure_names_the_subtask_and_the_operators_chained_in_its_vertex(
    harness: Harness,
) -> None:
    harness.start(restart_strategy={"restart-strategy.type": "none"})
    harness.send(
        1, p.TaskFailed(epoch=4, cause="ValueError: bad record", operator_id="source", subtask=1)
    )
    with harness.sessions() as s:
        [exc] = s.scalars(select(JobException).where(JobException.job_id == harness.job_id))
    assert exc.cause == (
        "epoch 4 of attempt 1 failed in source[1] (source -> map): ValueError: bad record"
    )
    assert (exc.operator_id, exc.subtask) == ("source", 1)


def test_a_failure_no_restart_can_fix_fails_the_job_without_asking_the_strategy(
    harness: Harness,
) -> None:
    # A task's configuration error would fail every attempt alike (Flink's
    # SuppressRestartsException): FAILED at once, under a strategy that allows restarts.
    harness.start(restart_strategy=_strategy("fixed-delay", attempts=5, delay="10 s"))
    cause = "ConfigurationError: snapshot 0 was taken with max_parallelism 64"
    harness.send(
        1,
        p.TaskFailed(epoch=0, cause=cause, operator_id="source", subtask=0, recoverable=False),
    )
    job = _job(harness)
    assert (job.status, job.restart_due_at) == ("FAILED", None)
    with harness.sessions() as s:
        [exc] = s.scalars(select(JobException).where(JobException.job_id == harness.job_id))
    assert exc.action == (
        "no restart: a configuration error, which every restart would meet again: the job fails"
    )
    [cancel] = [c for _, c in harness.commands()]
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert cause in (cancel.cause or "")
    harness.tick(60_000)
    assert _restores(harness) == []


def test_fixed_delay_restarts_n_times_then_fails(harness: Harness) -> None:
    harness.start(restart_strategy=_strategy("fixed-delay", attempts=2, delay="10 s"))
    for attempt in (1, 2):
        _fail(harness, attempt, 1)
        assert _job(harness).status == "RESTARTING"
        harness.tick(10_000)
        assert [r.new_attempt for r in _restores(harness)] == [attempt + 1]
        harness.running(attempt + 1)
    _fail(harness, 3, 1)
    assert _job(harness).status == "FAILED"
    with harness.sessions() as s:
        actions = [e.action for e in s.scalars(select(JobException).order_by(JobException.id))]
    assert actions[0].startswith("restart in 10 s (") and actions[2].startswith("no restart")
    # The driver is told why no restart follows, as the job's status history says it.
    [cancel] = [c for _, c in harness.commands() if isinstance(c, p.CancelJob)]
    assert cancel.status is p.JobStatus.FAILED
    assert (cancel.cause or "").endswith("(fixed-delay: failure 3 exceeds 2 attempts)")


def test_failure_rate_counts_failures_in_its_interval(harness: Harness) -> None:
    harness.start(
        restart_strategy=_strategy(
            "failure-rate",
            **{"max-failures-per-interval": 2, "failure-rate-interval": "60 s", "delay": "1 s"},
        )
    )
    _fail(harness, 1, 1)
    harness.tick(1000)
    harness.running(2)
    harness.clock.advance(61_000)  # the first failure leaves the interval
    _fail(harness, 2, 1)
    harness.tick(1000)
    harness.running(3)
    _fail(harness, 3, 1)  # two failures within 60 s: still allowed
    harness.tick(1000)
    harness.running(4)
    _fail(harness, 4, 1)  # a third one within 60 s: no more
    assert _job(harness).status == "FAILED"


def test_exponential_delay_backs_off_and_merges_failures(harness: Harness) -> None:
    harness.start(
        restart_strategy=_strategy(
            "exponential-delay",
            **{
                "initial-backoff": "1 s",
                "max-backoff": "4 s",
                "backoff-multiplier": 2.0,
                "jitter-factor": 0.0,
            },
        )
    )
    delays = []
    for attempt in (1, 2, 3, 4):
        _fail(harness, attempt, 1)
        job = _job(harness)
        assert job.restart_due_at is not None
        delays.append(job.restart_due_at - harness.clock.now_ms())
        harness.tick(delays[-1])
        assert [r.new_attempt for r in _restores(harness)] == [attempt + 1]
        harness.running(attempt + 1)
        harness.clock.advance(100)  # it runs a little before failing again
    assert delays == [1000, 2000, 4000, 4000]
    _fail(harness, 5, 1)
    harness.clock.advance(500)
    _fail(harness, 5, 2)  # before the scheduled restart: merged into it
    job = _job(harness)
    assert job.restart_due_at == harness.clock.now_ms() + 3500


def test_default_strategy_with_checkpointing_is_exponential_delay(harness: Harness) -> None:
    harness.start(restart_strategy={})
    assert _job(harness).restart_strategy["restart-strategy.type"] == "exponential-delay"


@pytest.mark.parametrize("repeat", [2])
def test_a_repeated_task_failure_is_one_failure(harness: Harness, repeat: int) -> None:
    harness.start(restart_strategy=_strategy("fixed-delay", attempts=1, delay="1 s"))
    for _ in range(repeat):
        _fail(harness, 1, 7)  # the same event delivered again
    assert _job(harness).status == "RESTARTING"
    with harness.sessions() as s:
        assert len(s.scalars(select(JobException)).all()) == 1


def test_a_restarted_driver_fails_the_job_over(harness: Harness) -> None:
    harness.start()
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid)
    harness.commands()
    harness.register(incarnation="driver-2")  # `sparkpoint run` restarted a crashed driver
    [restore] = _restores(harness)
    assert (restore.new_attempt, restore.checkpoint_id) == (2, cid)
    assert _job(harness).status == "RESTARTING"


def test_a_driver_canceled_by_a_signal_during_a_restart_delay_is_not_restarted(
    harness: Harness,
) -> None:
    harness.start(restart_strategy=_strategy("fixed-delay", attempts=3, delay="10 s"))
    _fail(harness, 1, 2)
    assert _job(harness).restart_due_at is not None
    harness.commands()
    cause = "canceled by a signal"
    harness.send(
        1,
        p.JobStatusChanged(status=p.JobStatus.CANCELLING, cause=cause),
        p.JobStatusChanged(status=p.JobStatus.CANCELED, cause=cause),
    )
    job = _job(harness)
    assert (job.status, job.restart_due_at, job.restart_cause) == ("CANCELED", None, None)
    harness.tick(10_000)
    assert _restores(harness) == []


def test_a_driver_restarted_during_a_restart_delay_is_restored_once(harness: Harness) -> None:
    harness.start(restart_strategy=_strategy("fixed-delay", attempts=3, delay="10 s"))
    _fail(harness, 1, 2)
    harness.commands()
    harness.register(incarnation="driver-2")  # `sparkpoint run` restarted the driver meanwhile
    assert [r.new_attempt for r in _restores(harness)] == [2]
    harness.tick(10_000)  # the restart decided for the failure is superseded, not sent too
    assert _restores(harness) == []
    job = _job(harness)
    assert (job.attempt, job.restart_due_at) == (2, None)


def test_a_region_failure_is_recorded_with_the_region_it_restarts(harness: Harness) -> None:
    harness.start(
        restart_strategy=_strategy("fixed-delay", attempts=3, delay="2 s"),
    )
    harness.send(
        1,
        p.TaskFailed(
            epoch=4,
            cause="InjectedFailure: boom",
            operator_id="a-count",
            subtask=1,
            region="a-events",
            region_vertices=["a-events", "a-count"],
        ),
    )
    with harness.sessions() as s:
        [exc] = s.scalars(select(JobException).where(JobException.job_id == harness.job_id))
    assert (exc.operator_id, exc.subtask) == ("a-count", 1)
    assert exc.action.startswith("restart region a-events (a-events, a-count) in 2 s (")
    assert _job(harness).status == "RESTARTING"  # a region restart counts as a restart
