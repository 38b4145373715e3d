"""A failover restores the newest checkpoint of the job's current line: the one its
``--from-checkpoint`` or its latest restore request named (its origin), or one completed since.
Restarting from the beginning would drop the state a job started from a checkpoint started
with and read its input again; restoring a checkpoint that a restore request went back past
would undo that restore. Flink starts a new job from the checkpoint restored, whose store
holds nothing newer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from service_harness import NO_DELAY, VERTICES, Harness
from sqlalchemy import select

from sparkpoint import protocol as p
from sparkpoint_server.storage.failover_target import failover_target
from sparkpoint_server.storage.models import Checkpoint, Job, JobException, Operation


def _restores(h: Harness) -> list[p.RestoreJob]:
    return [c for _, c in h.commands() if isinstance(c, p.RestoreJob)]


def _started_from_a_checkpoint(harness: Harness, tmp_path: Path) -> tuple[Harness, int, str]:
    """Job A completes a checkpoint; job B registers from it and runs. (B, its id, its URL)"""
    harness.start()
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid)
    url = "file://" + os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    other = Harness(tmp_path / "other", harness.sessions, harness.client, harness.streams)
    other.register(incarnation="driver-9", from_checkpoint=url, restart_strategy=NO_DELAY)
    [first] = _restores(other)
    assert (first.new_attempt, first.checkpoint_id, first.external_path) == (1, cid, url)
    other.running(1)
    return other, cid, url


def test_a_failure_before_its_first_checkpoint_restores_the_one_it_started_from(
    harness: Harness, tmp_path: Path
) -> None:
    other, cid, url = _started_from_a_checkpoint(harness, tmp_path)
    other.send(1, p.TaskFailed(epoch=1, cause="boom"))
    other.tick(1)
    [again] = _restores(other)
    assert (again.new_attempt, again.checkpoint_id, again.external_path) == (2, cid, url)
    assert again.savepoint_path == url
    # Its own checkpoint then comes first; the one it started from stays where it is.
    other.running(2)
    own = other.trigger_periodic()
    other.ack_all(2, own)
    other.commands()
    other.send(2, p.TaskFailed(epoch=3, cause="boom again"))
    other.tick(1)
    [latest] = _restores(other)
    assert (latest.new_attempt, latest.checkpoint_id) == (3, own)
    assert latest.external_path is not None and other.job_id in latest.external_path
    assert os.path.isfile(url.removeprefix("file://") + "/_metadata")


def test_a_restarted_control_plane_still_restores_the_one_it_started_from(
    harness: Harness, tmp_path: Path
) -> None:
    other, cid, url = _started_from_a_checkpoint(harness, tmp_path)
    other.new_control_plane()
    other.commands()
    other.send(1, p.TaskFailed(epoch=1, cause="boom"))
    other.tick(1)
    [again] = _restores(other)
    assert (again.new_attempt, again.checkpoint_id, again.external_path) == (2, cid, url)
    # A driver that registers again for the running attempt gets the same start again.
    other.new_control_plane()
    other.commands()
    other.register(incarnation="driver-9", from_checkpoint=url, restart_strategy=NO_DELAY)
    [same] = _restores(other)
    assert (same.new_attempt, same.checkpoint_id, same.external_path) == (2, cid, url)


def _target(h: Harness) -> dict[str, Any]:
    """``latest.failover`` of ``GET /jobs/{id}/checkpoints``."""
    with h.sessions() as s:
        return failover_target(s, h.job_id)


def _fail(h: Harness, attempt: int) -> p.RestoreJob:
    """Fail the attempt; the restore that the (immediate) restart sends."""
    h.commands()
    h.send(attempt, p.TaskFailed(epoch=9, cause=f"boom in attempt {attempt}"))
    h.tick(1)
    [restore] = _restores(h)
    assert restore.new_attempt == attempt + 1
    return restore


@pytest.mark.parametrize("restart", [False, True], ids=["", "control-plane-restart"])
def test_a_failover_after_a_restore_to_an_older_checkpoint_does_not_undo_it(
    harness: Harness, restart: bool
) -> None:
    harness.start(retained=3, restart_strategy=NO_DELAY)
    older = harness.trigger_periodic()
    harness.ack_all(1, older)
    newer = harness.trigger_periodic()
    harness.ack_all(1, newer)
    harness.commands()
    harness.plane.restore(harness.job_id, older, None)
    [restore] = _restores(harness)
    assert (restore.new_attempt, restore.checkpoint_id) == (2, older)
    harness.running(2)
    # What the API says a failover restores (read from the rows) is what the engine does.
    target = _target(harness)
    assert (target["id"], target["passed_over"]) == (older, [newer])
    assert target["origin"]["id"] == older
    if restart:
        harness.new_control_plane()
    again = _fail(harness, 2)
    assert again.checkpoint_id == older  # not the newer one, which the restore went back past
    harness.running(3)
    since = harness.trigger_periodic()
    harness.ack_all(3, since)
    if restart:
        harness.new_control_plane()
    assert _target(harness)["id"] == since
    latest = _fail(harness, 3)
    assert latest.checkpoint_id == since > newer


def test_a_failover_after_a_restore_of_a_savepoint_by_its_path_restores_it_again(
    harness: Harness,
) -> None:
    """Another job's savepoint, restored by its path, is not in the job's store: a failover
    before the job's next checkpoint restores it by its path again."""
    other = harness.another_job()
    other.start()
    savepoint, location = other.savepoint("sp")
    harness.start(restart_strategy=NO_DELAY)
    own = harness.trigger_periodic()
    harness.ack_all(1, own)
    harness.commands()
    assert own == savepoint  # ids are each job's own: the job has a chk-1 too
    harness.plane.restore(harness.job_id, None, location)
    [restore] = _restores(harness)
    assert (restore.checkpoint_id, restore.external_path) == (savepoint, location)
    # A control plane that restarted before the restore was reported sends the same again.
    harness.new_control_plane()
    harness.commands()
    harness.register()  # the same driver, its registration redelivered
    [same] = _restores(harness)
    assert (same.new_attempt, same.external_path) == (2, location)
    harness.running(2)
    target = _target(harness)
    assert (target["id"], target["external_path"], target["passed_over"]) == (
        savepoint,
        location,
        [own],  # the job's own checkpoint 1: another checkpoint with the savepoint's id
    )
    again = _fail(harness, 2)
    assert (again.checkpoint_id, again.external_path) == (savepoint, location)


