"""A working-state file is written whole or not at all, and a full disk's error names it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sparkpoint.checkpointing.file_ops import write_local_atomically


def test_a_file_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "v1"
    write_local_atomically(str(path), b"state")
    write_local_atomically(str(path), b"newer")
    assert path.read_bytes() == b"newer"
    assert sorted(os.listdir(path.parent)) == ["v1"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_full_disk_names_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    """/dev/full answers every write with ENOSPC, as a full disk does: the error says which
    file (the system's names none), and the partial file is gone."""
    path = tmp_path / "v2"
    (tmp_path / "v2.tmp").symlink_to("/dev/full")
    with pytest.raises(OSError, match="No space left on device") as err:
        write_local_atomically(str(path), b"x" * 1_000_000)
    assert err.value.errno == errno.ENOSPC
    assert str(tmp_path / "v2.tmp") in str(err.value)
    assert os.listdir(tmp_path) == []
