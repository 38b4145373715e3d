"""Checkpoint storage on a real S3 API (moto's server, through s3fs): state handles,
``_metadata`` put in one request, incomplete checkpoints, native snapshots and their shared
files, savepoints, and the options shipped to executors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.savepoints import write_savepoint
from sparkpoint.checkpointing.storage import (
    FileSystemCheckpointStorage,
    checkpoint_storage_from_options,
)
from sparkpoint.errors import CheckpointNotFoundError, CorruptSnapshotError
from sparkpoint.protocol import CheckpointKind, SnapshotCompleted, StateHandleModel

from ...support.s3 import S3Bucket, s3, s3_endpoint  # noqa: F401 - fixtures

JOB = "job-s3"


def _storage(s3: S3Bucket) -> FileSystemCheckpointStorage:  # noqa: F811
    storage = checkpoint_storage_from_options("filesystem", s3.url("chk"), 0)
    assert isinstance(storage, FileSystemCheckpointStorage)
    return storage


def _keys(s3: S3Bucket) -> list[str]:  # noqa: F811
    prefix = f"{s3.name}/chk/{JOB}/"
    return sorted(k.removeprefix(prefix) for k in s3.fs().find(f"{s3.name}/chk/{JOB}"))


def test_state_and_metadata_round_trip_with_metadata_put_last(s3: S3Bucket) -> None:  # noqa: F811
    storage = _storage(s3)
    storage.check_writable(JOB)
    handle = storage.write_state(JOB, 1, "pv-0", b"state bytes")
    assert handle.path == s3.url("chk", JOB, "chk-1", "pv-0")
    assert storage.completed_checkpoint_ids(JOB) == []  # no _metadata: not completed
    path = storage.write_metadata(JOB, 1, {"acks": [{"handles": [handle.model_dump()]}]})
    assert path == s3.url("chk", JOB, "chk-1")
    # One put of _metadata: no temporary object left behind, nothing else in the directory.
    assert _keys(s3) == ["chk-1/_metadata", "chk-1/pv-0"]
    assert storage.completed_checkpoint_ids(JOB) == [1]
    assert storage.read_metadata(path)["acks"][0]["handles"][0]["path"] == handle.path
    assert storage.read_state(handle) == b"state bytes"
    storage.verify_checkpoint(JOB, 1)


def test_a_store_written_by_another_process_is_seen_at_once(s3: S3Bucket) -> None:  # noqa: F811
    """The driver lists what executors wrote after its own listing: no stale listing cache."""
    driver = _storage(s3)
    driver.write_metadata(JOB, 1, {"acks": []})
    assert driver.completed_checkpoint_ids(JOB) == [1]  # the driver has listed the job
    executor = pickle.loads(pickle.dumps(driver))
    executor._fs = s3.fs().__class__(skip_instance_cache=True, **executor._storage_options)
    executor.write_state(JOB, 2, "pv-0", b"x")  # through a filesystem of its own
    executor.write_metadata(JOB, 2, {"acks": []})
    assert driver.completed_checkpoint_ids(JOB) == [1, 2]


def test_incomplete_checkpoints_are_cleaned_and_discard_removes_everything(
    s3: S3Bucket,  # noqa: F811
) -> None:
    storage = _storage(s3)
    storage.write_state(JOB, 1, "pv-0", b"a")
    storage.write_metadata(JOB, 1, {"acks": []})
    storage.write_state(JOB, 2, "pv-0", b"b")  # failed before its _metadata
    storage.write_state(JOB, 3, "pv-0", b"c")  # in flight
    assert storage.cleanup_incomplete(JOB, keep=[3]) == [2]
    assert _keys(s3) == ["chk-1/_metadata", "chk-1/pv-0", "chk-3/pv-0"]
    storage.discard(JOB, 1)
    assert _keys(s3) == ["chk-3/pv-0"]
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint at"):
        storage.read_checkpoint_metadata(JOB, 1)


def test_altered_state_on_s3_is_named(s3: S3Bucket) -> None:  # noqa: F811
    storage = _storage(s3)
    handle = storage.write_state(JOB, 1, "pv-0", b"good bytes")
    s3.fs().pipe_file(f"{s3.name}/chk/{JOB}/chk-1/pv-0", b"evil bytes")
    with pytest.raises(CorruptSnapshotError, match=r"state file s3://.*pv-0 has checksum"):
        storage.read_state(handle)


def test_native_snapshots_share_files_and_sweep_them_on_s3(
    s3: S3Bucket,  # noqa: F811
    tmp_path: Path,
) -> None:
    storage = _storage(s3)
    sst, current = tmp_path / "000007.sst", tmp_path / "CURRENT"
    sst.write_bytes(b"sst" * 1000)
    current.write_bytes(b"MANIFEST-1\n")
    common = {"key_group_range": None, "fmt": "rocksdb-native-v1"}
    first = storage.write_native(
        JOB, 1, "pv-0", {"CURRENT": str(current)}, {"000007.sst": str(sst)}, [], **common
    )
    storage.write_metadata(JOB, 1, {"acks": [{"handles": [first.model_dump(mode="json")]}]})
    second = storage.write_native(
        JOB, 2, "pv-0", {"CURRENT": str(current)}, {}, first.shared, **common
    )
    storage.write_metadata(JOB, 2, {"acks": [{"handles": [second.model_dump(mode="json")]}]})
    assert [r.path for r in second.shared] == [s3.url("chk", JOB, "shared", "pv-0-c1-000007.sst")]
    restored = tmp_path / "restored"
    storage.fetch_native(second, str(restored))
    assert (restored / "000007.sst").read_bytes() == sst.read_bytes()
    storage.discard(JOB, 1)  # checkpoint 2 still references the shared file
    assert "shared/pv-0-c1-000007.sst" in _keys(s3)
    third = storage.write_native(JOB, 3, "pv-0", {"CURRENT": str(current)}, {}, [], **common)
    storage.write_metadata(JOB, 3, {"acks": [{"handles": [third.model_dump(mode="json")]}]})
    storage.discard(JOB, 2)  # no remaining checkpoint references it now
    assert _keys(s3) == ["chk-3/_metadata", "chk-3/pv-0/CURRENT", "chk-3/pv-0/_manifest.json"]


def test_executors_get_the_drivers_endpoint_and_local_storage_is_unchanged(
    s3: S3Bucket,  # noqa: F811
    tmp_path: Path,
) -> None:
    shipped = pickle.loads(pickle.dumps(_storage(s3)))
    assert shipped._storage_options["endpoint_url"] == s3.endpoint_url
    assert shipped._storage_options["use_listings_cache"] is False
    local = FileSystemCheckpointStorage(f"file://{tmp_path}")
    assert local._storage_options == {}  # file:// keeps its options exactly as given


def test_a_savepoint_on_s3_is_self_contained_and_outlives_its_checkpoint(
    s3: S3Bucket,  # noqa: F811
) -> None:
    storage = _storage(s3)
    handle = storage.write_state(JOB, 4, "pv-0", b"savepoint state")
    ack = SnapshotCompleted(
        checkpoint_id=4,
        operator_id="pv",
        subtask=0,
        epoch=3,
        ack_timestamp=1,
        start_delay_ms=0,
        alignment_duration_ms=0,
        alignment_buffered_bytes=0,
        sync_duration_ms=0,
        async_duration_ms=0,
        state_size=15,
        checkpointed_size=15,
        handles=[handle],
    )
    cp = CompletedCheckpoint(4, CheckpointKind.SAVEPOINT, 1, 1, 2, 1.0, True, {("pv", 0): ack})
    path, acks = write_savepoint(JOB, cp, {("pv", 0): ack}, storage, s3.url("savepoints"))
    assert path == s3.url("savepoints", f"savepoint-{JOB[:8]}-4")
    prefix = f"{s3.name}/savepoints/savepoint-{JOB[:8]}-4/"
    assert sorted(k.removeprefix(prefix) for k in s3.fs().find(prefix)) == ["_metadata", "pv-0"]
    storage.discard(JOB, 4)  # the savepoint does not need the checkpoint any more
    restore = FileSystemCheckpointStorage(path)
    meta = restore.read_metadata(path)
    copied = StateHandleModel.model_validate(meta["acks"][0]["handles"][0])
    assert copied == acks[("pv", 0)].handles[0] and copied.path == f"{path}/pv-0"
    assert restore.read_state(copied) == b"savepoint state"
