"""Fixtures of the checkpointing tests: checkpoint storage over a local and a memory
filesystem, and local files to upload."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage

from .shared_state_support import LocalFiles


@pytest.fixture(params=["local", "memory"])
def storage(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[FileSystemCheckpointStorage]:
    """Filesystem checkpoint storage under ``tmp_path``, or in fsspec's memory filesystem."""
    if request.param == "local":
        yield FileSystemCheckpointStorage(f"file://{tmp_path}/checkpoints")
        return
    root = f"/sparkpoint-shared-{uuid.uuid4().hex}"
    yield FileSystemCheckpointStorage(f"memory://{root}")
    if fsspec.filesystem("memory").exists(root):
        fsspec.filesystem("memory").rm(root, recursive=True)


@pytest.fixture
def files(tmp_path: Path) -> LocalFiles:
    """Local files to upload."""
    (tmp_path / "local").mkdir()
    return LocalFiles(tmp_path / "local")
