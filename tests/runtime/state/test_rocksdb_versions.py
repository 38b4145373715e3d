"""The rocksdb backend's working-state versions: rollback, the process cache, durable chains."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.state.rocksdb import RocksDBKeyedStateBackend
from sparkpoint.state.rocksdb_versions import LIVE_DATABASES

from .test_rocksdb_snapshots import FakeStorage, _snapshot

FULL = KeyGroupRange(0, 127)
COUNT = ValueStateDescriptor("count", default=0)


@dataclass
class FakeStore:
    """A subtask's version store; ``durable`` keeps copies in ``files`` (shared by executors)."""

    local_dir: str
    durable: bool = False
    durable_url: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)

    def write_durable(self, name: str, data: bytes) -> str | None:
        if not self.durable:
            return None
        url = f"mem://working/{name}"
        self.files[url] = data
        return url

    def read_durable(self, url: str) -> bytes | None:
        return self.files.get(url)


def _count(backend: Any, key: Any) -> Any:
    backend.set_current_key(key)
    return backend.get_state(COUNT).value()


def _set(backend: Any, key: Any, value: Any) -> None:
    backend.set_current_key(key)
    backend.get_state(COUNT).update(value)


def _open(store: FakeStore, tag: str) -> Any:
    return RocksDBKeyedStateBackend.open_version(store, tag, 128, FULL)


def test_versions_roll_back_and_the_process_cache(tmp_path: Path) -> None:
    store = FakeStore(str(tmp_path / "keyed"))
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    _set(backend, "a", 1)
    saved = backend.save_version(store, "v1", None)
    assert saved.bytes_written > 0 and saved.durable_url is None and saved.durable_files == ()
    assert _open(store, "v1") is backend  # the next epoch in this worker: no reopening
    _set(backend, "a", 2)
    backend.save_version(store, "v2", "v1")
    assert _open(store, "v2") is backend
    _set(backend, "a", 3)  # this epoch fails: v3 is never saved
    retry = _open(store, "v2")
    assert retry is not backend and backend.closed  # writes beyond v2 are never seen
    assert _count(retry, "a") == 2
    _set(retry, "b", 1)
    first = _open(store, "v1")  # a rollback further back
    assert retry.closed and _count(first, "a") == 1 and _count(first, "b") == 0
    assert _open(store, "v9") is None and first.closed
    restored = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    assert _open(store, "v8") is None and restored.closed  # an unsaved restore is discarded too
    again = _open(store, "v1")
    again.prune_versions(store, {"v1"})
    assert os.listdir(os.path.join(store.local_dir, "versions")) == ["v1"]
    assert os.listdir(os.path.join(store.local_dir, "live")) == [os.path.basename(again.db_dir)]
    again.close()
    assert not os.path.exists(again.db_dir)  # a clone: its version stays
    assert _count(_open(store, "v1"), "a") == 1


def test_a_version_costs_what_the_epoch_wrote(tmp_path: Path) -> None:
    store = FakeStore(str(tmp_path / "keyed"))
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    backend.get_state(COUNT)
    backend.table("count").put_many(list(range(50_000)), list(range(50_000)))
    full = backend.save_version(store, "v1", None).bytes_written
    backend.table("count").put_many(list(range(100)), [0] * 100)
    delta = backend.save_version(store, "v2", "v1").bytes_written
    assert full > 200_000 and delta < full / 10
    LIVE_DATABASES.take(store.local_dir, "none")  # another worker: nothing cached
    reopened = _open(store, "v2")
    assert dict(reopened.table("count").items()) == {
        i: (0 if i < 100 else i) for i in range(50_000)
    }
    reopened.close()


def test_another_executor_rebuilds_a_version_from_the_durable_chain(tmp_path: Path) -> None:
    store = FakeStore(str(tmp_path / "executor-1" / "keyed"), durable=True)
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    backend.channel_watermarks = {0: 7}
    _set(backend, "a", 1)
    _set(backend, "b", 2)
    first = backend.save_version(store, "v1", None)
    assert first.durable_url == "mem://working/v1.chain"
    _set(backend, "a", 10)
    backend.get_state(COUNT).clear()
    store.durable_url = first.durable_url
    second = backend.save_version(store, "v2", "v1")
    assert set(second.durable_files) == {
        "mem://working/v1.base",
        "mem://working/v2.delta",
        "mem://working/v2.chain",
    }
    other = FakeStore(
        str(tmp_path / "executor-2" / "keyed"),
        durable=True,
        durable_url=second.durable_url,
        files=store.files,
    )
    rebuilt = _open(other, "v2")
    assert rebuilt is not backend and not backend.closed  # another local dir
    assert _count(rebuilt, "a") == 0 and _count(rebuilt, "b") == 2
    assert rebuilt.channel_watermarks == {0: 7}
    assert len(rebuilt.take_changes()) == 2  # only the reads above, not the rebuild
    rebuilt.close()
    backend.close()


