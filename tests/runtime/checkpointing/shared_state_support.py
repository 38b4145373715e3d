"""Helpers of the tests of native snapshots and shared files (``test_shared_state*.py``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.protocol import StateHandleModel

JOB = "job-a"
FMT = "rocksdb-native-v1"


class LocalFiles:
    """Local files to upload, each with distinct content."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0

    def make(self, content: bytes | None = None) -> str:
        self.count += 1
        path = self.root / f"local-{self.count}"
        path.write_bytes(content if content is not None else f"file {self.count}".encode() * 7)
        return str(path)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fs_path(storage: FileSystemCheckpointStorage, url: str | None) -> str:
    assert url is not None
    return storage._inside_base(url)


def shared_names(storage: FileSystemCheckpointStorage) -> list[str]:
    fs, directory = storage.fs, f"{storage._job_dir(JOB)}/shared"
    if not fs.exists(directory):
        return []
    return sorted(os.path.basename(f) for f in fs.ls(directory, detail=False))


def complete(storage: FileSystemCheckpointStorage, cid: int, *handles: StateHandleModel) -> None:
    """Write ``_metadata`` of checkpoint ``cid`` with ``handles`` (the layout restores read)."""
    acks = [
        {"operator_id": "pv", "subtask": i, "handles": [h.model_dump(mode="json")]}
        for i, h in enumerate(handles)
    ]
    storage.write_metadata(JOB, cid, {"format": "sparkpoint-checkpoint/1", "acks": acks})


def snapshot(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> tuple[StateHandleModel, str]:
    handle = storage.write_native(
        JOB,
        1,
        "pv-0",
        {"CURRENT": files.make(b"cur")},
        {"1.sst": files.make(b"x" * 100)},
        [],
        key_group_range=None,
        fmt=FMT,
    )
    return handle, handle.shared[0].path
