"""Restoring "the latest" when its state files are corrupt or missing (standalone), and the
rocksdb backend's incremental checkpoints through filesystem checkpoint storage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkpoint import protocol as p
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.pending import CompletedCheckpoint
from sparkpoint.checkpointing.restart import FixedDelayRestartStrategy
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.clock import ManualClock
from sparkpoint.protocol import SharedFileModel, StateHandleModel
from sparkpoint.runtime.authority import InProcessAuthority, JobFailedError
from sparkpoint.runtime.recovery import RestorePoint, checkpoint_metadata, newest_restorable
from sparkpoint.state.key_groups import KeyGroupRange

from .shared_state_support import (
    FMT,
    JOB,
    LocalFiles,
    complete,
    fs_path,
    sha,
    shared_names,
    snapshot,
)

# ----------------------------------------------------------------------------- fallback


def _completed(cid: int, handle: StateHandleModel) -> CompletedCheckpoint:
    ack = p.SnapshotCompleted(
        checkpoint_id=cid,
        operator_id="pv",
        subtask=0,
        epoch=cid,
        ack_timestamp=cid,
        start_delay_ms=0,
        alignment_duration_ms=0,
        alignment_buffered_bytes=0,
        sync_duration_ms=0,
        async_duration_ms=0,
        state_size=handle.size,
        checkpointed_size=handle.size,
        handles=[handle],
        source_positions={"s-0": cid},
    )
    return CompletedCheckpoint(
        checkpoint_id=cid,
        kind=p.CheckpointKind.CHECKPOINT,
        attempt=1,
        trigger_timestamp=cid,
        completion_timestamp=cid,
        end_to_end_duration_ms=1.0,
        is_final=False,
        acks={("pv", 0): ack},
    )


class _FakeJob:
    """The job side of a standalone failover: what the authority asks of it, recorded."""

    def __init__(self) -> None:
        self.job_id = JOB
        self.attempt = 1
        self.clock = ManualClock()
        self.options = SimpleNamespace(checkpoint=CheckpointConfig(retained=3))
        self.graph = SimpleNamespace(tasks=lambda: {"pv": 1})
        self.restored: list[Any] = []
        self.statuses: list[tuple[p.JobStatus, str | None]] = []

    def publish(self, *payloads: Any) -> None:
        pass

    def set_status(self, status: p.JobStatus, cause: str | None = None) -> None:
        self.statuses.append((status, cause))

    def restore(self, point: RestorePoint | None, storage: Any) -> None:
        self.restored.append(point.checkpoint_id if point else None)


def _authority(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> tuple[InProcessAuthority, _FakeJob, list[str]]:
    """A standalone authority with checkpoints 1..3 retained; their shared files' URLs."""
    job = _FakeJob()
    authority = InProcessAuthority(job, FixedDelayRestartStrategy(attempts=5, delay_ms=0), storage)  # type: ignore[arg-type]
    completed: list[CompletedCheckpoint] = []
    urls: list[str] = []
    reused: list[SharedFileModel] = []
    for cid in (1, 2, 3):
        handle = storage.write_native(
            JOB,
            cid,
            "pv-0",
            {"CURRENT": files.make()},
            {f"{cid}.sst": files.make()},
            reused,
            key_group_range=None,
            fmt=FMT,
        )
        reused = list(handle.shared)
        urls.append(next(r.path for r in handle.shared if r.path.endswith(f"-{cid}.sst")))
        completed.append(_completed(cid, handle))
    authority.coordinator.recover(completed=completed)
    return authority, job, urls


