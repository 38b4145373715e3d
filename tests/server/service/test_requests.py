"""REST requests that steer a job: savepoints, restore to N, cancel, stop, configuration."""

from __future__ import annotations

import json
import os

import pytest
from service_harness import VERTICES, Harness

from sparkpoint import protocol as p
from sparkpoint_server.errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptCheckpointError,
    InvalidRequestError,
    JobNotFoundError,
)
from sparkpoint_server.storage.checkpoint_stats import checkpoint_statistics
from sparkpoint_server.storage.models import Checkpoint, Job, Operation


def _op(h: Harness, request_id: str) -> Operation:
    with h.sessions() as s:
        op = s.get(Operation, request_id)
        assert op is not None
        return op


def _job(h: Harness) -> Job:
    with h.sessions() as s:
        job = s.get(Job, h.job_id)
        assert job is not None
        return job


def _completed(h: Harness, n: int) -> list[int]:
    ids = []
    for _ in range(n):
        cid = h.trigger_periodic()
        h.ack_all(1, cid, sink=True)
        for i in range(2):
            h.send(
                1,
                p.SinkCommitted(
                    checkpoint_id=cid, operator_id="pv", subtask=i, transaction_id="t", parts=1
                ),
            )
        ids.append(cid)
    h.commands()
    return ids


def test_savepoint_completes_in_its_own_directory_and_survives_retention(
    harness: Harness, tmp_path: os.PathLike[str]
) -> None:
    harness.start(retained=1)
    target = os.path.join(harness.settings.savepoint_dir, "kept")  # under a storage root
    request = harness.plane.trigger_savepoint(harness.job_id, target, cancel_job=False)
    [trigger] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    assert trigger.kind is p.CheckpointKind.SAVEPOINT and trigger.target_directory == target
    assert _op(harness, request).status == "IN_PROGRESS"
    harness.ack_all(1, trigger.checkpoint_id)
    op = _op(harness, request)
    assert op.status == "COMPLETED" and op.location is not None
    directory = op.location.removeprefix("file://")
    assert directory.startswith(target) and os.path.isfile(os.path.join(directory, "_metadata"))
    with open(os.path.join(directory, "_metadata")) as fh:
        meta = json.load(fh)
    paths = [h["path"] for a in meta["acks"] for h in a["handles"]]
    assert len(paths) == 4 and all(path.startswith(f"file://{directory}/") for path in paths)
    assert all(os.path.isfile(path.removeprefix("file://")) for path in paths)
    _completed(harness, 3)  # retention (1) drops checkpoints, never the savepoint
    assert os.path.isfile(os.path.join(directory, "_metadata"))


def test_restore_to_checkpoint_n_starts_a_new_attempt_and_completes(harness: Harness) -> None:
    harness.start(retained=3)
    first, second, _third = _completed(harness, 3)
    request = harness.plane.restore(harness.job_id, first, None)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert (restore.new_attempt, restore.checkpoint_id, restore.request_id) == (2, first, request)
    assert restore.cause == f"restore of checkpoint {first} requested"  # the driver says why
    assert _job(harness).status == "RESTARTING" and _op(harness, request).status == "IN_PROGRESS"
    harness.send(2, p.JobRestored(checkpoint_id=first, external_path=restore.external_path))
    harness.running(2)
    op = _op(harness, request)
    assert (op.status, op.checkpoint_id) == ("COMPLETED", first)
    job = _job(harness)
    assert (job.status, job.attempt, job.restored_checkpoint_id) == ("RUNNING", 2, first)
    # Ids keep increasing after a restore.
    assert harness.trigger_periodic() == 4
    del second


def _restored(h: Harness) -> dict[str, object]:
    """``latest.restored`` of the job's checkpointing statistics, as the REST API serves it."""
    with h.sessions() as s:
        restored = checkpoint_statistics(s, h.job_id, 10)["latest"]["restored"]
    assert isinstance(restored, dict)
    return restored


