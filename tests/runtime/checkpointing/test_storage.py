"""Checkpoint storage: round trips, verification of handles, path safety, metadata lifecycle."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from sparkpoint.checkpointing.pending import CompletedCheckpoint, checkpoint_metadata
from sparkpoint.checkpointing.storage import (
    CheckpointStorage,
    FileSystemCheckpointStorage,
    JobManagerCheckpointStorage,
    checkpoint_storage_from_options,
)
from sparkpoint.checkpointing.storage_base import encode_metadata
from sparkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    CorruptSnapshotError,
    StorageLocationError,
)
from sparkpoint.protocol import CheckpointKind, SnapshotCompleted, StateHandleModel
from sparkpoint.state.key_groups import KeyGroupRange
from tests.support.acks import bare_ack

DATA = b"snapshot bytes \x00\x01\x02"
DATA_SHA = "sha256:" + hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def local(tmp_path: Path) -> FileSystemCheckpointStorage:
    return FileSystemCheckpointStorage(str(tmp_path / "checkpoints"))


@pytest.fixture
def memory_url() -> Iterator[str]:
    root = f"/sparkpoint-test-{uuid.uuid4().hex}"
    yield f"memory://{root}"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture(params=["local", "memory"])
def storage(
    request: pytest.FixtureRequest, tmp_path: Path, memory_url: str
) -> FileSystemCheckpointStorage:
    if request.param == "local":
        return FileSystemCheckpointStorage(f"file://{tmp_path}/checkpoints")
    return FileSystemCheckpointStorage(memory_url)


def _read_bytes(url: str) -> bytes:
    with fsspec.open(url, "rb") as f:
        return f.read()


# ----------------------------------------------------------------------------- state files


def test_state_round_trip(storage: FileSystemCheckpointStorage) -> None:
    handle = storage.write_state("job-1", 3, "pv[0]", DATA, key_group_range=KeyGroupRange(0, 63))
    assert handle == StateHandleModel(
        path=f"{storage.base_url}/job-1/chk-3/pv[0]",
        size=len(DATA),
        checksum=DATA_SHA,
        key_group_start=0,
        key_group_end=63,
    )
    assert storage.read_state(handle) == DATA
    assert _read_bytes(handle.path or "") == DATA
    assert storage.checkpoint_path("job-1", 3) == f"{storage.base_url}/job-1/chk-3"
    assert storage.shared_path("job-1") == f"{storage.base_url}/job-1/shared"


def test_handle_survives_the_protocol_json(storage: FileSystemCheckpointStorage) -> None:
    handle = storage.write_state("job-1", 1, "sum-1", b"")
    again = StateHandleModel.model_validate_json(handle.model_dump_json())
    assert again.key_group_start is None and again.size == 0
    assert storage.read_state(again) == b""


def test_base_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = f"file://{tmp_path}/cp"
    assert FileSystemCheckpointStorage(str(tmp_path / "cp")).base_url == expected
    assert FileSystemCheckpointStorage(f"file://{tmp_path}/cp/").base_url == expected
    monkeypatch.chdir(tmp_path)
    relative = FileSystemCheckpointStorage("cp")  # made absolute now, not on the executor
    monkeypatch.chdir("/")
    assert relative.base_url == expected
    assert FileSystemCheckpointStorage("memory://x/y").base_url == "memory:///x/y"


def test_flipped_byte_is_detected(local: FileSystemCheckpointStorage) -> None:
    handle = local.write_state("job-1", 2, "pv-0", DATA)
    path = Path((handle.path or "").removeprefix("file://"))
    raw = bytearray(path.read_bytes())
    raw[5] ^= 0x01
    path.write_bytes(bytes(raw))
    actual = "sha256:" + hashlib.sha256(bytes(raw)).hexdigest()
    with pytest.raises(CorruptSnapshotError) as info:
        local.read_state(handle)
    assert str(info.value) == (
        f"state file {handle.path} has checksum {actual}, expected {DATA_SHA} (altered)"
    )
    assert str(path) in str(info.value)


def test_truncated_file_is_detected(local: FileSystemCheckpointStorage) -> None:
    handle = local.write_state("job-1", 2, "pv-0", DATA)
    path = Path((handle.path or "").removeprefix("file://"))
    path.write_bytes(DATA[:7])
    with pytest.raises(CorruptSnapshotError) as info:
        local.read_state(handle)
    assert str(info.value) == (
        f"state file {handle.path} is 7 bytes, expected {len(DATA)} bytes (truncated or altered)"
    )


def test_missing_file_is_detected(storage: FileSystemCheckpointStorage) -> None:
    handle = storage.write_state("job-1", 2, "pv-0", DATA)
    storage.discard("job-1", 2)
    with pytest.raises(CorruptSnapshotError) as info:
        storage.read_state(handle)
    assert str(info.value) == (
        f"state file {handle.path} is missing (expected {len(DATA)} bytes, {DATA_SHA})"
    )


def test_altered_memory_file_is_detected(memory_url: str) -> None:
    storage = FileSystemCheckpointStorage(memory_url)
    handle = storage.write_state("job-1", 1, "pv-0", DATA)
    fsspec.filesystem("memory").pipe_file(handle.path, DATA.replace(b"s", b"S", 1))
    with pytest.raises(CorruptSnapshotError, match="has checksum sha256:"):
        storage.read_state(handle)


def test_handle_without_path_or_inline_is_refused(local: FileSystemCheckpointStorage) -> None:
    with pytest.raises(CorruptSnapshotError, match="has neither a path nor inline bytes"):
        local.read_state(StateHandleModel(size=1, checksum=DATA_SHA))


def test_filesystem_storage_reads_inline_handles(local: FileSystemCheckpointStorage) -> None:
    handle = JobManagerCheckpointStorage().write_state("job-1", 1, "pv-0", DATA)
    assert local.read_state(handle) == DATA


def test_storage_is_picklable_and_works_after(storage: FileSystemCheckpointStorage) -> None:
    handle = storage.write_state("job-1", 1, "pv-0", DATA)
    assert storage._fs is not None
    shipped = pickle.loads(pickle.dumps(storage))
    assert shipped._fs is None  # no filesystem object travels to the executor
    assert shipped.read_state(handle) == DATA
    assert (
        shipped.write_state("job-1", 1, "pv-1", DATA).path == f"{storage.base_url}/job-1/chk-1/pv-1"
    )


# ----------------------------------------------------------------------------- path safety


@pytest.mark.parametrize(
    ("job_id", "name", "message"),
    [
        ("..", "pv-0", "job id '..' is a relative path"),
        ("../other", "pv-0", "job id '../other' contains a path separator"),
        ("/etc", "pv-0", "job id '/etc' contains a path separator"),
        ("a\\b", "pv-0", "job id 'a\\\\b' contains a path separator"),
        ("", "pv-0", "job id must be a non-empty str, got ''"),
        ("job[1]", "pv-0", "job id 'job[1]' contains a glob character"),
        ("job-1", "..", "state name '..' is a relative path"),
        ("job-1", "../../etc/passwd", "state name '../../etc/passwd' contains a path separator"),
        ("job-1", "/abs", "state name '/abs' contains a path separator"),
        ("job-1", "", "state name must be a non-empty str, got ''"),
        ("job-1", "_metadata", "state name '_metadata' starts with '_', reserved"),
        ("job-1", " pv", "state name ' pv' starts or ends with whitespace"),
        ("job-1", "a\x00b", "state name 'a\\x00b' contains a NUL character"),
    ],
)
def test_names_that_escape_the_base_are_refused(
    local: FileSystemCheckpointStorage, job_id: str, name: str, message: str
) -> None:
    for storage in (local, JobManagerCheckpointStorage()):
        with pytest.raises(StorageLocationError) as info:
            storage.write_state(job_id, 1, name, DATA)
        assert message in str(info.value)
    assert not Path(local.base_url.removeprefix("file://")).exists()


@pytest.mark.parametrize("checkpoint_id", [0, -1, True, "3", 1.0])
def test_invalid_checkpoint_ids_are_refused(
    local: FileSystemCheckpointStorage, checkpoint_id: object
) -> None:
    with pytest.raises(StorageLocationError, match="checkpoint id must be an int >= 1"):
        local.write_state("job-1", checkpoint_id, "pv-0", DATA)  # type: ignore[arg-type]


def test_handle_paths_outside_the_base_are_refused(
    local: FileSystemCheckpointStorage, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(DATA)
    base = local.base_url
    for path in (
        f"file://{secret}",
        str(secret),
        f"{base}/job-1/../../secret",
        f"{base}-other/x",
        base,
    ):
        handle = StateHandleModel(path=path, size=len(DATA), checksum=DATA_SHA)
        with pytest.raises(StorageLocationError) as info:
            local.read_state(handle)
        assert str(info.value) == (
            f"state file {path} lies outside the checkpoint directory {base}"
        )
    other_fs = StateHandleModel(path="memory:///x/y", size=1, checksum=DATA_SHA)
    with pytest.raises(StorageLocationError, match="is not on this checkpoint storage"):
        local.read_state(other_fs)


# ----------------------------------------------------------------------------- metadata


def test_metadata_round_trip(storage: FileSystemCheckpointStorage) -> None:
    handle = storage.write_state("job-1", 4, "pv-0", DATA)
    metadata = {"checkpoint_id": 4, "handles": [handle.model_dump(mode="json")], "note": "é"}
    path = storage.write_metadata("job-1", 4, metadata)
    assert path == f"{storage.base_url}/job-1/chk-4"
    assert storage.read_metadata(path) == metadata
    assert storage.read_metadata(f"{path}/_metadata") == metadata
    assert storage.read_metadata(f"{path}/") == metadata
    assert storage.read_checkpoint_metadata("job-1", 4) == metadata
    fs, root = fsspec.core.url_to_fs(path)
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(root, detail=False))
    assert names == ["_metadata", "pv-0"]  # no temporary file left
    restored = StateHandleModel.model_validate(storage.read_metadata(path)["handles"][0])
    assert storage.read_state(restored) == DATA


def test_metadata_read_from_a_plain_local_path(local: FileSystemCheckpointStorage) -> None:
    path = local.write_metadata("job-1", 1, {"a": 1})
    assert local.read_metadata(path.removeprefix("file://")) == {"a": 1}
    elsewhere = FileSystemCheckpointStorage("memory://unrelated")
    assert elsewhere.read_metadata(path) == {"a": 1}  # a savepoint path from anywhere


def test_metadata_rewrite_replaces_it_whole(local: FileSystemCheckpointStorage) -> None:
    local.write_metadata("job-1", 1, {"a": 1, "b": [1, 2, 3]})
    path = local.write_metadata("job-1", 1, {"a": 2})
    assert local.read_metadata(path) == {"a": 2}


def test_metadata_write_is_atomic(
    local: FileSystemCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    local.write_state("job-1", 5, "pv-0", DATA)

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk went away during rename")

    monkeypatch.setattr(os, "replace", crash)  # a local directory renames through os
    with pytest.raises(OSError, match="disk went away"):
        local.write_metadata("job-1", 5, {"checkpoint_id": 5})
    monkeypatch.undo()
    chk = Path(local.checkpoint_path("job-1", 5).removeprefix("file://"))
    assert sorted(p.name for p in chk.iterdir()) == ["pv-0"]  # neither _metadata nor temp
    assert local.completed_checkpoint_ids("job-1") == []
    assert local.cleanup_incomplete("job-1") == [5]
    assert not chk.exists()


def test_metadata_must_be_json(local: FileSystemCheckpointStorage) -> None:
    with pytest.raises(CheckpointError) as info:
        local.write_metadata("job-1", 2, {"when": object()})
    assert str(info.value).startswith("metadata of checkpoint 2 of job job-1 is not JSON: ")
    with pytest.raises(CheckpointError, match="is not JSON: Out of range float"):
        local.write_metadata("job-1", 2, {"x": float("nan")})
    assert local.completed_checkpoint_ids("job-1") == []


@pytest.mark.parametrize(
    "metadata",
    [
        {"checkpoint_id": 3, "acks": [{"path": "file:///c/chk-3/s", "size": 4096, "x": 0.5}]},
        {"pins": {3: "savepoint"}, "ratio": 1e-05},  # an int key, written as a str
        {"barrier_timestamp": None, "path": "s3://b/null/chk-1"},  # null: the stdlib writes it
        {"offset": 2**70},  # beyond 64 bits: the stdlib writes it
    ],
)
def test_metadata_is_read_back_as_the_standard_library_writes_it(
    local: FileSystemCheckpointStorage, metadata: dict
) -> None:
    local.write_metadata("job-1", 3, metadata)
    path = local.checkpoint_path("job-1", 3)
    assert local.read_metadata(path) == json.loads(json.dumps(metadata))


def test_missing_metadata(local: FileSystemCheckpointStorage, tmp_path: Path) -> None:
    local.write_state("job-1", 1, "pv-0", DATA)
    path = local.checkpoint_path("job-1", 1)
    with pytest.raises(CheckpointNotFoundError) as info:
        local.read_metadata(path)
    assert str(info.value) == f"no checkpoint at {path}: {path}/_metadata does not exist"
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        local.read_metadata(str(tmp_path / "nowhere"))
    with pytest.raises(CheckpointNotFoundError):
        local.read_checkpoint_metadata("job-1", 9)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "is not valid JSON: "),
        (b"\xff\xfe", "is not valid JSON: "),
        (b"[1, 2]", "holds a JSON list, expected an object"),
    ],
)
def test_corrupt_metadata(local: FileSystemCheckpointStorage, content: bytes, message: str) -> None:
    path = local.write_metadata("job-1", 1, {"a": 1})
    file = Path(path.removeprefix("file://")) / "_metadata"
    file.write_bytes(content)
    with pytest.raises(CorruptSnapshotError) as info:
        local.read_metadata(path)
    assert str(info.value).startswith(f"{path}/_metadata {message}")


# ----------------------------------------------------------------------------- lifecycle


def test_completed_ids_and_cleanup_of_incomplete(storage: FileSystemCheckpointStorage) -> None:
    for checkpoint_id in (1, 2, 3, 4, 10):
        storage.write_state("job-1", checkpoint_id, "pv-0", DATA)
    for checkpoint_id in (2, 10):
        storage.write_metadata("job-1", checkpoint_id, {"checkpoint_id": checkpoint_id})
    storage.write_state("job-2", 1, "pv-0", DATA)  # another job: untouched
    fs, job_dir = fsspec.core.url_to_fs(f"{storage.base_url}/job-1")
    fs.makedirs(f"{job_dir}/shared", exist_ok=True)
    fs.pipe_file(f"{job_dir}/shared/sst-1", b"x")
    fs.makedirs(f"{job_dir}/chk-x", exist_ok=True)
    fs.pipe_file(f"{job_dir}/chk-x/f", b"x")

    assert storage.completed_checkpoint_ids("job-1") == [2, 10]  # numeric order
    assert storage.cleanup_incomplete("job-1", keep=[4]) == [1, 3]
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(job_dir, detail=False))
    assert names == ["chk-10", "chk-2", "chk-4", "chk-x", "shared"]
    assert storage.cleanup_incomplete("job-1") == [4]
    assert storage.cleanup_incomplete("job-1") == []
    assert storage.completed_checkpoint_ids("job-1") == [2, 10]
    assert storage.completed_checkpoint_ids("job-2") == []
    assert storage.cleanup_incomplete("job-2") == [1]
    assert storage.completed_checkpoint_ids("no-such-job") == []
    assert storage.cleanup_incomplete("no-such-job") == []


def test_discard_while_a_task_still_writes_into_the_checkpoint_never_raises(
    local: FileSystemCheckpointStorage, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint that failed is discarded while a task of the failed epoch still uploads
    its part (a writer thread here): the tree is deleted again when a file came meanwhile,
    and what cannot be deleted is left and logged, never raised (a raise failed the job)."""
    local.write_state("job-1", 7, "pv-0", DATA)
    directory = Path(local.checkpoint_path("job-1", 7).removeprefix("file://"))
    stop = threading.Event()

    def upload() -> None:
        n = 0
        while not stop.is_set():
            # A discard can delete the directory at any point, even inside mkdir (it then
            # raises FileExistsError: the directory was there, and was gone when checked).
            with contextlib.suppress(FileNotFoundError, FileExistsError):
                directory.mkdir(parents=True, exist_ok=True)
                (directory / f"pv-1-{n}").write_bytes(DATA)
            n += 1

    writer = threading.Thread(target=upload)
    writer.start()
    try:
        for _ in range(50):
            local.discard("job-1", 7)
    finally:
        stop.set()
        writer.join()
    local.discard("job-1", 7)  # the writer is done: now it goes
    assert not directory.exists()
    left = [r.getMessage() for r in caplog.records if "left at" in r.getMessage()]
    assert all(f"checkpoint 7 left at {directory}" in m for m in left)