def test_a_restarted_driver_after_a_restore_gets_that_checkpoint_and_the_history_says_so(
    harness: Harness,
) -> None:
    harness.start(retained=3, restart_strategy=NO_DELAY)
    older = harness.trigger_periodic()
    harness.ack_all(1, older)
    newer = harness.trigger_periodic()
    harness.ack_all(1, newer)
    harness.plane.restore(harness.job_id, older, None)
    harness.running(2)
    harness.commands()
    harness.register(incarnation="driver-2")  # `sparkpoint run` restarted a killed driver
    [restore] = _restores(harness)
    assert (restore.new_attempt, restore.checkpoint_id) == (3, older)
    with harness.sessions() as s:
        [entry] = s.scalars(select(JobException).where(JobException.kind == "DRIVER_RESTART")).all()
    assert entry.action == f"restore checkpoint {older}"


def test_an_ended_job_run_again_starts_from_its_from_checkpoint(harness: Harness) -> None:
    """``sparkpoint run --job-id J --from-checkpoint SP`` after J ended starts from SP (it
    restored the newest checkpoint and ignored SP before), and fails over to SP until a
    checkpoint completes; run again without one, it continues from its newest checkpoint."""
    harness.start(retained=3, restart_strategy=NO_DELAY)
    savepoint, location = harness.savepoint("sp")
    newer = harness.trigger_periodic()
    harness.ack_all(1, newer)
    harness.plane.cancel(harness.job_id)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    harness.commands()
    harness.register(incarnation="run-2", from_checkpoint=location, restart_strategy=NO_DELAY)
    [restore] = _restores(harness)
    assert (restore.new_attempt, restore.checkpoint_id) == (2, savepoint)
    assert restore.external_path == location
    harness.running(2)
    assert _fail(harness, 2).checkpoint_id == savepoint
    with harness.sessions() as s:
        [entry] = s.scalars(select(JobException).where(JobException.kind == "RERUN")).all()
    assert entry.cause == (
        f"the job runs again (it had ended CANCELED), from --from-checkpoint {location}"
    )
    # A driver that `sparkpoint run` restarts passes the same --from-checkpoint: a failover.
    harness.running(3)
    own = harness.trigger_periodic()
    harness.ack_all(3, own)
    harness.commands()
    harness.register(
        incarnation="run-2-again",
        from_checkpoint=location,
        restart_strategy=NO_DELAY,
        previous_failure="killed by SIGKILL",
    )
    [failover] = _restores(harness)
    assert (failover.new_attempt, failover.checkpoint_id) == (4, own)
    # Ended and run again without --from-checkpoint: its newest checkpoint.
    harness.running(4)
    harness.plane.cancel(harness.job_id)
    harness.send(4, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    harness.commands()
    harness.register(incarnation="run-3", restart_strategy=NO_DELAY)
    [resumed] = _restores(harness)
    assert (resumed.new_attempt, resumed.checkpoint_id) == (5, own)


def test_an_ended_job_run_again_at_another_parallelism_checkpoints_with_its_new_subtasks(
    harness: Harness,
) -> None:
    """Stop with a savepoint, run again from it at parallelism 3 (as Flink rescales): the
    control plane takes the new driver's graph, so the third subtasks' acknowledgements
    complete checkpoints instead of being refused as unknown."""
    harness.start(restart_strategy=NO_DELAY)
    savepoint, location = harness.savepoint("sp-rescale")
    harness.plane.cancel(harness.job_id)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    harness.commands()
    wider = [v.model_copy(update={"parallelism": 3}) for v in VERTICES]
    conf = harness.config(from_checkpoint=location, restart_strategy=NO_DELAY)
    harness.send(
        0,
        p.JobRegistered(
            job_name="pv", vertices=wider, edges=[("source", "pv")], config=conf, incarnation="r3"
        ),
    )
    [restore] = _restores(harness)
    assert (restore.new_attempt, restore.checkpoint_id) == (2, savepoint)
    harness.running(2)
    cid = harness.trigger_periodic(2)
    harness.send(2, *(harness.ack(2, cid, op, i) for op in ("source", "pv") for i in range(3)))
    with harness.sessions() as s:
        row = s.scalars(
            select(Checkpoint).where(
                Checkpoint.job_id == harness.job_id, Checkpoint.checkpoint_id == cid
            )
        ).one()
        assert (row.status, row.num_acknowledged_subtasks) == ("COMPLETED", 6)
        job = s.get(Job, harness.job_id)
        assert job is not None and [v["parallelism"] for v in job.graph["vertices"]] == [3, 3]


def test_an_ended_job_run_again_from_no_checkpoint_is_refused_and_stays_ended(
    harness: Harness, tmp_path: Path
) -> None:
    harness.start()
    harness.plane.cancel(harness.job_id)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    harness.commands()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    harness.register(incarnation="run-2", from_checkpoint=f"file://{elsewhere}")
    [(env, refused)] = harness.commands()
    assert isinstance(refused, p.CancelJob) and refused.status is p.JobStatus.FAILED
    assert f"--from-checkpoint 'file://{elsewhere}'" in (refused.cause or "")
    assert f"{elsewhere}/_metadata does not exist" in (refused.cause or "") and env.attempt == 1
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None and (job.status, job.attempt) == ("CANCELED", 1)


@pytest.mark.parametrize("ended", [p.JobStatus.CANCELED, p.JobStatus.FINISHED])
def test_a_driver_restarted_after_its_job_ended_is_told_so_and_nothing_restarts(
    harness: Harness, ended: p.JobStatus
) -> None:
    """A driver killed while it shut down after the job's end (a cancel, the end of input)
    is restarted by `sparkpoint run`; the job stays as it ended (it ran again before)."""
    harness.start()
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid)
    if ended is p.JobStatus.CANCELED:
        harness.plane.cancel(harness.job_id)
    harness.send(1, p.JobStatusChanged(status=ended))
    harness.commands()
    harness.register(incarnation="driver-2", previous_failure="killed by SIGKILL")
    [(env, told)] = harness.commands()
    assert told == p.CancelJob(
        status=ended,
        cause=f"job {harness.job_id} had ended {ended.value} before its driver died (killed "
        "by SIGKILL): nothing to restart",
    )
    assert env.attempt == 1
    harness.send(1, p.JobStatusChanged(status=ended, cause=told.cause))  # the driver ends so
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None and (job.status, job.attempt) == (ended.value, 1)


def test_a_driver_that_died_while_its_job_was_being_cancelled_ends_the_cancel(
    harness: Harness,
) -> None:
    """It restarted the job before: the new driver got a restore and the cancel was lost."""
    harness.start()
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid)
    request = harness.plane.cancel(harness.job_id)
    harness.commands()
    harness.register(incarnation="driver-2", previous_failure="killed by SIGKILL")
    [(_, told)] = harness.commands()
    assert isinstance(told, p.CancelJob) and told.status is p.JobStatus.CANCELED
    with harness.sessions() as s:
        job = s.get(Job, harness.job_id)
        assert job is not None and (job.status, job.attempt) == ("CANCELED", 1)
        op = s.get(Operation, request)
        assert op is not None and op.status == "COMPLETED"
