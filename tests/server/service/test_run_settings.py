"""What a job's driver runs with when it registers again.

An ended job run again (``sparkpoint run --job-id J`` after J finished, was cancelled or
failed) runs with its new command line's checkpoint settings and restart strategy, as a job
submitted again does in Flink; it ran with the earlier run's before, and a finished job cannot
be PATCHed. A restarted driver of a live job keeps the control plane's (PATCHed ones win).
A driver that names another checkpoint storage than the job's is refused: its state files
would go to one directory and the control plane's ``_metadata`` (and retention's deletions)
to the other, and every checkpoint's state files would stay on disk for good."""

from __future__ import annotations

import os

import pytest
from service_harness import NO_DELAY, Harness
from sqlalchemy import select

from sparkpoint import protocol as p
from sparkpoint_server.storage.models import Checkpoint, Job, JobException

SLOW_RESTARTS = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": 9,
    "restart-strategy.fixed-delay.delay": "7 s",
}


def _ended(h: Harness, checkpoints: int = 0) -> list[int]:
    """Run the job (3 retained, no restart delay), complete ``checkpoints``, cancel it."""
    h.start(retained=3, restart_strategy=NO_DELAY)
    done = []
    for _ in range(checkpoints):
        cid = h.trigger_periodic()
        h.ack_all(1, cid)
        done.append(cid)
    h.plane.cancel(h.job_id)
    h.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    h.commands()
    return done


def _chk(h: Harness, cid: int) -> str:
    return os.path.join(h.checkpoint_dir, h.job_id, f"chk-{cid}")


def _stored(h: Harness) -> Job:
    with h.sessions() as s:
        job = s.get(Job, h.job_id)
        assert job is not None
        s.expunge(job)
        return job


@pytest.mark.parametrize("restart", [False, True], ids=["", "control-plane-restart"])
def test_an_ended_job_run_again_runs_with_its_new_command_lines_settings(
    harness: Harness, restart: bool
) -> None:
    first, second, third = _ended(harness, checkpoints=3)
    new = {
        "interval_ms": 5000,
        "timeout_ms": 20_000,
        "min_pause_ms": 100,
        "max_concurrent": 2,
        "tolerable_failures": 4,
        "retained": 1,
    }
    harness.register(incarnation="run-2", restart_strategy=SLOW_RESTARTS, **new)
    commands = [c for _, c in harness.commands()]
    [restore] = [c for c in commands if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, third)
    # The driver runs with its command line: nothing to tell it.
    assert not [c for c in commands if isinstance(c, p.ConfigurationChanged)]
    if restart:
        harness.new_control_plane()
    config = harness.plane.jobs[harness.job_id].coordinator.config
    assert {k: getattr(config, k) for k in new} == new
    job = _stored(harness)
    assert {k: job.checkpoint_config[k] for k in new} == new
    assert job.restart_strategy["restart-strategy.fixed-delay.delay"] == "7 s"
    # retained 1: the two older checkpoints go (the restored one stays).
    assert not os.path.exists(_chk(harness, first))
    assert not os.path.exists(_chk(harness, second))
    assert os.path.exists(_chk(harness, third))
    # Its restart strategy is the new one: a failure restarts after 7 s, not at once.
    harness.running(2)
    harness.commands()
    harness.send(2, p.TaskFailed(epoch=3, cause="boom"))
    harness.tick(1000)
    harness.tick()
    assert not [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    harness.tick(7000)
    harness.tick()
    [again] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (again.new_attempt, again.checkpoint_id) == (3, third)


def test_a_run_again_from_an_older_checkpoint_with_a_lower_retained_keeps_what_it_restores(
    harness: Harness,
) -> None:
    """Retention under the new ``retained`` runs once the restore is decided: the checkpoint
    being restored (older than the newest) is pinned by then, and stays the line's failover
    target."""
    first, second, _ = _ended(harness, checkpoints=3)
    harness.register(
        incarnation="run-2",
        from_checkpoint=f"file://{_chk(harness, first)}",
        retained=1,
        restart_strategy=NO_DELAY,
    )
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, first)
    assert os.path.exists(_chk(harness, first))
    harness.send(
        2,
        p.JobRestored(checkpoint_id=first, external_path=restore.external_path),
    )
    harness.running(2)
    harness.commands()
    harness.send(2, p.TaskFailed(epoch=3, cause="boom"))
    harness.tick(1000)
    harness.tick()
    [again] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (again.new_attempt, again.checkpoint_id) == (3, first)
    assert os.path.exists(_chk(harness, first))
    assert not os.path.exists(_chk(harness, second))