def test_discard_is_idempotent(storage: FileSystemCheckpointStorage) -> None:
    storage.write_state("job-1", 1, "pv-0", DATA)
    path = storage.write_metadata("job-1", 1, {})
    storage.write_metadata("job-1", 2, {})
    storage.discard("job-1", 1)
    storage.discard("job-1", 1)
    storage.discard("job-1", 99)
    assert storage.completed_checkpoint_ids("job-1") == [2]
    with pytest.raises(CheckpointNotFoundError):
        storage.read_metadata(path)


# ----------------------------------------------------------------------------- options


def test_storage_from_options(tmp_path: Path) -> None:
    fs_storage = checkpoint_storage_from_options("filesystem", str(tmp_path), 10)
    assert isinstance(fs_storage, FileSystemCheckpointStorage)
    assert fs_storage.base_url == f"file://{tmp_path}"
    jm = checkpoint_storage_from_options("jobmanager", None, 4096)
    assert isinstance(jm, JobManagerCheckpointStorage)
    assert (jm.max_state_size, jm.metadata_url) == (4096, None)
    jm_dir = checkpoint_storage_from_options("jobmanager", str(tmp_path), 10)
    assert isinstance(jm_dir, CheckpointStorage)
    assert jm_dir.checkpoint_path("j", 1) == f"file://{tmp_path}/j/chk-1"


