"""Checkpoint storage checks, before the first epoch, that the job can write its state."""

from __future__ import annotations

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