def test_a_backend_without_durable_copies_stops_tracking_keys_and_a_durable_save_is_full(
    tmp_path: Path,
) -> None:
    store = FakeStore(str(tmp_path / "keyed"))
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    backend.get_state(COUNT)
    table = backend.table("count")
    table.put_many(["a", "b"], [1, 2])
    backend.save_version(store, "v1", None)  # a single machine: no changelog
    table.put_many(["c"], [3])
    assert table.touched == set()  # no one will ask which keys changed
    store.durable = True  # were the storage to change, the changelog starts with a base
    saved = backend.save_version(store, "v2", "v1")
    assert [f.rsplit("/", 1)[1] for f in saved.durable_files] == ["v2.base", "v2.chain"]
    table.put_many(["d"], [4])
    assert table.touched == {"d"}  # tracked again: the next changelog is a delta
    other = FakeStore(str(tmp_path / "other"), durable=True, files=store.files)
    other.durable_url = saved.durable_url
    rebuilt = _open(other, "v2")
    assert dict(rebuilt.table("count").items()) == {"a": 1, "b": 2, "c": 3}
    rebuilt.close()
    backend.close()


def test_the_upload_record_follows_the_versions(tmp_path: Path) -> None:
    storage = FakeStorage(tmp_path / "storage")
    store = FakeStore(str(tmp_path / "keyed"))
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    backend.get_state(COUNT)
    backend.table("count").put_many(list(range(1000)), list(range(1000)))
    _snapshot(backend, storage, 1, native=True)
    backend.save_version(store, "v1", None)
    LIVE_DATABASES.take(store.local_dir, "none")  # the next epoch runs in another worker
    assert backend.closed
    reopened = _open(store, "v1")
    _set(reopened, "x", 1)
    _snapshot(reopened, storage, 2, native=True)
    assert storage.received[1]["reused"] == storage.received[0]["shared"]
    reopened.close()


def test_prune_removes_what_dead_processes_left(tmp_path: Path) -> None:
    store = FakeStore(str(tmp_path / "keyed"))
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    _set(backend, "a", 1)
    backend.save_version(store, "v1", None)
    old, fresh = (os.path.join(store.local_dir, n) for n in (".checkpoint-1-x", ".restore-y"))
    os.makedirs(old)
    os.makedirs(fresh)
    os.utime(old, (0, 0))  # created long ago: its process is gone
    dead_live = os.path.join(store.local_dir, "live", "dead")
    just_made = os.path.join(store.local_dir, "live", "just-made")  # not opened yet
    os.makedirs(dead_live)
    os.makedirs(just_made)
    os.utime(dead_live, (0, 0))
    backend.prune_versions(store, {"v1"})
    assert sorted(os.listdir(store.local_dir)) == [".restore-y", "db", "live", "versions"]
    assert os.listdir(os.path.join(store.local_dir, "live")) == ["just-made"]
    assert _count(backend, "a") == 1  # the open database in db/ is untouched
    backend.close()


def test_an_upload_that_ends_after_the_version_still_reaches_the_next_epoch(
    tmp_path: Path,
) -> None:
    storage = FakeStorage(tmp_path / "storage")
    store = FakeStore(str(tmp_path / "keyed"))
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    backend.get_state(COUNT)
    backend.table("count").put_many(list(range(1000)), list(range(1000)))
    # Epoch 1: the barrier's snapshot, the version, then the upload (as the runtime orders it).
    capture = backend.snapshot(1, native=True)
    backend.save_version(store, "v1", None)
    capture.materialize(storage.target(1, FULL))
    capture.release()
    uploaded = storage.received[0]["shared"]
    # Epoch 2 continues in this worker, snapshots, uploads and fails.
    assert _open(store, "v1") is backend
    _set(backend, "x", 1)
    capture = backend.snapshot(2, native=True)
    capture.materialize(storage.target(2, FULL))
    capture.release()
    assert storage.received[1]["reused"] == uploaded and storage.received[1]["shared"]
    # The retry of epoch 2 (another worker: the version from disk) knows checkpoint 1's files,
    # never those of the failed attempt, whose file numbers it may reuse for other contents.
    retry = _open(store, "v1")
    assert retry is not backend and backend.closed
    _set(retry, "y", 1)
    _snapshot(retry, storage, 3, native=True)
    assert storage.received[2]["reused"] == uploaded
    retry.close()


def test_prune_skips_a_directory_removed_while_it_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upload thread of a snapshot deletes its temporary checkpoint directory whenever it
    is done, possibly between prune's listing and its look at that directory."""
    from sparkpoint.state import rocksdb_versions

    store = FakeStore(str(tmp_path / "keyed"))
    backend = RocksDBKeyedStateBackend(128, FULL, db_dir=os.path.join(store.local_dir, "db"))
    _set(backend, "a", 1)
    backend.save_version(store, "v1", None)
    capture = os.path.join(store.local_dir, "live", ".checkpoint-5-x")
    os.makedirs(capture)
    real = rocksdb_versions._prunable

    def racing(entry: os.DirEntry[str], *args: object) -> bool:
        if entry.name == ".checkpoint-5-x":
            os.rmdir(capture)  # the upload thread finished right now
        return real(entry, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(rocksdb_versions, "_prunable", racing)
    backend.prune_versions(store, {"v1"})  # no FileNotFoundError
    assert _count(backend, "a") == 1
    backend.close()