def test_the_latest_restore_shows_how_long_its_state_took_and_when_records_flowed(
    harness: Harness,
) -> None:
    """The first epoch after a restore reports its timings; later epochs keep them; the next
    restore starts without any until its own first epoch ends."""
    harness.start(retained=3)
    first, second = _completed(harness, 2)
    harness.plane.restore(harness.job_id, first, None)
    harness.send(2, p.JobRestored(checkpoint_id=first))
    harness.running(2)
    timings = ("state_restore_duration", "first_record_timestamp", "epoch_reported")
    assert [_restored(harness)[k] for k in timings] == [None, None, False]
    restored_at = _restored(harness)["restore_timestamp"]
    assert isinstance(restored_at, int)
    harness.epoch_ended(
        2, 1, restore_duration_ms=84.5, first_record_after_restore=restored_at + 700
    )
    harness.epoch_ended(2, 2)  # an epoch that restored nothing leaves them as they are
    assert [_restored(harness)[k] for k in timings] == [84.5, restored_at + 700, True]
    harness.plane.restore(harness.job_id, second, None)
    harness.send(3, p.JobRestored(checkpoint_id=second))
    harness.running(3)
    assert _restored(harness)["id"] == second
    assert [_restored(harness)[k] for k in timings] == [None, None, False]
    harness.epoch_ended(3, 1)  # its first epoch ended, restoring no keyed state (none reported)
    assert [_restored(harness)[k] for k in timings] == [None, None, True]


def test_restore_refuses_unknown_missing_and_corrupt_checkpoints(harness: Harness) -> None:
    harness.start(retained=2)
    first, second = _completed(harness, 2)
    with pytest.raises(CheckpointNotFoundError, match=r"checkpoint 99 .* savepoints: \[1, 2\]"):
        harness.plane.restore(harness.job_id, 99, None)
    state = os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{first}", "pv-0-a1")
    with open(state, "wb") as fh:
        fh.write(b"tampered")
    with pytest.raises(CorruptCheckpointError, match="pv-0-a1"):
        harness.plane.restore(harness.job_id, first, None)
    os.remove(os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{second}", "_metadata"))
    with pytest.raises(CheckpointNotFoundError, match=f"checkpoint {second}"):
        harness.plane.restore(harness.job_id, second, None)
    with pytest.raises(InvalidRequestError, match="exactly one"):
        harness.plane.restore(harness.job_id, first, "/x")
    nowhere = os.path.join(harness.settings.savepoint_dir, "nowhere", "savepoint-1")
    with pytest.raises(CheckpointNotFoundError, match="savepoint_path"):
        harness.plane.restore(harness.job_id, None, nowhere)
    with pytest.raises(JobNotFoundError):
        harness.plane.restore("no-such-job", first, None)
    assert _job(harness).attempt == 1  # nothing changed


def test_restore_from_a_savepoint_path(harness: Harness, tmp_path: os.PathLike[str]) -> None:
    harness.start()
    request = harness.plane.trigger_savepoint(
        harness.job_id, f"{harness.settings.savepoint_dir}/sp", cancel_job=False
    )
    [trigger] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    harness.ack_all(1, trigger.checkpoint_id)
    location = _op(harness, request).location
    assert location is not None
    harness.commands()
    restore_request = harness.plane.restore(harness.job_id, None, location)
    [restore] = [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)]
    assert restore.savepoint_path == location and restore.request_id == restore_request


def test_a_savepoint_of_another_max_parallelism_is_refused_naming_the_value(
    harness: Harness,
) -> None:
    """Key groups are the key's hash modulo the max parallelism: keyed state taken with
    another cannot be restored (the job's tasks would refuse it at every restart)."""
    keyed = p.VertexModel(
        id="pv", name="pv -> sink", parallelism=2, max_parallelism=128, operators=["pv", "sink"]
    )
    harness.start(vertices=[VERTICES[0], keyed])
    request = harness.plane.trigger_savepoint(harness.job_id, None, cancel_job=False)
    [trigger] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    harness.ack_all(1, trigger.checkpoint_id)
    location = _op(harness, request).location
    assert location is not None
    metadata_file = os.path.join(location.removeprefix("file://"), "_metadata")
    with open(metadata_file) as fh:
        metadata = json.load(fh)
    for ack in metadata["acks"]:  # as a job with --max-parallelism 64 records its handles
        if ack["operator_id"] == "pv":
            for handle in ack["handles"]:
                handle["max_parallelism"] = 64
    with open(metadata_file, "w") as fh:
        json.dump(metadata, fh)
    harness.commands()
    with pytest.raises(
        InvalidRequestError,
        match=f"checkpoint {trigger.checkpoint_id} holds the keyed state of pv with max "
        f"parallelism 64, and job {harness.job_id} runs with 128: every key would change key "
        "group. Start a new job from it with --max-parallelism 64",
    ):
        harness.plane.restore(harness.job_id, None, location)
    assert [c for _, c in harness.commands() if isinstance(c, p.RestoreJob)] == []
    # The same value restores.
    for ack in metadata["acks"]:
        for handle in ack["handles"]:
            if ack["operator_id"] == "pv":
                handle["max_parallelism"] = 128
    with open(metadata_file, "w") as fh:
        json.dump(metadata, fh)
    harness.plane.restore(harness.job_id, None, location)
    assert [type(c) for _, c in harness.commands()] == [p.RestoreJob]


