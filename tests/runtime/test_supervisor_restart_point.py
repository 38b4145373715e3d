"""Which checkpoint a restarted standalone driver starts from: the newest that verifies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.options import JobOptions, parse_job_options
from sparkpoint.protocol import StateHandleModel
from sparkpoint.supervisor import checkpoint_ids, fresh_start_warning, latest_checkpoint_path

JOB = "job-sup"


def _argv(checkpoint_dir: Path) -> list[str]:
    return ["--job-id", JOB, "--standalone", "--checkpoint-dir", str(checkpoint_dir)]


def _options(checkpoint_dir: Path) -> JobOptions:
    return parse_job_options(_argv(checkpoint_dir), job_options=())[0]


def _complete(storage: FileSystemCheckpointStorage, cid: int, handle: StateHandleModel) -> None:
    ack = {"operator_id": "pv", "subtask": 0, "handles": [handle.model_dump(mode="json")]}
    meta = {"format": "sparkpoint-checkpoint/1", "checkpoint_id": cid, "attempt": 1, "acks": [ack]}
    storage.write_metadata(JOB, cid, meta)


def _native(storage: FileSystemCheckpointStorage, tmp: Path, cid: int) -> StateHandleModel:
    """A native snapshot of checkpoint ``cid`` with one private and one new shared file."""
    local = tmp / f"local-{cid}"
    local.mkdir()
    (local / "CURRENT").write_bytes(b"MANIFEST-1")
    (local / "000007.sst").write_bytes(b"sst" * 100)
    return storage.write_native(
        JOB,
        cid,
        "pv-0",
        {"CURRENT": str(local / "CURRENT")},
        {"000007.sst": str(local / "000007.sst")},
        [],
        key_group_range=None,
        fmt="rocksdb-native-v1",
    )


def _path(url: str) -> str:
    return url.removeprefix("file://")


def test_a_restart_steps_back_past_checkpoints_whose_files_do_not_verify(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))
    first = storage.write_state(JOB, 1, "pv-0", b"state of 1")
    _complete(storage, 1, first)
    second = _native(storage, tmp_path, 2)
    _complete(storage, 2, second)
    third = storage.write_state(JOB, 3, "pv-0", b"state of 3")
    _complete(storage, 3, third)
    [shared] = second.shared
    os.remove(_path(shared.path))  # a lost shared file of incremental state
    with open(_path(third.path or ""), "wb") as fh:
        fh.write(b"altered!!!")  # same size, another checksum
    logged: list[str] = []

    path = latest_checkpoint_path(_options(tmp_path / "chk"), JOB, log=logged.append)

    assert path == storage.checkpoint_path(JOB, 1)
    assert len(logged) == 2
    assert logged[0].startswith(f"sparkpoint run: job {JOB}: skipping checkpoint 3: ")
    assert f"state file {third.path}" in logged[0] and "checksum" in logged[0]
    assert logged[1].startswith(f"sparkpoint run: job {JOB}: skipping checkpoint 2: ")
    assert f"{shared.path} of native snapshot" in logged[1] and "is missing" in logged[1]


def test_the_newest_checkpoint_is_taken_when_it_verifies(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))
    for cid in (1, 2):
        _complete(storage, cid, _native(storage, tmp_path, cid))
    logged: list[str] = []
    path = latest_checkpoint_path(_options(tmp_path / "chk"), JOB, log=logged.append)
    assert (path, logged) == (storage.checkpoint_path(JOB, 2), [])
    assert latest_checkpoint_path(_options(tmp_path / "chk"), JOB, after=2) is None


def test_no_restart_when_this_runs_checkpoints_all_fail_to_verify(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))
    _complete(storage, 1, storage.write_state(JOB, 1, "pv-0", b"kept from before the run"))
    handle = _native(storage, tmp_path, 2)
    _complete(storage, 2, handle)
    os.remove(_path(handle.shared[0].path))
    with pytest.raises(CorruptSnapshotError, match="no checkpoint of this run") as err:
        latest_checkpoint_path(_options(tmp_path / "chk"), JOB, after=1)
    assert handle.shared[0].path in str(err.value)


def test_a_checkpoint_directory_that_cannot_be_listed_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An object store without credentials: the supervisor names the directory and the
    store's error before the driver starts, instead of printing the store library's trace."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = parse_job_options(
        ["--job-id", JOB, "--standalone", "--checkpoint-dir", "s3://no-such-bucket/chk"],
        job_options=(),
    )[0]
    with pytest.raises(ConfigurationError) as err:
        checkpoint_ids(options, JOB)
    assert str(err.value) == (
        "cannot read --checkpoint-dir s3://no-such-bucket/chk: NoCredentialsError: "
        "Unable to locate credentials"
    )


def test_a_run_from_the_beginning_over_completed_checkpoints_is_told_where_to_go_on(
    tmp_path: Path,
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))
    for cid in (1, 2):
        _complete(storage, cid, storage.write_state(JOB, cid, "pv-0", b"state"))
    options = _options(tmp_path / "chk")
    newest = max(checkpoint_ids(options, JOB))
    warning = fresh_start_warning(options, JOB, newest)
    assert warning is not None
    assert "starts from the beginning" in warning
    assert warning.endswith(f"--from-checkpoint {storage.checkpoint_path(JOB, 2)}")
    resumed = parse_job_options(
        [*_argv(tmp_path / "chk"), "--from-checkpoint", storage.checkpoint_path(JOB, 2)],
        job_options=(),
    )[0]
    assert fresh_start_warning(resumed, JOB, newest) is None
    assert fresh_start_warning(options, JOB, 0) is None  # a new job: nothing to repeat
