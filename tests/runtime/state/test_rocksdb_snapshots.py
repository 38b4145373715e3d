"""The rocksdb backend's snapshots (native, incremental; canonical ones' refusals) and restores
with rescaling; the canonical round trips every backend makes are in
test_backend_contract_snapshots.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.state.key_groups import KeyGroupRange, key_group_for, key_group_range
from sparkpoint.state.rocksdb import RocksDBKeyedStateBackend
from sparkpoint.state.rocksdb_snapshot import shared_file_name
from sparkpoint.state.rocksdb_store import NATIVE_FORMAT

from .conftest import COUNT, FULL, KEYS, LAST_SEEN, contents, contents_of_subtasks, fill

# ----------------------------------------------------------------------------- fake storage


def _sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return "sha256:" + hashlib.sha256(fh.read()).hexdigest()


@dataclass
class FakeHandle:
    """What a storage's handle of one subtask's snapshot carries."""

    format: str
    path: str
    key_group_start: int
    key_group_end: int
    private: dict[str, str] = field(default_factory=dict)  # name -> stored path
    shared: list[dict[str, Any]] = field(default_factory=list)  # {name, path, size, checksum}


class FakeStorage:
    """Copies snapshot files into a directory; records what each target received."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.verify = True
        self.received: list[dict[str, list[str]]] = []  # per write_native: names by kind
        self.uploaded_bytes: list[int] = []

    def target(
        self, checkpoint_id: int, kg_range: KeyGroupRange, incremental: bool = True
    ) -> FakeTarget:
        return FakeTarget(self, checkpoint_id, kg_range, incremental)

    def read_state(self, handle: FakeHandle) -> bytes:
        with open(handle.path, "rb") as fh:
            return fh.read()

    def fetch_native(self, handle: FakeHandle, dest_dir: str) -> None:
        files = dict(handle.private)
        for ref in handle.shared:
            if self.verify and _sha256(ref["path"]) != ref["checksum"]:
                raise CorruptSnapshotError(f"{ref['path']}: checksum mismatch")
            files[ref["name"]] = ref["path"]
        for name, path in files.items():
            shutil.copyfile(path, os.path.join(dest_dir, name))


class FakeTarget:
    def __init__(
        self, storage: FakeStorage, checkpoint_id: int, kg_range: KeyGroupRange, incremental: bool
    ) -> None:
        self.storage = storage
        self.checkpoint_id = checkpoint_id
        self.key_group_range = kg_range
        self.incremental = incremental
        self.dir = storage.root / f"chk-{checkpoint_id}-{kg_range.start}-{kg_range.end}"

    def write(self, data: bytes, *, fmt: str) -> Any:
        self.dir.mkdir(parents=True)
        path = self.dir / "state"
        path.write_bytes(data)
        self.storage.uploaded_bytes.append(len(data))
        return FakeHandle(fmt, str(path), self.key_group_range.start, self.key_group_range.end)

    def write_native(
        self, private: dict[str, str], shared: dict[str, str], reused: list[Any], *, fmt: str
    ) -> Any:
        self.dir.mkdir(parents=True)
        (self.storage.root / "shared").mkdir(exist_ok=True)
        stored = {}
        for name, path in private.items():
            stored[name] = str(self.dir / name)
            shutil.copyfile(path, stored[name])
        refs = []
        for name, path in shared.items():
            target = str(self.storage.root / "shared" / f"{uuid.uuid4().hex}-{name}")
            shutil.copyfile(path, target)
            refs.append(
                {
                    "name": name,
                    "path": target,
                    "size": os.path.getsize(target),
                    "checksum": _sha256(target),
                }
            )
        self.storage.received.append(
            {
                "private": sorted(private),
                "shared": sorted(shared),
                "reused": sorted(r["name"] for r in reused),
            }
        )
        self.storage.uploaded_bytes.append(
            sum(os.path.getsize(p) for p in [*private.values(), *shared.values()])
        )
        kg = self.key_group_range
        return FakeHandle(fmt, str(self.dir), kg.start, kg.end, stored, refs + list(reused))


# ----------------------------------------------------------------------------- helpers


def _backend(tmp_path: Path, kg_range: KeyGroupRange = FULL, **options: Any) -> Any:
    return RocksDBKeyedStateBackend(
        128, kg_range, db_dir=str(tmp_path / f"db-{uuid.uuid4().hex[:8]}"), **options
    )


def _snapshot(
    backend: RocksDBKeyedStateBackend,
    storage: FakeStorage,
    checkpoint_id: int,
    *,
    native: bool,
    incremental: bool = True,
) -> FakeHandle:
    capture = backend.snapshot(checkpoint_id, native=native)
    assert capture.state_size > 0
    try:
        target = storage.target(checkpoint_id, backend.key_group_range, incremental)
        (handle,) = capture.materialize(target)
    finally:
        capture.release()
    assert not os.path.exists(os.path.dirname(capture.path))
    return cast(FakeHandle, handle)