def test_failover_restores_the_newest_checkpoint_that_verifies(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> None:
    authority, job, urls = _authority(storage, files)
    authority.failover.on_failure("task failed", 7)
    assert job.restored == [3]  # all intact: the latest
    assert job.statuses[-1] == (p.JobStatus.RUNNING, None)
    storage.fs.rm(fs_path(storage, urls[2]))  # only checkpoint 3 references 3.sst
    authority.failover.on_failure("task failed", 8)
    assert job.restored == [3, 2]
    status, note = job.statuses[-1]
    assert status is p.JobStatus.RUNNING
    assert note is not None and note.startswith(
        "restored checkpoint 2 instead of the latest: checkpoint 3 cannot be restored: "
    )
    assert f"state file {urls[2]} of native snapshot" in note and "is missing" in note
    assert job.attempt == authority.coordinator.attempt == 3


def test_failover_fails_the_job_when_no_checkpoint_verifies(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> None:
    authority, job, urls = _authority(storage, files)
    storage.fs.rm(fs_path(storage, urls[0]))  # 1.sst: every checkpoint references it
    with pytest.raises(JobFailedError) as err:
        authority.failover.on_failure("task failed", 7)
    assert job.restored == []
    message = str(err.value)
    assert message.startswith(f"job {JOB} failed: task failed; no checkpoint can be restored: ")
    for cid in (3, 2, 1):
        assert f"checkpoint {cid} cannot be restored: state file {urls[0]}" in message
    assert job.statuses[-1] == (p.JobStatus.FAILING, "task failed")


def test_newest_restorable_without_checkpoints(storage: FileSystemCheckpointStorage) -> None:
    assert newest_restorable([], storage) == (None, [])


def test_a_from_checkpoint_with_a_missing_file_is_not_restored_again_on_failover(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> None:
    """No checkpoint completed since ``--from-checkpoint``: a failover would restore that one
    again, and its missing file would fail every epoch; the job fails naming it instead."""
    handle, url = snapshot(storage, files)
    path = storage.write_metadata(JOB, 1, checkpoint_metadata(JOB, _completed(1, handle)))
    job = _FakeJob()
    job.options = SimpleNamespace(
        checkpoint=CheckpointConfig(), from_checkpoint=path, allow_non_restored_state=False
    )
    job.graph = SimpleNamespace(
        tasks=lambda: {"pv": 1},
        keyed_vertices=[SimpleNamespace(uid="pv", max_parallelism=128)],
        split_ids=lambda: ["s-0"],
        source=SimpleNamespace(source=SimpleNamespace(split_ids=lambda: ["s-0"])),
    )
    authority = InProcessAuthority(job, FixedDelayRestartStrategy(attempts=5, delay_ms=0), storage)  # type: ignore[arg-type]
    authority.prepare()
    authority.failover.on_failure("task failed", 1)
    assert job.restored == [1]
    storage.fs.rm(fs_path(storage, url))
    with pytest.raises(JobFailedError) as err:
        authority.failover.on_failure("task failed", 2)
    assert str(err.value) == (
        f"job {JOB} failed: task failed; no checkpoint can be restored: checkpoint 1 ({path}) "
        f"cannot be restored: state file {url} of native snapshot {handle.path} is missing "
        f"(expected 100 bytes, {sha(b'x' * 100)})"
    )
    assert job.restored == [1]


# ----------------------------------------------------------------------------- with RocksDB


@dataclass
class _Target:
    """The runtime's snapshot target, reduced to what the rocksdb backend calls."""

    storage: FileSystemCheckpointStorage
    checkpoint_id: int
    key_group_range: KeyGroupRange
    incremental: bool = True

    def write(self, data: bytes, *, fmt: str) -> StateHandleModel:
        handle = self.storage.write_state(JOB, self.checkpoint_id, "pv-0", data)
        return handle.model_copy(update={"format": fmt})

    def write_native(
        self, private: dict[str, str], shared: dict[str, str], reused: list[Any], *, fmt: str
    ) -> StateHandleModel:
        return self.storage.write_native(
            JOB,
            self.checkpoint_id,
            "pv-0",
            private,
            shared,
            reused,
            key_group_range=self.key_group_range,
            fmt=fmt,
        )


def test_rocksdb_incremental_checkpoints_through_filesystem_storage(tmp_path: Path) -> None:
    """The rocksdb backend's native snapshots, retained one at a time: each uploads only its
    new SST file, the ones still referenced survive the discard of the checkpoint that
    uploaded them, and the latest restores."""
    rocksdb = pytest.importorskip("sparkpoint.state.rocksdb")
    descriptors = pytest.importorskip("sparkpoint.state.descriptors")
    count = descriptors.ValueStateDescriptor("count", default=0)
    full = KeyGroupRange(0, 127)
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))
    backend = rocksdb.RocksDBKeyedStateBackend(128, full, db_dir=str(tmp_path / "db"))
    handles = {}
    for cid in (1, 2, 3):
        state = backend.get_state(count)
        for k in range(cid * 100, cid * 100 + 200):
            backend.set_current_key(f"k{k}")
            state.update(k)
        capture = backend.snapshot(cid, native=True)
        try:
            (handles[cid],) = capture.materialize(_Target(storage, cid, full))
        finally:
            capture.release()
        complete(storage, cid, handles[cid])
        if cid > 1:
            storage.discard(JOB, cid - 1)  # retained: 1
        new = [r for r in handles[cid].shared if f"-c{cid}-" in r.path]
        assert len(new) == 1, "each checkpoint uploads only its new SST file"
        assert shared_names(storage) == sorted(
            r.path.rsplit("/", 1)[1] for r in handles[cid].shared
        )
    storage.verify_checkpoint(JOB, 3)
    restored = rocksdb.RocksDBKeyedStateBackend.restore(
        [handles[3]],
        128,
        full,
        db_dir=str(tmp_path / "restored"),
        fetch=storage.read_state,
        fetch_native=storage.fetch_native,
    )
    restored.set_current_key("k350")
    assert restored.get_state(count).value() == 350
    restored.set_current_key("k150")
    assert restored.get_state(count).value() == 150