def test_a_restarted_driver_of_a_live_job_keeps_the_patched_settings(harness: Harness) -> None:
    harness.start(restart_strategy=NO_DELAY)
    harness.plane.update_checkpoint_config(harness.job_id, {"interval_ms": 9000, "retained": 2})
    harness.commands()
    harness.register(incarnation="driver-2", previous_failure="killed by SIGKILL", retained=5)
    commands = [c for _, c in harness.commands()]
    [changed] = [c for c in commands if isinstance(c, p.ConfigurationChanged)]
    assert changed.changes == {"interval_ms": 9000, "retained": 2}
    assert [c.new_attempt for c in commands if isinstance(c, p.RestoreJob)] == [2]
    config = harness.plane.jobs[harness.job_id].coordinator.config
    assert (config.interval_ms, config.retained) == (9000, 2)


def test_an_ended_job_run_again_with_invalid_settings_is_refused_and_stays_ended(
    harness: Harness,
) -> None:
    _ended(harness, checkpoints=1)
    harness.register(incarnation="run-2", retained=0)
    [(env, refused)] = harness.commands()
    assert isinstance(refused, p.CancelJob) and refused.status is p.JobStatus.FAILED
    assert "retained must be >= 1, got 0" in (refused.cause or ""), refused.cause
    job = _stored(harness)
    assert (job.status, job.attempt, env.attempt) == ("CANCELED", 1, 1)
    assert job.checkpoint_config["retained"] == 3


@pytest.mark.parametrize("live", [False, True], ids=["ended", "live"])
def test_a_driver_naming_another_checkpoint_directory_is_refused(
    harness: Harness, live: bool
) -> None:
    """Before, the run again wrote its state files to the new directory and the control
    plane its ``_metadata`` to the old one; retention deleted only the latter."""
    if live:
        harness.start(retained=3, restart_strategy=NO_DELAY)
        cid = harness.trigger_periodic()
        harness.ack_all(1, cid)
        harness.commands()
    else:
        [cid] = _ended(harness, checkpoints=1)
    elsewhere = harness.checkpoint_dir + "-elsewhere"
    previous = "killed by SIGKILL" if live else None
    harness.register(incarnation="run-2", checkpoint_dir=elsewhere, previous_failure=previous)
    [(_, refused)] = harness.commands()
    assert isinstance(refused, p.CancelJob) and refused.status is p.JobStatus.FAILED
    assert refused.cause == (
        f"the control plane refused job {harness.job_id}: job {harness.job_id} keeps its "
        f"checkpoints in {harness.checkpoint_dir}, and this driver would write them to "
        f"{elsewhere}: run it with the job's --checkpoint-dir, or as a new job (another "
        "--job-id) with --from-checkpoint to checkpoint elsewhere"
    )
    job = _stored(harness)
    assert (job.status, job.attempt) == ("RUNNING" if live else "CANCELED", 1)
    assert os.path.exists(_chk(harness, cid))
    with harness.sessions() as s:
        rows = s.scalars(select(Checkpoint).where(Checkpoint.job_id == harness.job_id)).all()
        assert [r.checkpoint_id for r in rows] == [cid]
    # With its own directory written otherwise (a URL, a trailing slash) it runs again.
    harness.register(incarnation="run-3", checkpoint_dir=f"file://{harness.checkpoint_dir}/")
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, cid)


def test_an_ended_job_run_again_is_a_rerun_in_its_exception_history(harness: Harness) -> None:
    _ended(harness, checkpoints=1)
    harness.register(incarnation="run-2", restart_strategy=NO_DELAY)
    with harness.sessions() as s:
        [entry] = s.scalars(select(JobException).where(JobException.job_id == harness.job_id))
        assert (entry.kind, entry.cause) == ("RERUN", "the job runs again (it had ended CANCELED)")
        assert entry.action == "restore checkpoint 1"