def _restore(
    storage: FakeStorage,
    handles: list[FakeHandle],
    kg_range: KeyGroupRange,
    tmp_path: Path,
    max_parallelism: int = 128,
    **kwargs: Any,
) -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend.restore(
        handles,
        max_parallelism,
        kg_range,
        db_dir=str(tmp_path / f"restored-{uuid.uuid4().hex[:8]}"),
        fetch=storage.read_state,
        fetch_native=storage.fetch_native,
        **kwargs,
    )


# ----------------------------------------------------------------------------- round trips


def test_native_snapshot_then_restore_gives_identical_state(tmp_path: Path) -> None:
    storage = FakeStorage(tmp_path / "storage")
    backend = _backend(tmp_path)
    fill(backend, KEYS)
    backend.channel_watermarks = {0: 10, 1: 12}
    capture = backend.snapshot(1, native=True)
    backend.set_current_key("user-4")
    backend.get_state(COUNT).update(999)  # after the synchronous part: not in the snapshot
    (handle,) = capture.materialize(storage.target(1, FULL))
    capture.release()
    assert handle.format == NATIVE_FORMAT
    restored = _restore(storage, [handle], FULL, tmp_path)
    expected = contents(backend)
    expected["count"]["user-4"] = 5
    assert contents(restored) == expected
    assert restored.state_infos == backend.state_infos
    assert restored.channel_watermarks == {0: 10, 1: 12}
    assert restored.num_keys() == len(KEYS)
    restored.set_current_key("user-3")
    assert restored.get_state(LAST_SEEN).items() == [(("page", 3), 3.0)]
    backend.close()
    restored.close()


def test_native_restore_with_parallelism_2_then_3_then_1(tmp_path: Path) -> None:
    storage = FakeStorage(tmp_path / "storage")
    subtasks = [_backend(tmp_path, key_group_range(i, 2, 128)) for i in range(2)]
    for subtask in subtasks:
        fill(subtask, [k for k in KEYS if key_group_for(k) in subtask.key_group_range])
    before = contents_of_subtasks(subtasks)
    assert set(before) == {"count", "events", "last-seen"}
    for checkpoint_id, parallelism in ((1, 3), (2, 1)):
        handles = [_snapshot(s, storage, checkpoint_id, native=True) for s in subtasks]
        for subtask in subtasks:
            subtask.close()
        subtasks = [
            _restore(storage, handles, key_group_range(i, parallelism, 128), tmp_path)
            for i in range(parallelism)
        ]
        assert contents_of_subtasks(subtasks) == before  # every key exactly once
    assert subtasks[0].num_keys() == len(KEYS)
    subtasks[0].close()


def test_native_restore_of_the_same_range_uses_the_files(tmp_path: Path) -> None:
    storage = FakeStorage(tmp_path / "storage")
    backend = _backend(tmp_path)
    fill(backend, KEYS)
    handle = _snapshot(backend, storage, 1, native=True)
    restored = _restore(storage, [handle], FULL, tmp_path)
    ssts = {n for n in os.listdir(restored.db_dir) if n.endswith(".sst")}
    assert ssts and ssts <= {ref["name"] for ref in handle.shared}  # opened, not copied
    low = _restore(storage, [handle], KeyGroupRange(0, 50), tmp_path)  # another range: copied
    assert contents(low)["count"] == {
        k: v for k, v in contents(backend)["count"].items() if key_group_for(k) <= 50
    }
    for b in (backend, restored, low):
        b.close()


# ----------------------------------------------------------------------------- incremental


def test_incremental_native_snapshots_reuse_uploaded_files(tmp_path: Path) -> None:
    storage = FakeStorage(tmp_path / "storage")
    backend = _backend(tmp_path)
    backend.get_state(COUNT)
    backend.table("count").put_many(list(range(20_000)), list(range(20_000)))
    first = _snapshot(backend, storage, 1, native=True)
    sst_1 = storage.received[0]["shared"]
    assert sst_1 and storage.received[0]["reused"] == []
    assert "CURRENT" in storage.received[0]["private"]
    assert not any(n.endswith(".sst") for n in storage.received[0]["private"])
    backend.table("count").put_many(list(range(200)), [-1] * 200)  # 1% of the keys
    second = _snapshot(backend, storage, 2, native=True)
    received = storage.received[1]
    assert received["reused"] == sst_1  # uploaded once, referenced since
    assert len(received["shared"]) == 1 and received["shared"][0] not in sst_1
    assert storage.uploaded_bytes[1] < storage.uploaded_bytes[0] / 5
    restored = _restore(storage, [second], FULL, tmp_path)
    assert contents(restored)["count"] == {i: (-1 if i < 200 else i) for i in range(20_000)}
    # A savepoint (not incremental) uploads everything privately and keeps the record.
    _snapshot(backend, storage, 3, native=True, incremental=False)
    assert storage.received[2]["shared"] == storage.received[2]["reused"] == []
    _snapshot(backend, storage, 4, native=True)
    assert storage.received[3]["reused"] == sorted(sst_1 + received["shared"])
    assert first.shared and 20_000 <= backend.num_keys() <= 20_300  # estimated: overwrites
    backend.close()
    restored.close()


