"""Restores check the files of incremental (native) state: shared files lost or damaged.

A failover restores the newest retained checkpoint whose files verify, saying which it
skipped and why, or fails the job naming the files; a requested restore of a checkpoint
whose shared file is lost is refused, naming it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from service_harness import TASKS, Harness
from sqlalchemy import select

from sparkpoint import protocol as p
from sparkpoint.transport import ReceivedMessage
from sparkpoint_server.errors import CheckpointNotFoundError, CorruptCheckpointError
from sparkpoint_server.storage.models import Job, JobException

STRATEGY = {
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.attempts": 3,
    "restart-strategy.fixed-delay.delay": "1 s",
}


def _native_ack(
    h: Harness, checkpoint_id: int, subtask: int, reused: list[p.SharedFileModel]
) -> p.SnapshotCompleted:
    """``pv[subtask]``'s acknowledgement with a native snapshot: one private file, one new
    shared file (``0000<id>.sst``) and the ``reused`` shared files of earlier checkpoints."""
    local = Path(h.tmp) / f"rocksdb-{checkpoint_id}-{subtask}"
    local.mkdir()
    (local / "CURRENT").write_bytes(b"MANIFEST-%d" % checkpoint_id)
    sst = f"0000{checkpoint_id}.sst"
    (local / sst).write_bytes(b"sst-%d-%d " % (checkpoint_id, subtask) * 50)
    handle = h.storage.write_native(
        h.job_id,
        checkpoint_id,
        f"pv-{subtask}",
        {"CURRENT": str(local / "CURRENT")},
        {sst: str(local / sst)},
        reused,
        key_group_range=None,
        fmt="rocksdb-native-v1",
    )
    return h.ack(1, checkpoint_id, "pv", subtask).model_copy(update={"handles": [handle]})


def _incremental(h: Harness, count: int) -> list[list[p.SharedFileModel]]:
    """``count`` completed checkpoints, each ``pv`` subtask's snapshot reusing the shared
    files of its previous one; the shared files each checkpoint's ``pv[0]`` references."""
    previous: dict[int, list[p.SharedFileModel]] = {0: [], 1: []}
    references = []
    for _ in range(count):
        cid = h.trigger_periodic()
        acks = [h.ack(1, cid, "source", i) for i in range(TASKS["source"])]
        acks += [_native_ack(h, cid, i, previous[i]) for i in range(TASKS["pv"])]
        h.send(1, *acks)
        previous = {a.subtask: list(a.handles[0].shared) for a in acks if a.operator_id == "pv"}
        references.append(previous[0])
    h.commands()
    return references


def _file(shared: p.SharedFileModel) -> str:
    return shared.path.removeprefix("file://")


def _job(h: Harness) -> Job:
    with h.sessions() as s:
        job = s.get(Job, h.job_id)
        assert job is not None
        return job


def _exceptions(h: Harness, kind: str) -> list[JobException]:
    with h.sessions() as s:
        rows = s.scalars(
            select(JobException).where(JobException.job_id == h.job_id, JobException.kind == kind)
        )
        return list(rows)


def _fail_and_restart(h: Harness) -> list[tuple[p.Envelope, object]]:
    h.send(1, p.TaskFailed(epoch=9, cause="boom"))
    h.commands()
    h.tick(1000)  # the restart is due: its check runs outside the lock, then it restarts
    return h.commands()


@pytest.mark.parametrize("how", ["restart", "driver"])
def test_a_failover_skips_a_checkpoint_whose_shared_file_is_lost(
    harness: Harness, how: str
) -> None:
    harness.start(retained=2, restart_strategy=STRATEGY)
    first, second = _incremental(harness, 2)
    [lost] = [f for f in second if f not in first]  # uploaded by checkpoint 2
    os.remove(_file(lost))

    if how == "restart":
        commands = _fail_and_restart(harness)
    else:  # `sparkpoint run` restarted a crashed driver: the ingest checks before the lock
        harness.register(incarnation="driver-2")
        commands = harness.commands()

    [restore] = [c for _, c in commands if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, 1)
    assert restore.external_path is not None and restore.external_path.endswith("chk-1")
    [skipped] = _exceptions(harness, "UNRESTORABLE_CHECKPOINT")
    assert skipped.cause.startswith("checkpoint 2 cannot be restored: ")
    assert f"state file {lost.path} of native snapshot" in skipped.cause
    assert "is missing" in skipped.cause
    assert skipped.action == (
        "restored checkpoint 1 instead of the latest (output committed since 1 is produced again)"
    )
    assert _job(harness).restart_checkpoint_id == 1


def test_a_failover_restores_the_latest_when_its_files_verify(harness: Harness) -> None:
    harness.start(retained=2, restart_strategy=STRATEGY)
    _incremental(harness, 2)
    [restore] = [c for _, c in _fail_and_restart(harness) if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, 2)
    assert _exceptions(harness, "UNRESTORABLE_CHECKPOINT") == []


