"""A job started from another job's checkpoint (``--from-checkpoint`` of a running job's
``chk-N``) restores it by its path when it fails before its first checkpoint. The owner's
retention must not delete it meanwhile: the failover would find no files and the job would fail
instead of restarting. The control plane keeps it pinned past retention until the new job has a
checkpoint of its own, restored another, or ended; then it goes as retention meant it to.
Flink's restore mode NO_CLAIM leaves such a checkpoint to its owner; one control plane for
every job can do better."""

from __future__ import annotations

import os
import shutil

import pytest
from service_harness import NO_DELAY, Harness
from sqlalchemy import select

from sparkpoint import protocol as p
from sparkpoint_server.errors import ConflictError
from sparkpoint_server.service import requests
from sparkpoint_server.storage.failover_target import origin_of
from sparkpoint_server.storage.models import Checkpoint, Job


def _metadata(url: str) -> str:
    return url.removeprefix("file://") + "/_metadata"


def _discarded(h: Harness, checkpoint_id: int) -> bool:
    with h.sessions() as s:
        row = s.scalars(
            select(Checkpoint).where(
                Checkpoint.job_id == h.job_id, Checkpoint.checkpoint_id == checkpoint_id
            )
        ).one()
        return row.discarded


def _checkpoint(h: Harness, attempt: int = 1) -> int:
    """The job's next periodic checkpoint, completed."""
    cid = h.trigger_periodic(attempt)
    h.ack_all(attempt, cid)
    return cid


def _started_from(owner: Harness) -> tuple[Harness, int, str]:
    """The owner completes a checkpoint; a second job on the same control plane registers
    from it by its path (no periodic checkpoints of its own) and runs."""
    owner.start()
    cid = _checkpoint(owner)
    url = "file://" + os.path.join(owner.checkpoint_dir, owner.job_id, f"chk-{cid}")
    other = owner.another_job()
    other.register(
        incarnation="driver-9", from_checkpoint=url, restart_strategy=NO_DELAY, interval_ms=0
    )
    other.running(1)
    other.commands()
    return other, cid, url


def _fail(h: Harness, attempt: int) -> p.RestoreJob:
    h.commands()
    h.send(attempt, p.TaskFailed(epoch=9, cause=f"boom in attempt {attempt}"))
    h.tick(1000)  # past the restart delay
    h.tick()  # the failover check of its files ended: the restart
    [restore] = [c for _, c in h.commands() if isinstance(c, p.RestoreJob)]
    return restore


@pytest.mark.parametrize("restart", [False, True], ids=["", "control-plane-restart"])
def test_retention_keeps_the_checkpoint_another_job_started_from_until_it_has_its_own(
    harness: Harness, restart: bool
) -> None:
    other, cid, url = _started_from(harness)
    # The owner (retained: 1) completes two more: retention drops the one the other started
    # from, and keeps its files and its row.
    newer = [_checkpoint(harness), _checkpoint(harness)]
    assert os.path.isfile(_metadata(url))
    assert not _discarded(harness, cid)
    assert os.path.isdir(_metadata(url.replace(f"chk-{cid}", f"chk-{newer[0]}"))) is False
    assert _discarded(harness, newer[0])
    if restart:
        # The pin lives in memory: a restarted control plane finds the row it kept, and the
        # owner's next completion keeps it again.
        other.new_control_plane()
        harness.cp = other.cp
        harness.commands()
        other.commands()
        _checkpoint(harness)
        assert os.path.isfile(_metadata(url)) and not _discarded(harness, cid)
    # The other job fails before a checkpoint of its own: it restores the kept one.
    restore = _fail(other, 1)
    assert (restore.new_attempt, restore.checkpoint_id, restore.external_path) == (2, cid, url)
    other.running(2)
    harness.tick()
    assert os.path.isfile(_metadata(url)), "released while the other job still needs it"
    # Its first checkpoint: the owner's retention may now have it.
    own = other.plane.trigger_checkpoint(other.job_id)
    [trigger] = [c for _, c in other.commands() if isinstance(c, p.TriggerCheckpoint)]
    other.ack_all(2, trigger.checkpoint_id)
    assert own
    harness.tick()
    assert not os.path.exists(_metadata(url))
    assert _discarded(harness, cid)
    # The owner's own failover is what it was: its newest checkpoint.
    restore = _fail(harness, 1)
    assert restore.checkpoint_id == max(newer) + (1 if restart else 0)


