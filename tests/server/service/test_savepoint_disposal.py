"""Disposing a savepoint through the control plane: it leaves the job's store and the lists,
its files go, and what a live job still needs is refused."""

from __future__ import annotations

import os
import shutil

import pytest
from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint_server.errors import (
    CheckpointNotFoundError,
    ConflictError,
    InvalidRequestError,
)
from sparkpoint_server.service.storage_io import Location
from sparkpoint_server.storage import savepoints as queries
from sparkpoint_server.storage.models import Checkpoint


def _checkpoint(h: Harness) -> int:
    cid = h.trigger_periodic()
    h.ack_all(1, cid)
    h.commands()
    return cid


def _listed(h: Harness) -> list[int]:
    with h.sessions() as s:
        return [e["id"] for e in queries.savepoints(s, h.job_id, 100)["savepoints"]]


def test_a_savepoint_older_than_the_latest_checkpoint_is_forgotten_and_deleted(
    harness: Harness,
) -> None:
    harness.start(retained=1)
    savepoint, location = harness.savepoint("sp")
    directory = location.removeprefix("file://")
    newer = _checkpoint(harness)
    assert _listed(harness) == [savepoint]
    # A path as a user types it: no scheme, a trailing slash.
    done = harness.plane.dispose_savepoint(directory + "/")
    assert done == {
        "path": location,
        "job-id": harness.job_id,
        "checkpoint-id": savepoint,
        "kind": "savepoint",
        "files": 5,  # _metadata and the four subtasks' state files
        "bytes": done["bytes"],
        "shared-files-kept": 0,
    }
    assert done["bytes"] > 0 and not os.path.exists(directory)
    assert _listed(harness) == []
    rt = harness.plane.jobs[harness.job_id]
    assert rt.coordinator.store.get(savepoint) is None
    assert [cp.checkpoint_id for cp in rt.coordinator.store.all()] == [newer]
    with harness.sessions() as s:
        row = s.get(Checkpoint, (harness.job_id, savepoint))
        assert row is not None and row.discarded
    restarted = harness.new_control_plane().jobs[harness.job_id]  # rebuilt without it
    assert [cp.checkpoint_id for cp in restarted.coordinator.store.all()] == [newer]
    # A second disposal finds nothing there, and nothing that knows it.
    gone = r"savepoint-path: no checkpoint at .*_metadata does not exist"
    with pytest.raises(CheckpointNotFoundError, match=gone):
        harness.plane.dispose_savepoint(location)


def test_what_a_live_job_still_needs_is_refused_and_kept(harness: Harness) -> None:
    harness.start(retained=1)
    checkpoint = _checkpoint(harness)
    savepoint, location = harness.savepoint("sp")
    directory = location.removeprefix("file://")
    # The newest entry of the store: a failover now would restore it.
    with pytest.raises(ConflictError, match=rf"savepoint {savepoint} .* newest restore point"):
        harness.plane.dispose_savepoint(location)
    # A live job's regular checkpoint is the job's to delete.
    store = harness.plane.jobs[harness.job_id].coordinator.store
    retained = store.get(checkpoint)
    assert retained is not None and retained.external_path is not None
    chk = retained.external_path.removeprefix("file://")
    with pytest.raises(ConflictError, match=rf"checkpoint {checkpoint} .* retained by the job"):
        harness.plane.dispose_savepoint(chk)
    assert os.path.isfile(os.path.join(directory, "_metadata"))
    assert os.path.isfile(os.path.join(chk, "_metadata"))
    assert _listed(harness) == [savepoint]
    assert store.get(savepoint) is not None and store.get(checkpoint) is not None
    # Once a later checkpoint completed, it may go.
    _checkpoint(harness)
    assert harness.plane.dispose_savepoint(location)["checkpoint-id"] == savepoint


def test_an_ended_jobs_savepoint_may_go_and_paths_outside_the_roots_may_not(
    harness: Harness, tmp_path: os.PathLike[str]
) -> None:
    harness.start(retained=1)
    savepoint, location = harness.savepoint("sp")
    harness.plane.cancel(harness.job_id)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    assert harness.plane.dispose_savepoint(location)["checkpoint-id"] == savepoint
    outside = os.path.join(str(tmp_path), "elsewhere")
    os.makedirs(outside)
    with pytest.raises(InvalidRequestError, match=r"savepoint-path: .* outside the storage roots"):
        harness.plane.dispose_savepoint(outside)
    with pytest.raises(InvalidRequestError, match=r"savepoint-path: .* must not contain '\.\.'"):
        harness.plane.dispose_savepoint(f"{harness.settings.savepoint_dir}/../x")
    assert os.path.isdir(outside)


