"""Storage roots: where savepoints, restores and registered jobs may read and write."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from service_harness import Harness

from sparkpoint import protocol as p
from sparkpoint_server.config import load_settings
from sparkpoint_server.errors import InvalidRequestError, SettingsError
from sparkpoint_server.storage.models import Job


def _configure(h: Harness, roots: str | None) -> None:
    h.settings = load_settings(data_dir=str(h.tmp / "data"), storage_roots=roots)
    h.new_control_plane()


@pytest.mark.parametrize(
    "target",
    ["/root", "/root/savepoints", "memory://savepoints", "file:///etc", "/tmp/x\x00y"],
)
def test_a_savepoint_outside_the_roots_is_refused_naming_them(
    harness: Harness, target: str
) -> None:
    harness.start()
    data = str(harness.settings.data_dir.resolve())
    with pytest.raises(InvalidRequestError, match="target-directory") as err:
        harness.plane.trigger_savepoint(harness.job_id, target, cancel_job=False)
    assert "outside the storage roots" in str(err.value) or "unknown filesystem" in str(err.value)
    if "outside" in str(err.value):
        assert f"{data}/savepoints" in str(err.value) and harness.checkpoint_dir in str(err.value)
    with pytest.raises(InvalidRequestError, match="target-directory"):
        harness.plane.stop_with_savepoint(harness.job_id, target)
    with pytest.raises(InvalidRequestError, match="savepoint_path"):
        harness.plane.restore(harness.job_id, None, target)
    assert harness.command_types() == []


def test_by_default_the_servers_directories_and_the_jobs_own_are_roots(
    harness: Harness,
) -> None:
    harness.start()
    for target in (
        os.path.join(harness.settings.savepoint_dir, "mine"),
        f"file://{harness.checkpoint_dir}/sp",
    ):
        harness.plane.trigger_savepoint(harness.job_id, target, cancel_job=False)
        [trigger] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
        harness.ack_all(1, trigger.checkpoint_id)
        path = trigger.target_directory
        assert path is not None
        kept = os.listdir(path.removeprefix("file://"))
        assert kept == [f"savepoint-{harness.job_id[:8]}-{trigger.checkpoint_id}"]


def test_configured_roots_replace_the_jobs_own_directory(harness: Harness) -> None:
    elsewhere = harness.tmp / "elsewhere"
    _configure(harness, f"file://{elsewhere}")
    harness.register()  # its checkpoint directory is not under the configured roots
    [(env, cancel)] = harness.commands()
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert env.attempt == 0
    assert f"checkpoint_dir '{harness.checkpoint_dir}' is outside the storage roots" in (
        cancel.cause or ""
    )
    assert str(elsewhere) in (cancel.cause or "")
    with harness.sessions() as s:
        assert s.get(Job, harness.job_id) is None
    harness.register(checkpoint_dir=f"file://{elsewhere}/chk")  # under a root: accepted
    assert harness.command_types() == ["restore"]
    harness.running(1)
    harness.plane.trigger_savepoint(harness.job_id, str(elsewhere / "sp"), cancel_job=False)
    with pytest.raises(InvalidRequestError, match="outside the storage roots"):
        harness.plane.trigger_savepoint(harness.job_id, harness.checkpoint_dir, cancel_job=False)


def test_a_remote_checkpoint_directory_needs_a_configured_root(harness: Harness) -> None:
    harness.register(checkpoint_dir="memory://checkpoints")
    [(_, cancel)] = harness.commands()
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert "'memory://checkpoints' is outside the storage roots" in (cancel.cause or "")


@pytest.mark.parametrize("field", ["checkpoint_dir", "from_checkpoint"])
def test_a_relative_directory_is_refused_at_registration(harness: Harness, field: str) -> None:
    """The driver's relative path, read in the control plane's own working directory, is
    another directory: the state files and the `_metadata` would part (drivers resolve
    their paths; this refuses one that did not)."""
    harness.register(**{field: "rel/chk"})
    [(_, cancel)] = harness.commands()
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert f"{field} 'rel/chk' is a relative path" in (cancel.cause or "")


def test_a_job_cannot_make_the_data_directory_a_root(harness: Harness) -> None:
    harness.register(checkpoint_dir=f"file://{harness.tmp}")
    [(_, cancel)] = harness.commands()
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert "contains the control plane's data directory" in (cancel.cause or "")


@pytest.mark.parametrize("field", ["path", "shared"])
def test_a_crafted_metadata_cannot_make_the_server_read_outside_the_roots(
    harness: Harness, field: str
) -> None:
    harness.start()
    harness.plane.trigger_savepoint(harness.job_id, None, cancel_job=False)
    [trigger] = [c for _, c in harness.commands() if isinstance(c, p.TriggerCheckpoint)]
    harness.ack_all(1, trigger.checkpoint_id)
    [savepoint] = os.listdir(harness.settings.savepoint_dir)
    metadata_file = os.path.join(harness.settings.savepoint_dir, savepoint, "_metadata")
    with open(metadata_file) as fh:
        metadata = json.load(fh)
    secret = harness.settings.data_dir / "api-token"  # beside the savepoints, not under a root
    secret.write_bytes(b"not for you")
    _name_file(metadata, field, f"file://{secret}")
    with open(metadata_file, "w") as fh:
        json.dump(metadata, fh)
    with pytest.raises(InvalidRequestError, match="outside the storage roots") as err:
        harness.plane.restore(harness.job_id, None, os.path.dirname(metadata_file))
    assert str(secret) in str(err.value)
    assert "size" not in str(err.value) and "checksum" not in str(err.value)
    assert [t for t in harness.command_types() if t == "restore"] == []


def _name_file(metadata: dict[str, Any], field: str, url: str) -> None:
    """Make the first handle of ``metadata`` name ``url``: as its ``path``, or as a shared
    file of a native snapshot (``shared``)."""
    handle = metadata["acks"][0]["handles"][0]
    if field == "path":
        handle["path"] = url
    else:
        handle["format"] = "rocksdb-native-v1"
        handle["shared"] = [{"path": url, "size": 11, "checksum": "sha256:00"}]


@pytest.mark.parametrize("field", ["path", "shared"])
def test_a_start_checkpoint_naming_state_outside_the_roots_is_refused(
    harness: Harness, field: str
) -> None:
    harness.start()
    cid = harness.trigger_periodic()
    harness.ack_all(1, cid)
    chk = os.path.join(harness.checkpoint_dir, harness.job_id, f"chk-{cid}")
    with open(os.path.join(chk, "_metadata")) as fh:
        metadata = json.load(fh)
    secret = harness.settings.data_dir / "api-token"  # beside the checkpoints, not under a root
    secret.write_bytes(b"not for you")
    _name_file(metadata, field, f"file://{secret}")
    with open(os.path.join(chk, "_metadata"), "w") as fh:
        json.dump(metadata, fh)
    other = Harness(harness.tmp / "other", harness.sessions, harness.client, harness.streams)
    other.cp = harness.plane
    other.register(from_checkpoint=f"file://{chk}")
    [(_, cancel)] = other.commands()
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert f"names state at 'file://{secret}', outside the storage roots" in (cancel.cause or "")
    with harness.sessions() as s:
        assert s.get(Job, other.job_id) is None


@pytest.mark.parametrize(
    ("roots", "why"),
    [
        ("memory://sp", "in the control plane's memory"),
        ("relative/sp", "neither an absolute path nor a URL"),
    ],
)
def test_roots_no_job_can_use_are_refused_at_start(harness: Harness, roots: str, why: str) -> None:
    with pytest.raises(SettingsError, match=f"SPARKPOINT_STORAGE_ROOTS: .*{why}"):
        load_settings(data_dir=str(harness.tmp / "data"), storage_roots=roots)


def test_a_missing_start_checkpoint_beside_the_data_directory_is_refused_as_missing(
    harness: Harness,
) -> None:
    missing = harness.tmp / "no-such-checkpoint"  # the directory holding it holds data/ too
    harness.register(from_checkpoint=f"file://{missing}")
    [(_, cancel)] = harness.commands()
    assert isinstance(cancel, p.CancelJob) and cancel.status is p.JobStatus.FAILED
    assert f"--from-checkpoint 'file://{missing}'" in (cancel.cause or "")
    assert "_metadata" in (cancel.cause or "") and "data directory" not in (cancel.cause or "")
    # Said once, then where to find one that stays.
    assert (cancel.cause or "").startswith(
        f"the control plane refused job {harness.job_id}: --from-checkpoint 'file://{missing}': "
        f"no checkpoint at file://{missing}: "
    ), cancel.cause
    assert (cancel.cause or "").endswith(
        "start from a savepoint (sparkpoint savepoint JOB) or from a checkpoint it retains "
        "now (sparkpoint checkpoints JOB)"
    ), cancel.cause