def test_cancel_and_stop_with_savepoint(harness: Harness, tmp_path: os.PathLike[str]) -> None:
    harness.start()
    request = harness.plane.stop_with_savepoint(
        harness.job_id, f"{harness.settings.savepoint_dir}/sp"
    )
    [stop] = [c for _, c in harness.commands() if isinstance(c, p.StopWithSavepoint)]
    harness.ack_all(1, stop.checkpoint_id)
    assert _op(harness, request).status == "COMPLETED"
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.FINISHED))
    assert _job(harness).status == "FINISHED"
    with pytest.raises(ConflictError, match="FINISHED"):
        harness.plane.cancel(harness.job_id)
    # A restarted control plane keeps ended jobs in its database only: still named with their
    # status.
    harness.new_control_plane()
    with pytest.raises(ConflictError) as refused:
        harness.plane.cancel(harness.job_id)
    assert str(refused.value) == f"job {harness.job_id} is FINISHED; the request needs a live job"


def test_cancel_a_running_job(harness: Harness) -> None:
    harness.start()
    harness.trigger_periodic()
    request = harness.plane.cancel(harness.job_id)
    types = harness.command_types()
    assert types == ["checkpoint_abort", "cancel"] and _job(harness).status == "CANCELLING"
    harness.send(1, p.JobStatusChanged(status=p.JobStatus.CANCELED))
    assert _job(harness).status == "CANCELED" and _op(harness, request).status == "COMPLETED"


def test_configuration_changes_apply_from_the_next_trigger(harness: Harness) -> None:
    harness.start()
    stored = harness.plane.update_checkpoint_config(harness.job_id, {"interval_ms": 5000})
    assert stored["interval_ms"] == 5000 and _job(harness).checkpoint_config["interval_ms"] == 5000
    assert harness.command_types() == ["configuration_changed"]
    harness.tick(4999)
    assert harness.commands() == []
    harness.tick(1)
    assert harness.command_types() == ["trigger_checkpoint"]
    with pytest.raises(InvalidRequestError, match="mode"):
        harness.plane.update_checkpoint_config(harness.job_id, {"mode": 1})
    with pytest.raises(InvalidRequestError, match="retained"):
        harness.plane.update_checkpoint_config(harness.job_id, {"retained": 0})


def test_a_timeout_shorter_than_every_epoch_is_refused_with_one_that_would_do(
    harness: Harness,
) -> None:
    """A barrier rides one whole epoch: a timeout below the job's shortest epoch would
    expire every checkpoint. The first epoch of an attempt (start-up) is not counted, and
    nothing is refused before three epochs after it were measured."""
    harness.start()
    harness.epoch_ended(1, 0, duration_ms=2_500.0)  # start-up: left out
    for epoch, duration in ((1, 420.0), (2, 310.0)):
        harness.epoch_ended(1, epoch, duration_ms=duration)
    harness.plane.update_checkpoint_config(harness.job_id, {"timeout_ms": 100})  # not known yet
    harness.epoch_ended(1, 3, duration_ms=380.0)
    with pytest.raises(InvalidRequestError) as err:
        harness.plane.update_checkpoint_config(harness.job_id, {"timeout_ms": 50})
    assert (err.value.field, str(err.value)) == (
        "timeout",
        f"timeout: 50 ms is shorter than every epoch job {harness.job_id} ran lately (the "
        "shortest took 310 ms): a checkpoint travels with an epoch, so every checkpoint would "
        "expire; give it at least 800 ms",
    )
    assert _job(harness).checkpoint_config["timeout_ms"] == 100  # unchanged
    stored = harness.plane.update_checkpoint_config(harness.job_id, {"timeout_ms": 800})
    assert stored["timeout_ms"] == 800


