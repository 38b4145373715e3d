"""Checkpoint storage checks, before the first epoch, that the job can write its state."""

from __future__ import annotations

import contextlib
import logging
import subprocess
from pathlib import Path

import pytest

from sparkpoint.checkpointing.storage import (
    FileSystemCheckpointStorage,
    JobManagerCheckpointStorage,
)
from sparkpoint.errors import ConfigurationError


def _blocked(tmp_path: Path) -> Path:
    """A directory that cannot be created, even by root: its parent is a regular file."""
    (tmp_path / "file").write_text("not a directory")
    return tmp_path / "file" / "sub"


def test_a_writable_storage_gets_the_job_directory_and_no_probe_left(tmp_path: Path) -> None:
    storage = FileSystemCheckpointStorage(f"file://{tmp_path / 'chk'}")
    storage.check_writable("job-1", local_dir=str(tmp_path / "local"))
    assert list((tmp_path / "chk" / "job-1").iterdir()) == []
    assert list((tmp_path / "local" / "job-1").iterdir()) == []


def test_an_unwritable_checkpoint_dir_is_a_one_line_configuration_error(tmp_path: Path) -> None:
    blocked = _blocked(tmp_path)
    storage = FileSystemCheckpointStorage(f"file://{blocked}")
    with pytest.raises(ConfigurationError) as err:
        storage.check_writable("job-1", local_dir=str(tmp_path / "local"))
    message = str(err.value)
    assert message.startswith(f"cannot write to --checkpoint-dir file://{blocked}: [Errno 20]")
    assert f"Not a directory: '{blocked}'" in message and "\n" not in message
    assert isinstance(err.value.__cause__, NotADirectoryError)


def test_an_unwritable_local_dir_is_a_configuration_error(tmp_path: Path) -> None:
    blocked = _blocked(tmp_path)
    with pytest.raises(ConfigurationError, match=rf"^cannot write to --local-dir {blocked}: "):
        JobManagerCheckpointStorage().check_writable("job-1", local_dir=str(blocked))


def test_storage_in_memory_has_nothing_to_check() -> None:
    JobManagerCheckpointStorage().check_writable("job-1")


def test_a_directory_that_cannot_exist_has_no_checkpoints(tmp_path: Path) -> None:
    """``sparkpoint run`` lists checkpoints before the driver checks the directory."""
    storage = FileSystemCheckpointStorage(f"file://{_blocked(tmp_path)}")
    assert storage.completed_checkpoint_ids("job-1") == []
    assert storage.cleanup_incomplete("job-1") == []


def test_inline_storage_checks_the_directory_its_metadata_goes_to(tmp_path: Path) -> None:
    """``--checkpoint-storage jobmanager --checkpoint-dir DIR``: state inline, ``_metadata``
    in DIR, so DIR must be writable too."""
    blocked = _blocked(tmp_path)
    storage = JobManagerCheckpointStorage(metadata_url=f"file://{blocked}")
    with pytest.raises(ConfigurationError, match=r"^cannot write to --checkpoint-dir file://"):
        storage.check_writable("job-1")


def test_a_full_checkpoint_dir_is_not_a_wrong_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver that restarts while the disk is full starts; its checkpoints fail (and are
    retried under the failure policy) until there is room, as a running job's would."""
    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "sparkpoint-full", str(full)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(reason=f"mounting a tmpfs needs root: {mounted.stderr.decode().strip()}")
    try:
        storage = FileSystemCheckpointStorage(f"file://{full}")
        (full / "job-1").mkdir()
        # Fill it to the last block.
        with contextlib.suppress(OSError), open(full / "filler", "wb") as out:
            while True:
                out.write(b"x" * 4096)
                out.flush()
        with caplog.at_level(logging.WARNING):
            storage.check_writable("job-1", local_dir=str(tmp_path / "local"))
        assert f"--checkpoint-dir file://{full} has no room now ([Errno 28]" in caplog.text
        assert [p.name for p in (full / "job-1").iterdir()] == []  # no probe left
        blocked = _blocked(tmp_path)  # a wrong path is still refused
        with pytest.raises(ConfigurationError, match="cannot write to --checkpoint-dir"):
            FileSystemCheckpointStorage(f"file://{blocked}").check_writable("job-1")
    finally:
        subprocess.run(["umount", "-l", str(full)], capture_output=True, check=False)