def test_a_known_savepoint_whose_files_went_another_way_is_forgotten(harness: Harness) -> None:
    harness.start(retained=1)
    savepoint, location = harness.savepoint("sp")
    _checkpoint(harness)
    shutil.rmtree(location.removeprefix("file://"))  # `sparkpoint savepoint dispose --local`
    assert _listed(harness) == [savepoint]
    done = harness.plane.dispose_savepoint(location)
    assert (done["checkpoint-id"], done["files"], done["bytes"]) == (savepoint, 0, 0)
    assert _listed(harness) == []
    assert harness.plane.jobs[harness.job_id].coordinator.store.get(savepoint) is None


def test_another_spelling_of_the_path_is_no_way_around_the_refusals(harness: Harness) -> None:
    """Its ``_metadata``, or a link to its directory: the job and id its ``_metadata`` names
    are checked in the job's store all the same."""
    harness.start(retained=1)
    _checkpoint(harness)
    savepoint, location = harness.savepoint("sp")
    directory = location.removeprefix("file://")
    link = os.path.join(harness.settings.savepoint_dir, "link")
    os.symlink(directory, link)
    for spelling in (f"{directory}/_metadata", f"{location}/_metadata/", link):
        with pytest.raises(ConflictError, match="newest restore point"):
            harness.plane.dispose_savepoint(spelling)
    assert os.path.isfile(os.path.join(directory, "_metadata"))
    assert _listed(harness) == [savepoint]


def test_a_copy_elsewhere_goes_and_the_jobs_own_savepoint_stays(harness: Harness) -> None:
    harness.start(retained=1)
    savepoint, location = harness.savepoint("sp")
    _checkpoint(harness)
    copy = os.path.join(harness.settings.savepoint_dir, "copy")
    shutil.copytree(location.removeprefix("file://"), copy)
    done = harness.plane.dispose_savepoint(copy)
    assert (done["job-id"], done["checkpoint-id"], done["files"]) == (harness.job_id, savepoint, 5)
    assert not os.path.exists(copy)
    assert os.path.isfile(os.path.join(location.removeprefix("file://"), "_metadata"))
    assert _listed(harness) == [savepoint]
    assert harness.plane.jobs[harness.job_id].coordinator.store.get(savepoint) is not None


def test_a_savepoint_a_restore_reads_is_not_disposed_of_meanwhile(harness: Harness) -> None:
    """A restore of a savepoint by its path pins nothing in the job's store: the restore
    under way refuses the disposal, and a disposal under way refuses the restore."""
    harness.start(retained=1)
    _, location = harness.savepoint("sp")
    _checkpoint(harness)
    harness.plane.restore(harness.job_id, None, location)
    with pytest.raises(ConflictError, match=rf"job {harness.job_id} is restoring it"):
        harness.plane.dispose_savepoint(location)
    assert os.path.isfile(os.path.join(location.removeprefix("file://"), "_metadata"))
    harness.plane.disposing.add(Location.of(location))  # as while its files are deleted
    with pytest.raises(ConflictError, match="is being disposed of"):
        harness.plane.restore(harness.job_id, None, location)


def test_the_savepoint_a_new_job_started_from_stays_until_it_has_a_checkpoint(
    harness: Harness,
) -> None:
    """A job started from a savepoint fails over to it until a checkpoint of its own
    completed; a job whose ``--from-checkpoint`` is being disposed of is refused."""
    harness.start(retained=1)
    savepoint, location = harness.savepoint("sp")
    harness.plane.cancel(harness.job_id)
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    late = harness.another_job()
    harness.plane.disposing.add(Location.of(location))  # as while its files are deleted
    late.register(incarnation="driver-8", from_checkpoint=location)
    [(_, refused)] = late.commands()
    assert isinstance(refused, p.CancelJob) and refused.status is p.JobStatus.FAILED
    assert f"--from-checkpoint {location!r} is being disposed of" in (refused.cause or "")
    harness.plane.disposing.clear()
    resumed = harness.another_job()
    resumed.register(incarnation="driver-9", from_checkpoint=location)
    resumed.running(1)
    resumed.commands()
    with pytest.raises(ConflictError, match=rf"job {resumed.job_id} restored it"):
        harness.plane.dispose_savepoint(location)
    assert os.path.isfile(os.path.join(location.removeprefix("file://"), "_metadata"))
    own = resumed.trigger_periodic()
    resumed.ack_all(1, own)
    assert harness.plane.dispose_savepoint(location)["checkpoint-id"] == savepoint