def test_the_kept_checkpoint_goes_when_the_job_that_started_from_it_ends(
    harness: Harness,
) -> None:
    other, cid, url = _started_from(harness)
    _checkpoint(harness)
    assert os.path.isfile(_metadata(url))
    other.plane.cancel(other.job_id)
    other.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    harness.tick()
    assert not os.path.exists(_metadata(url))
    assert _discarded(harness, cid)


def test_a_checkpoint_nobody_started_from_goes_at_once(harness: Harness) -> None:
    harness.start()
    first = _checkpoint(harness)
    url = "file://" + os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{first}")
    _checkpoint(harness)
    assert not os.path.exists(_metadata(url))
    assert _discarded(harness, first)


def test_the_api_names_the_checkpoint_kept_and_the_job_that_relies_on_it(
    harness: Harness,
) -> None:
    """``latest.origin_of`` of ``GET /jobs/{id}/checkpoints``, from the rows alone."""
    other, cid, url = _started_from(harness)
    _checkpoint(harness)
    with harness.sessions() as s:
        assert origin_of(s, harness.job_id) == [
            {"id": cid, "is_savepoint": False, "external_path": url, "jobs": [other.job_id]}
        ]
        assert origin_of(s, other.job_id) == []
    other.plane.trigger_checkpoint(other.job_id)
    [trigger] = [c for _, c in other.commands() if isinstance(c, p.TriggerCheckpoint)]
    other.ack_all(1, trigger.checkpoint_id)
    with harness.sessions() as s:
        assert origin_of(s, harness.job_id) == []


@pytest.mark.parametrize("spelling", ["_metadata", "link"])
def test_the_checkpoint_is_kept_however_the_other_job_spelled_its_path(
    harness: Harness, tmp_path: os.PathLike[str], spelling: str
) -> None:
    harness.start()
    cid = _checkpoint(harness)
    url = "file://" + os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    if spelling == "_metadata":
        named = url + "/_metadata"
    else:
        link = os.path.join(tmp_path, "latest-checkpoint")
        os.symlink(url.removeprefix("file://"), link)
        named = f"file://{link}"
    other = harness.another_job()
    other.register(
        incarnation="driver-9", from_checkpoint=named, restart_strategy=NO_DELAY, interval_ms=0
    )
    other.running(1)
    _checkpoint(harness)
    _checkpoint(harness)
    assert os.path.isfile(_metadata(url)) and not _discarded(harness, cid)
    restore = _fail(other, 1)
    assert (restore.checkpoint_id, restore.external_path) == (cid, named)


def test_the_owner_that_restores_a_checkpoint_kept_for_another_keeps_it_for_itself(
    harness: Harness,
) -> None:
    other, cid, url = _started_from(harness)
    _checkpoint(harness)
    harness.commands()
    harness.plane.restore(harness.job_id, cid, None)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, cid)
    harness.send(2, p.JobRestored(checkpoint_id=cid, external_path=restore.external_path))
    harness.running(2)
    # The other job no longer needs it; the owner, which has no checkpoint since, does.
    other.plane.trigger_checkpoint(other.job_id)
    [trigger] = [c for _, c in other.commands() if isinstance(c, p.TriggerCheckpoint)]
    other.ack_all(1, trigger.checkpoint_id)
    harness.tick()
    assert os.path.isfile(_metadata(url)) and not _discarded(harness, cid)
    # Its own next checkpoint: then it goes.
    _checkpoint(harness, attempt=2)
    harness.tick()
    assert not os.path.exists(_metadata(url)) and _discarded(harness, cid)


def test_a_checkpoint_being_read_to_start_a_job_from_is_kept_until_that_is_applied(
    harness: Harness,
) -> None:
    harness.start()
    cid = _checkpoint(harness)
    url = "file://" + os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    with harness.plane.starting_from([url + "/"]):  # a registration read it, not applied yet
        _checkpoint(harness)
        harness.tick()
        assert os.path.isfile(_metadata(url)) and not _discarded(harness, cid)
    assert not harness.plane.starting
    harness.tick()  # nobody registered from it: it goes
    assert not os.path.exists(_metadata(url)) and _discarded(harness, cid)


