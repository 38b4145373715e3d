"""Jobmanager checkpoint storage: state inline in the acknowledgements, metadata in memory
or in a directory, and its size limit."""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
from pathlib import Path

import pytest

from sparkpoint.checkpointing.storage import JobManagerCheckpointStorage, StateTooLargeError
from sparkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    CorruptSnapshotError,
)
from sparkpoint.protocol import StateHandleModel
from sparkpoint.state.key_groups import KeyGroupRange

DATA = b"snapshot bytes \x00\x01\x02"
DATA_SHA = "sha256:" + hashlib.sha256(DATA).hexdigest()


def test_jobmanager_state_is_inline() -> None:
    storage = JobManagerCheckpointStorage()
    handle = storage.write_state("job-1", 3, "pv[0]", DATA, key_group_range=KeyGroupRange(5, 9))
    assert handle == StateHandleModel(
        inline=base64.b64encode(DATA).decode(),
        size=len(DATA),
        checksum=DATA_SHA,
        key_group_start=5,
        key_group_end=9,
    )
    assert storage.read_state(handle) == DATA


def test_jobmanager_size_limit() -> None:
    storage = JobManagerCheckpointStorage(max_state_size=1 << 20)
    assert storage.read_state(storage.write_state("j", 3, "pv[0]", bytes(1 << 20))) == bytes(
        1 << 20
    )
    with pytest.raises(StateTooLargeError) as info:
        storage.write_state("j", 3, "pv[0]", bytes(3 << 19))
    assert isinstance(info.value, CheckpointError)
    assert str(info.value) == (
        "state of pv[0] for checkpoint 3 is 1.5 MiB, above the 1.0 MiB limit of jobmanager "
        "checkpoint storage; use --checkpoint-storage filesystem"
    )
    small = JobManagerCheckpointStorage(max_state_size=1000)
    with pytest.raises(StateTooLargeError, match=r"is 2\.0 KiB, above the 1000 bytes limit"):
        small.write_state("j", 1, "op", bytes(2048))


def test_jobmanager_inline_corruption_is_detected() -> None:
    storage = JobManagerCheckpointStorage()
    handle = storage.write_state("job-1", 1, "pv-0", DATA)
    altered = handle.model_copy(update={"inline": base64.b64encode(DATA[::-1]).decode()})
    with pytest.raises(CorruptSnapshotError, match=r"^inline state has checksum sha256:\w+, "):
        storage.read_state(altered)
    cut = handle.model_copy(update={"inline": base64.b64encode(DATA[:3]).decode()})
    with pytest.raises(CorruptSnapshotError) as info:
        storage.read_state(cut)
    assert str(info.value) == (
        f"inline state is 3 bytes, expected {len(DATA)} bytes (truncated or altered)"
    )
    with pytest.raises(CorruptSnapshotError, match="not valid base64"):
        storage.read_state(handle.model_copy(update={"inline": "@@@"}))


def test_jobmanager_metadata_in_memory() -> None:
    storage = JobManagerCheckpointStorage()
    assert storage.write_metadata("job-1", 2, {"a": 1}) is None
    assert storage.write_metadata("job-1", 1, {"b": 2}) is None
    assert storage.write_metadata("job-2", 7, {}) is None
    assert storage.completed_checkpoint_ids("job-1") == [1, 2]
    assert storage.read_checkpoint_metadata("job-1", 2) == {"a": 1}
    assert storage.checkpoint_path("job-1", 2) is None
    assert storage.cleanup_incomplete("job-1") == []
    storage.discard("job-1", 2)
    storage.discard("job-1", 2)
    assert storage.completed_checkpoint_ids("job-1") == [1]
    with pytest.raises(CheckpointNotFoundError, match="checkpoint 2 of job job-1 has no metadata"):
        storage.read_checkpoint_metadata("job-1", 2)
    with pytest.raises(CheckpointNotFoundError, match="keeps metadata in memory only"):
        storage.read_metadata("/some/chk-1")
    with pytest.raises(CorruptSnapshotError, match="cannot read state file"):
        storage.read_state(StateHandleModel(path="/x/chk-1/pv-0", size=1, checksum=DATA_SHA))


def test_jobmanager_metadata_in_a_directory(tmp_path: Path) -> None:
    storage = JobManagerCheckpointStorage(max_state_size=100, metadata_url=str(tmp_path))
    path = storage.write_metadata("job-1", 3, {"a": 1})
    assert path == f"file://{tmp_path}/job-1/chk-3"
    assert json.loads((tmp_path / "job-1" / "chk-3" / "_metadata").read_text()) == {"a": 1}
    assert storage.read_metadata(path) == {"a": 1}
    assert storage.completed_checkpoint_ids("job-1") == [3]
    assert storage.checkpoint_path("job-1", 3) == path
    shipped = pickle.loads(pickle.dumps(storage))
    assert shipped.read_checkpoint_metadata("job-1", 3) == {"a": 1}
    storage.discard("job-1", 3)
    assert storage.completed_checkpoint_ids("job-1") == []


def test_jobmanager_refuses_a_negative_limit() -> None:
    with pytest.raises(ConfigurationError, match=r"max_state_size .* must be >= 0, got -1"):
        JobManagerCheckpointStorage(max_state_size=-1)