def test_restart_strategy_set_while_running(harness: Harness) -> None:
    harness.start()
    conf = harness.plane.set_restart_strategy(harness.job_id, {"restart-strategy.type": "none"})
    assert conf["restart-strategy.type"] == "none" and "description" in conf
    with pytest.raises(InvalidRequestError, match="attempts"):
        harness.plane.set_restart_strategy(
            harness.job_id,
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": -1},
        )
    assert _job(harness).restart_strategy == {"restart-strategy.type": "none"}
    harness.send(1, p.TaskFailed(epoch=1, cause="boom"))
    assert _job(harness).status == "FAILED"


def test_savepoint_of_a_job_that_is_not_running_is_refused(harness: Harness) -> None:
    harness.register()
    with pytest.raises(ConflictError, match="CREATED"):
        harness.plane.trigger_savepoint(harness.job_id, None, cancel_job=False)
    with pytest.raises(InvalidRequestError, match="target-directory"):
        harness.plane.trigger_savepoint(harness.job_id, "relative/dir", cancel_job=False)
    with harness.sessions() as s:
        assert s.query(Checkpoint).count() == 0


def _triggers(h: Harness) -> list[p.TriggerCheckpoint]:
    return [c for _, c in h.commands() if isinstance(c, p.TriggerCheckpoint)]


def test_a_manual_checkpoint_while_one_is_pending_is_queued_and_runs_next(
    harness: Harness,
) -> None:
    harness.start(interval_ms=1000, max_concurrent=1)
    first = harness.trigger_periodic()
    # Two requests while `first` is pending: queued (Flink's CheckpointRequestDecider), not 409.
    early = harness.plane.trigger_checkpoint(harness.job_id)
    later = harness.plane.trigger_checkpoint(harness.job_id)
    assert _triggers(harness) == []
    assert _op(harness, early).status == "IN_PROGRESS" and _op(harness, early).checkpoint_id is None
    harness.ack_all(1, first)
    harness.tick(1000)  # the interval passed too: the queued request goes before a periodic one
    [queued] = _triggers(harness)
    assert queued.checkpoint_id == first + 1 and _op(harness, early).checkpoint_id == first + 1
    # A restart of the control plane keeps the other request queued, in order.
    harness.new_control_plane()
    harness.commands()  # the re-sent trigger of the pending checkpoint
    harness.ack_all(1, queued.checkpoint_id)
    assert _op(harness, early).status == "COMPLETED"
    harness.tick()
    [second] = _triggers(harness)
    assert _op(harness, later).checkpoint_id == second.checkpoint_id == first + 2
    harness.ack_all(1, second.checkpoint_id)
    assert _op(harness, later).status == "COMPLETED"


def test_queued_checkpoint_requests_fail_with_the_reason_when_the_job_stops_running(
    harness: Harness,
) -> None:
    harness.start(interval_ms=1000, max_concurrent=1)
    harness.trigger_periodic()
    request = harness.plane.trigger_checkpoint(harness.job_id)
    harness.plane.cancel(harness.job_id)
    op = _op(harness, request)
    assert op.status == "FAILED" and op.checkpoint_id is None
    assert op.failure_cause is not None and "queued and not triggered" in op.failure_cause
    assert "CANCELLING" in op.failure_cause


def test_a_restarted_driver_hears_the_configuration_changed_before_it_registered(
    harness: Harness,
) -> None:
    """Its command line still says 1 s; the control plane's 5 s wins and is told to it."""
    harness.start()
    harness.plane.update_checkpoint_config(harness.job_id, {"interval_ms": 5000, "retained": 3})
    harness.commands()
    harness.register(incarnation="driver-2")  # `sparkpoint run` restarted the driver
    commands = [c for _, c in harness.commands()]
    assert commands[0] == p.ConfigurationChanged(changes={"interval_ms": 5000, "retained": 3})
    assert isinstance(commands[-1], p.RestoreJob) and commands[-1].new_attempt == 2
    harness.register(incarnation="driver-3", interval_ms=5000, retained=3)  # as now: not told
    assert not any(isinstance(c, p.ConfigurationChanged) for _, c in harness.commands())