def test_what_an_ended_owner_kept_goes_after_a_control_plane_restart(harness: Harness) -> None:
    """The pin lives in memory and a restarted control plane rebuilds only unfinished jobs:
    an ended owner whose rows keep more checkpoints than it retains is rebuilt too, and its
    kept checkpoint goes once nobody relies on it (else its files stayed for good)."""
    other, cid, url = _started_from(harness)
    _checkpoint(harness)
    harness.plane.cancel(harness.job_id)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    other.new_control_plane()
    harness.cp = other.cp
    harness.tick()
    assert os.path.isfile(_metadata(url)) and not _discarded(harness, cid)  # still relied on
    other.plane.trigger_checkpoint(other.job_id)
    [trigger] = [c for _, c in other.commands() if isinstance(c, p.TriggerCheckpoint)]
    other.ack_all(1, trigger.checkpoint_id)
    harness.tick()
    assert not os.path.exists(_metadata(url)) and _discarded(harness, cid)


def test_a_savepoint_a_job_is_starting_from_is_not_disposed_of(harness: Harness) -> None:
    harness.start()
    savepoint, location = harness.savepoint("sp-starting")
    _checkpoint(harness)  # the savepoint is no longer the newest restore point
    refused = pytest.raises(ConflictError, match="a job is starting from it")
    with harness.plane.starting_from([location + "/_metadata"]), refused:
        harness.plane.dispose_savepoint(location)
    assert harness.plane.dispose_savepoint(location)["checkpoint-id"] == savepoint


def test_a_checkpoint_restored_by_its_id_is_kept_while_the_restore_reads_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention drops it while the restore request checks its files, outside the lock."""
    harness.start(restart_strategy=NO_DELAY)
    cid = _checkpoint(harness)
    url = "file://" + os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    check = requests._check_files

    def meanwhile(*args: object) -> None:
        _checkpoint(harness)
        check(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(requests, "_check_files", meanwhile)
    harness.commands()
    harness.plane.restore(harness.job_id, cid, None)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id) == (2, cid)
    harness.tick()
    assert os.path.isfile(_metadata(url)) and not _discarded(harness, cid)
    harness.send(2, p.JobRestored(checkpoint_id=cid, external_path=restore.external_path))
    harness.running(2)
    _checkpoint(harness, attempt=2)
    harness.tick()
    assert not os.path.exists(_metadata(url)) and _discarded(harness, cid)


def test_an_ended_job_that_no_longer_loads_does_not_stop_a_restart(harness: Harness) -> None:
    other, _, url = _started_from(harness)
    _checkpoint(harness)
    harness.plane.cancel(harness.job_id)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    with harness.sessions() as s:  # rows a newer version can no longer read
        job = s.get(Job, harness.job_id)
        assert job is not None
        job.graph = {"vertices": "not a list"}
        s.commit()
    other.new_control_plane()
    assert other.job_id in other.plane.jobs and harness.job_id not in other.plane.jobs
    assert os.path.isfile(_metadata(url))  # what it kept stays, as before


def test_a_registration_that_read_a_checkpoint_just_before_its_deletion_is_refused(
    harness: Harness, tmp_path: os.PathLike[str]
) -> None:
    """Retention decided, the files were still there when the registration read them: the
    row says it went, and the job does not start from files about to disappear."""
    harness.start()
    cid = _checkpoint(harness)
    url = "file://" + os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    copy = os.path.join(tmp_path, "copy")
    shutil.copytree(url.removeprefix("file://"), copy)
    _checkpoint(harness)
    assert _discarded(harness, cid) and not os.path.exists(_metadata(url))
    shutil.copytree(copy, url.removeprefix("file://"))  # as when the read came first
    other = harness.another_job()
    other.register(incarnation="driver-9", from_checkpoint=url + "/_metadata", interval_ms=0)
    [(_, refused)] = other.commands()
    assert isinstance(refused, p.CancelJob) and refused.status is p.JobStatus.FAILED
    assert f"checkpoint {cid} of job {harness.job_id} there was deleted" in (refused.cause or "")