def test_a_failover_with_no_checkpoint_that_verifies_fails_the_job_naming_the_files(
    harness: Harness,
) -> None:
    harness.start(retained=2, restart_strategy=STRATEGY)
    first, _second = _incremental(harness, 2)
    [shared_by_both] = first
    os.remove(_file(shared_by_both))

    commands = _fail_and_restart(harness)

    assert [c for _, c in commands if isinstance(c, p.RestoreJob)] == []  # not the beginning
    [cancel] = [c for _, c in commands if isinstance(c, p.CancelJob)]
    assert cancel.status is p.JobStatus.FAILED
    cause = cancel.cause or ""
    assert cause.startswith("epoch 9 of attempt 1 failed: boom; no checkpoint can be restored:")
    assert "checkpoint 2 cannot be restored" in cause and "checkpoint 1 cannot be restored" in cause
    assert cause.count(shared_by_both.path) == 2
    job = _job(harness)
    assert (job.status, job.restart_due_at) == ("FAILED", None)
    [unrestorable] = _exceptions(harness, "UNRESTORABLE_CHECKPOINT")
    assert unrestorable.action == "no restart: no retained checkpoint can be restored"
    harness.tick(5000)
    assert harness.command_types() == []


def test_a_restore_to_n_refuses_a_lost_or_truncated_shared_file_naming_it(
    harness: Harness,
) -> None:
    harness.start(retained=2)
    first, second = _incremental(harness, 2)
    [newer] = [f for f in second if f not in first]
    os.remove(_file(newer))
    with pytest.raises(CheckpointNotFoundError, match=r"checkpoint 2 of job .* cannot be") as err:
        harness.plane.restore(harness.job_id, 2, None)
    assert f"state file {newer.path} of native snapshot" in str(err.value)
    [older] = first
    with open(_file(older), "r+b") as fh:
        fh.truncate(older.size - 1)
    with pytest.raises(CorruptCheckpointError, match="truncated or altered") as err2:
        harness.plane.restore(harness.job_id, 1, None)
    assert older.path in str(err2.value)
    assert [t for t in harness.command_types() if t == "restore"] == []
    assert _job(harness).attempt == 1


def test_the_check_of_a_due_restart_runs_outside_the_lock(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.start(retained=2, restart_strategy=STRATEGY)
    _incremental(harness, 2)
    storage = harness.plane.jobs[harness.job_id].storage
    release, checking = threading.Event(), threading.Event()
    verify = storage.verify_handles

    def hung(handles: Any) -> None:
        checking.set()
        release.wait(10)
        verify(handles)

    monkeypatch.setattr(storage, "verify_handles", hung)
    harness.send(1, p.TaskFailed(epoch=9, cause="boom"))
    harness.commands()
    harness.clock.advance(1000)
    started = time.monotonic()
    harness.plane.tick()  # starts the check and returns
    assert checking.wait(5)
    harness.plane.tick()  # the check still runs: nothing more is started
    beat = p.DriverHeartbeat(incarnation="driver-1", host_time=0)
    env = p.envelope(harness.job_id, 1, harness.clock.now_ms(), beat)
    harness.plane.handle_batch([ReceivedMessage("0-1", env, beat)])  # the ingest takes the lock
    assert time.monotonic() - started < 2
    assert harness.command_types() == []
    release.set()
    harness.plane.wait_idle()
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, 2)


def test_a_failover_restores_the_origin_by_its_path_when_the_newer_checkpoint_is_damaged(
    harness: Harness,
) -> None:
    """A job started from another job's savepoint completed one checkpoint of its own, whose
    shared file is lost: the failover restores the savepoint it started from, by its path,
    rather than fail (nothing else of its line is retained)."""
    other = harness.another_job()
    other.start()
    savepoint, location = other.savepoint("sp")
    harness.register(from_checkpoint=location, retained=1, restart_strategy=STRATEGY)
    harness.running(1)
    harness.commands()
    [references] = _incremental(harness, 1)
    os.remove(_file(references[0]))
    [restore] = [c for _, c in _fail_and_restart(harness) if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id, restore.external_path) == (
        2,
        savepoint,
        location,
    )
    [skipped] = _exceptions(harness, "UNRESTORABLE_CHECKPOINT")
    assert skipped.action == (
        f"restored checkpoint {savepoint} at {location} (its origin) instead of the latest "
        f"(output committed since {savepoint} is produced again)"
    )
    assert _job(harness).restart_checkpoint_id is None  # not the store's: nothing pinned


def test_after_a_restore_a_failover_falls_back_past_a_damaged_origin_to_older_ones(
    harness: Harness,
) -> None:
    """Checkpoints older than a restored checkpoint of the job's own stay of its line: when
    that checkpoint's files are damaged, a failover falls back to them, as it always did, and
    never to the one the restore went back past."""
    harness.start(retained=3, restart_strategy=STRATEGY)
    first, second, _third = _incremental(harness, 3)
    harness.plane.restore(harness.job_id, 2, None)
    harness.running(2)
    harness.commands()
    [lost] = [f for f in second if f not in first]  # uploaded by checkpoint 2
    os.remove(_file(lost))
    harness.send(2, p.TaskFailed(epoch=9, cause="boom"))
    harness.commands()
    harness.tick(1000)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (3, 1)
    [skipped] = _exceptions(harness, "UNRESTORABLE_CHECKPOINT")
    assert skipped.cause.startswith("checkpoint 2 cannot be restored: ")