@pytest.mark.parametrize(
    ("kind", "url", "message"),
    [
        (
            "filesystem",
            None,
            "checkpoint storage 'filesystem' needs a checkpoint directory (--checkpoint-dir)",
        ),
        ("filesystem", "", "checkpoint storage 'filesystem' needs a checkpoint directory"),
        ("rocksdb", "/tmp/x", "unknown checkpoint storage 'rocksdb': expected 'filesystem' or"),
    ],
)
def test_invalid_storage_options(kind: str, url: str | None, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        checkpoint_storage_from_options(kind, url, 10)
    assert message in str(info.value)


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(StorageLocationError, match="cannot use checkpoint directory nope://x"):
        FileSystemCheckpointStorage("nope://x")


def test_a_checkpoints_metadata_holds_no_null_and_reads_back_its_acks(
    local: FileSystemCheckpointStorage,
) -> None:
    """The acknowledgements' None fields stay out of ``_metadata`` (so that it is written by
    orjson, not by the standard library after it), and reading it back restores them."""
    handles = [
        StateHandleModel(path="file:///c/chk-5/pv-0", size=4096, checksum="sha256:00"),
        StateHandleModel(inline="eA==", size=1, checksum="sha256:01", key_group_start=0),
    ]
    acks = {
        ("pv", i): bare_ack(
            5,
            subtask=i,
            epoch=3,
            ack_timestamp=1_764_000_000_000,
            start_delay_ms=1.5,
            sync_duration_ms=0.25,
            state_size=4097,
            handles=handles,
            barrier_timestamp=None if i else 1_764_000_000_000,
        )
        for i in range(2)
    }
    cp = CompletedCheckpoint(5, CheckpointKind.CHECKPOINT, 1, 10, 20, 10.0, False, acks)
    metadata = checkpoint_metadata("job-1", cp)
    raw = encode_metadata(metadata, "job-1", 5)
    assert b"null" not in raw
    read = local.read_metadata(local.write_metadata("job-1", 5, metadata))
    assert [SnapshotCompleted.model_validate(a) for a in read["acks"]] == list(acks.values())