def test_upload_record_is_reset_by_a_restore_unless_claimed(tmp_path: Path) -> None:
    storage = FakeStorage(tmp_path / "storage")
    backend = _backend(tmp_path)
    fill(backend, KEYS)
    handle = _snapshot(backend, storage, 1, native=True)
    uploaded = storage.received[0]["shared"]
    for claim, expected in ((False, []), (True, uploaded)):
        restored = _restore(storage, [handle], FULL, tmp_path, claim=claim)
        _snapshot(restored, storage, 2 + claim, native=True)
        assert storage.received[-1]["reused"] == expected
        restored.close()
    canonical_handle = _snapshot(backend, storage, 5, native=False)
    restored = _restore(storage, [canonical_handle], FULL, tmp_path, claim=True)
    _snapshot(restored, storage, 6, native=True)
    assert storage.received[-1]["reused"] == []
    backend.close()
    restored.close()


# ----------------------------------------------------------------------------- bad input


def test_damaged_native_snapshot_is_refused(tmp_path: Path) -> None:
    storage = FakeStorage(tmp_path / "storage")
    backend = _backend(tmp_path)
    fill(backend, KEYS)
    handle = _snapshot(backend, storage, 1, native=True)
    sst = handle.shared[0]["path"]
    data = bytearray(Path(sst).read_bytes())
    data[100:110] = b"\x00" * 10
    Path(sst).write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError, match="checksum mismatch"):
        _restore(storage, [handle], KeyGroupRange(0, 50), tmp_path)
    storage.verify = False  # a storage that does not check: RocksDB's own checksums do
    with pytest.raises(CorruptSnapshotError) as info:
        _restore(storage, [handle], KeyGroupRange(0, 50), tmp_path)
    assert "state handle 0" in str(info.value) and ".sst" in str(info.value)
    Path(handle.private["CURRENT"]).write_bytes(b"MANIFEST-999999\n")
    with pytest.raises(CorruptSnapshotError) as info:
        _restore(storage, [handle], FULL, tmp_path)
    assert "the native snapshot of state handle 0" in str(info.value)
    assert "MANIFEST-999999" in str(info.value)
    backend.close()


def test_damaged_or_foreign_canonical_snapshot_is_refused(tmp_path: Path) -> None:
    storage = FakeStorage(tmp_path / "storage")
    backend = _backend(tmp_path)
    fill(backend, KEYS)
    handle = _snapshot(backend, storage, 1, native=False)
    with pytest.raises(ConfigurationError) as info:
        _restore(storage, [handle], KeyGroupRange(0, 255), tmp_path, max_parallelism=256)
    assert str(info.value) == (
        f"state handle 0 ({handle.path}) was taken with max_parallelism 128; it cannot be "
        "restored with max_parallelism 256 (every key would change key group)"
    )
    native = _snapshot(backend, storage, 2, native=True)
    with pytest.raises(ConfigurationError, match="was taken with max_parallelism 128"):
        _restore(storage, [native], KeyGroupRange(0, 99), tmp_path, max_parallelism=256)
    with pytest.raises(CorruptSnapshotError, match="key group 0 is in state handles 0 and 1"):
        _restore(storage, [handle, handle], FULL, tmp_path)
    data = bytearray(Path(handle.path).read_bytes())
    data[-5] ^= 0xFF
    Path(handle.path).write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError) as damaged:
        _restore(storage, [handle], FULL, tmp_path)
    assert str(damaged.value).startswith(f"state handle 0 ({handle.path}) is not a valid canon")
    with pytest.raises(ConfigurationError, match="needs fetch_native"):
        RocksDBKeyedStateBackend.restore(
            [native], 128, FULL, db_dir=str(tmp_path / "x"), fetch=storage.read_state
        )
    backend.close()


def test_shared_references_are_matched_to_their_files() -> None:
    names = ["000012.sst", "1000012.sst"]
    assert shared_file_name({"name": "000012.sst", "path": "x"}, names) == "000012.sst"
    assert shared_file_name({"path": "s3://b/shared/ab12-1000012.sst"}, names) == "1000012.sst"
    assert shared_file_name({"path": "/shared/ab12-000012.sst"}, names) == "000012.sst"
    assert shared_file_name({"path": "/shared/000099.sst"}, names) is None
