"""The hashmap backend between epochs: working-state versions (a base, deltas and a chain)
saved and opened through a store."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpointing.filesystem_storage import FileSystemCheckpointStorage
from sparkpoint.errors import ConfigurationError, CorruptSnapshotError
from sparkpoint.runtime.working_state import SubtaskVersionStore
from sparkpoint.state import changelog, changelog_delta
from sparkpoint.state.backend import (
    DELETED,
    StateInfo,
)
from sparkpoint.state.descriptors import (
    ListStateDescriptor,
    NoCurrentKeyError,
)
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import KeyGroupRange
from sparkpoint.state.snapshot_contracts import (
    SavedVersion,
)
from sparkpoint.testing import snapshot_blob

from .conftest import COUNT, EVENTS, FULL, LAST_SEEN, PAYLOAD, copy_of_tables, filled_hashmap


class MemoryVersionStore:
    """A :class:`~sparkpoint.state.backend.VersionStore`: files in ``local_dir``; durable
    copies, when ``durable`` is a dict, in it (URL -> bytes), as a cluster's storage keeps them."""

    def __init__(
        self,
        local_dir: Path,
        durable: dict[str, bytes] | None = None,
        durable_url: str | None = None,
    ) -> None:
        self.local_dir: str = str(local_dir)
        self.durable_url: str | None = durable_url
        self.durable = durable

    def write_durable(self, name: str, data: bytes) -> str | None:
        if self.durable is None:
            return None
        url = f"mem://working/{name}"
        self.durable[url] = bytes(data)
        return url

    def read_durable(self, url: str) -> bytes | None:
        return None if self.durable is None else self.durable.get(url)


@pytest.fixture(autouse=True)
def no_live_backends() -> Iterator[None]:
    """The live-backend cache is per process: no test sees another's backends."""
    changelog._LIVE.clear()
    yield
    changelog._LIVE.clear()


@pytest.fixture
def store(tmp_path: Path) -> MemoryVersionStore:
    return MemoryVersionStore(tmp_path / "local")


def _epoch(backend: HashMapKeyedStateBackend, label: str, keys: range) -> None:
    """What an epoch does to ``keys``: in-place list and map updates, a replaced value, one
    key cleared, one new key, and the watermarks advanced."""
    count = backend.get_state(COUNT)
    events = backend.get_state(EVENTS)
    last = backend.get_state(LAST_SEEN)
    for i in keys:
        backend.set_current_key(f"k{i}")
        count.update(count.value() + 1000)
        events.add(label)
        last.put(label, i)
    backend.set_current_key(f"k{keys.stop}")
    count.clear()
    events.clear()
    backend.set_current_key(f"new-{label}")
    count.update(-1)
    backend.channel_watermarks = {c: w + 100 for c, w in backend.channel_watermarks.items()}


def _files(store: MemoryVersionStore) -> set[str]:
    return set(os.listdir(store.local_dir))


def _open(store: MemoryVersionStore, tag: str) -> HashMapKeyedStateBackend | None:
    return HashMapKeyedStateBackend.open_version(store, tag, 128, FULL)


def _reopen(store: MemoryVersionStore, tag: str) -> HashMapKeyedStateBackend:
    """Version ``tag`` rebuilt from the files (as in a new Python worker)."""
    changelog._LIVE.clear()
    backend = _open(store, tag)
    assert backend is not None
    return backend


def _read(store: MemoryVersionStore, name: str) -> bytes:
    return Path(store.local_dir, name).read_bytes()


def _size(store: MemoryVersionStore, name: str) -> int:
    return os.path.getsize(os.path.join(store.local_dir, name))


def _chain(store: MemoryVersionStore, tag: str) -> dict[str, Any]:
    chain: dict[str, Any] = json.loads(_read(store, f"{tag}.chain"))
    return chain


# ----------------------------------------------------------------------------- tracked tables


def test_a_delta_version_reopens_as_the_live_state_and_rolls_back(
    store: MemoryVersionStore,
) -> None:
    backend = filled_hashmap(1000)
    v1 = backend.save_version(store, "v1", None)
    at_v1 = copy_of_tables(backend)
    _epoch(backend, "e2", range(0, 10))
    v2 = backend.save_version(store, "v2", "v1")
    assert _files(store) == {"v1.base", "v1.chain", "v2.delta", "v2.chain"}
    base = os.path.getsize(os.path.join(store.local_dir, "v1.base"))
    delta = os.path.getsize(os.path.join(store.local_dir, "v2.delta"))
    assert delta * 20 < base  # about 1% of the keys changed
    assert v1 == SavedVersion(base + _size(store, "v1.chain"))  # no durable copies
    assert v2 == SavedVersion(delta + _size(store, "v2.chain"))
    decoded = changelog_delta.decode_delta(_read(store, "v2.delta"), "v2.delta")
    entries = list(decoded.entries(backend.key_group_range))
    assert len(entries) == 33  # 10 x 3 states, k10 x 2, new-e2
    assert sum(value is DELETED for *_, value in entries) == 2  # k10's events and count

    reopened = _reopen(store, "v2")
    assert reopened is not backend
    assert copy_of_tables(reopened) == copy_of_tables(backend)
    assert reopened.state_infos == backend.state_infos
    assert reopened.channel_watermarks == {0: 200, 1: 250}
    assert reopened.take_changes().changes == {}  # what was loaded is no change
    reopened.set_current_key("k3")
    assert reopened.get_state(COUNT).value() == 1003
    assert reopened.get_state(EVENTS).get() == ["e2"]
    assert reopened.get_state(LAST_SEEN).items() == [("first", 3), ("e2", 3)]
    reopened.set_current_key("k10")  # cleared in v2
    assert reopened.get_state(EVENTS).get() == [] and reopened.get_state(COUNT).value() == 0

    rolled_back = _reopen(store, "v1")  # the retry of a failed epoch asks for v1
    assert copy_of_tables(rolled_back) == at_v1
    assert rolled_back.channel_watermarks == {0: 100, 1: 150}


def test_the_live_backend_is_reused_only_at_the_tag_it_saved(store: MemoryVersionStore) -> None:
    backend = filled_hashmap(20)
    backend.save_version(store, "v1", None)
    at_v1 = copy_of_tables(backend)
    assert _open(store, "v1") is backend  # the next epoch in the same worker: no bytes read
    again = _open(store, "v1")  # taken: a second open (a retry) rebuilds from the files
    assert again is not None and again is not backend and copy_of_tables(again) == at_v1

    _epoch(backend, "e2", range(3))
    backend.save_version(store, "v2", "v1")
    rolled_back = _open(store, "v1")  # another tag: the live backend is not used
    assert rolled_back is not None and rolled_back is not backend
    assert copy_of_tables(rolled_back) == at_v1
    newer = _open(store, "v2")  # and it was dropped
    assert (
        newer is not None
        and newer is not backend
        and copy_of_tables(newer) == copy_of_tables(backend)
    )


def test_a_worker_behind_reads_only_the_deltas_written_since_its_version(
    store: MemoryVersionStore,
) -> None:
    worker_a = filled_hashmap(1000)
    worker_a.save_version(store, "v1", None)
    kept = changelog._LIVE.pop(store.local_dir)  # worker A's process keeps v1
    worker_b = _open(store, "v1")  # the next epoch runs in worker B: rebuilt from the files
    assert worker_b is not None and worker_b is not worker_a
    _epoch(worker_b, "e2", range(0, 10))
    worker_b.save_version(store, "v2", "v1")
    _epoch(worker_b, "e3", range(5, 20))
    worker_b.save_version(store, "v3", "v2")
    expected, watermarks = copy_of_tables(worker_b), worker_b.channel_watermarks
    changelog._LIVE[store.local_dir] = kept  # the epoch after runs in worker A again
    os.remove(os.path.join(store.local_dir, "v1.base"))  # reading it would fail the open
    caught_up = _open(store, "v3")
    assert caught_up is worker_a and copy_of_tables(caught_up) == expected
    assert caught_up.channel_watermarks == watermarks
    assert caught_up.take_changes().changes == {}  # what was loaded is no change


def test_a_worker_behind_a_new_base_rebuilds(store: MemoryVersionStore) -> None:
    backend = filled_hashmap(50)
    backend.save_version(store, "v1", None)
    kept = changelog._LIVE.pop(store.local_dir)
    other = _open(store, "v1")
    assert other is not None
    _epoch(other, "e2", range(50))  # every key changed: the next version is a new base
    other.save_version(store, "v2", "v1")
    other.save_version(store, "v3", "v2")
    assert _chain(store, "v3")["files"][0]["name"] != "v1.base"
    changelog._LIVE[store.local_dir] = kept
    rebuilt = _open(store, "v3")
    assert rebuilt is not None and rebuilt is not backend
    assert copy_of_tables(rebuilt) == copy_of_tables(other)


def test_a_failed_epoch_is_not_seen_by_its_retry(store: MemoryVersionStore) -> None:
    saved = filled_hashmap(20)
    saved.save_version(store, "v1", None)
    at_v1 = copy_of_tables(saved)
    attempt = _open(store, "v1")
    assert attempt is saved
    _epoch(attempt, "lost", range(5))  # then the epoch fails before saving v2
    retry = _open(store, "v1")
    assert retry is not None and retry is not attempt
    assert copy_of_tables(retry) == at_v1


def test_a_reopened_version_is_an_independent_backend(store: MemoryVersionStore) -> None:
    backend = HashMapKeyedStateBackend(128, FULL)
    count = backend.get_state(COUNT)
    for key, value in (("a", 1), ("b", 2)):
        backend.set_current_key(key)
        count.update(value)
    backend.save_version(store, "v1", None)
    reopened = _reopen(store, "v1")
    with pytest.raises(NoCurrentKeyError):  # the current key is not part of a version
        reopened.get_state(COUNT).value()
    reopened_count = reopened.get_state(COUNT)
    reopened.set_current_key("b")
    assert reopened_count.value() == 2
    reopened_count.update(7)
    assert reopened.table("count") == {"a": 1, "b": 7}
    assert backend.table("count") == {"a": 1, "b": 2}
    with pytest.raises(ConfigurationError, match="is a value state"):
        reopened.get_state(ListStateDescriptor("count"))  # the kind came back with the state


def test_durable_copies_open_on_another_executor(tmp_path: Path) -> None:
    durable: dict[str, bytes] = {}
    first = MemoryVersionStore(tmp_path / "executor-1", durable)
    backend = filled_hashmap(300)
    v1 = backend.save_version(first, "v1", None)
    assert v1.durable_url == "mem://working/v1.chain"
    assert v1.durable_files == ("mem://working/v1.base", "mem://working/v1.chain")
    _epoch(backend, "e2", range(10))
    first.durable_url = v1.durable_url  # the store of an epoch names the version it opened
    v2 = backend.save_version(first, "v2", "v1")
    assert v2.durable_url == "mem://working/v2.chain"
    assert v2.durable_files == (
        "mem://working/v1.base",
        "mem://working/v2.delta",
        "mem://working/v2.chain",
    )
    assert v2.bytes_written == len(durable["mem://working/v2.delta"]) + len(
        durable["mem://working/v2.chain"]
    )
    shutil.rmtree(first.local_dir)  # the executor is gone

    # Step 1: without the durable URL nothing is found.
    second = MemoryVersionStore(tmp_path / "executor-2", durable)
    changelog._LIVE.clear()
    assert _open(second, "v2") is None
    # Step 2: through the durable copy.
    second.durable_url = v2.durable_url
    moved = _reopen(second, "v2")
    assert copy_of_tables(moved) == copy_of_tables(backend)
    assert moved.channel_watermarks == {0: 200, 1: 250}
    # Step 3: the next version there is a delta on the durable chain.
    _epoch(moved, "e3", range(10, 20))
    v3 = moved.save_version(second, "v3", "v2")
    assert _files(second) == {"v3.delta", "v3.chain"}
    assert v3.durable_files == (
        "mem://working/v1.base",
        "mem://working/v2.delta",
        "mem://working/v3.delta",
        "mem://working/v3.chain",
    )
    third = MemoryVersionStore(tmp_path / "executor-3", durable, v3.durable_url)
    assert copy_of_tables(_reopen(third, "v3")) == copy_of_tables(moved)
    # Step 4: a durable file that is gone is named.
    del durable["mem://working/v2.delta"]
    fourth = MemoryVersionStore(tmp_path / "executor-4", durable, v3.durable_url)
    with pytest.raises(CorruptSnapshotError) as info:
        _reopen(fourth, "v3")
    assert str(info.value) == (
        f"working-state file v2.delta of version v3 is neither in {fourth.local_dir} nor "
        "stored durably"
    )


def test_a_new_base_once_the_deltas_outweigh_the_base(store: MemoryVersionStore) -> None:
    backend = filled_hashmap(30)
    backend.save_version(store, "v1", None)
    _epoch(backend, "e2", range(29))  # nearly every key: the delta outweighs the base
    backend.save_version(store, "v2", "v1")
    assert _size(store, "v2.delta") > _size(store, "v1.base")
    _epoch(backend, "e3", range(1))
    backend.save_version(store, "v3", "v2")
    assert "v3.base" in _files(store) and "v3.delta" not in _files(store)
    assert _chain(store, "v3")["files"] == [{"name": "v3.base", "durable": None}]
    assert copy_of_tables(_reopen(store, "v3")) == copy_of_tables(backend)
    # A previous version whose chain is not here (or none: after a restore) gives a base too.
    backend.save_version(store, "v4", "unknown")
    backend.save_version(store, "v5", None)
    assert {"v4.base", "v5.base"} <= _files(store)


def test_a_new_base_after_max_deltas(store: MemoryVersionStore) -> None:
    backend = filled_hashmap(2000)  # a base that 32 one-key deltas do not outweigh
    backend.save_version(store, "v0", None)
    count = backend.get_state(COUNT)
    for version in range(1, changelog.MAX_DELTAS + 2):
        backend.set_current_key("k0")
        count.update(version)
        backend.save_version(store, f"v{version}", f"v{version - 1}")
    last_delta = f"v{changelog.MAX_DELTAS}"
    assert f"{last_delta}.delta" in _files(store)
    assert len(_chain(store, last_delta)["files"]) == changelog.MAX_DELTAS + 1
    rebased = f"v{changelog.MAX_DELTAS + 1}"
    assert f"{rebased}.base" in _files(store) and f"{rebased}.delta" not in _files(store)
    replayed = _reopen(store, last_delta)  # the base and MAX_DELTAS deltas
    assert replayed.table("count")["k0"] == changelog.MAX_DELTAS
    assert copy_of_tables(_reopen(store, rebased)) == copy_of_tables(backend)


def test_prune_keeps_only_the_files_of_the_named_versions(store: MemoryVersionStore) -> None:
    backend = filled_hashmap(50)
    backend.save_version(store, "v1", None)
    for version in (2, 3):
        _epoch(backend, f"e{version}", range(version))
        backend.save_version(store, f"v{version}", f"v{version - 1}")
    Path(store.local_dir, "v9.base.tmp").write_bytes(b"an interrupted write")
    Path(store.local_dir, "db").mkdir()  # directories are not the changelog's
    backend.prune_versions(store, {"v3"})
    assert _files(store) == {"v1.base", "v2.delta", "v3.delta", "v3.chain", "db"}
    changelog._LIVE.clear()
    assert _open(store, "v2") is None  # its chain is gone and there is no durable copy
    assert copy_of_tables(_reopen(store, "v3")) == copy_of_tables(backend)
    _epoch(backend, "e4", range(4))
    backend.save_version(store, "v4", "v3")
    backend.prune_versions(store, {"v4", "v3"})  # until the driver accepts v4
    assert _files(store) == {
        "v1.base",
        "v2.delta",
        "v3.delta",
        "v3.chain",
        "v4.delta",
        "v4.chain",
        "db",
    }
    backend.save_version(store, "v5", None)  # a restore starts a new chain
    backend.prune_versions(store, {"v5"})
    assert _files(store) == {"v5.base", "v5.chain", "db"}
    gone = MemoryVersionStore(Path(store.local_dir) / "missing")
    backend.prune_versions(gone, {"v5"})  # no directory: nothing to prune


def test_damaged_versions_are_refused_by_name(store: MemoryVersionStore) -> None:
    backend = filled_hashmap(50)
    backend.save_version(store, "v1", None)
    _epoch(backend, "e2", range(5))
    backend.save_version(store, "v2", "v1")
    chain_v2 = _read(store, "v2.chain")

    Path(store.local_dir, "v2.chain").write_bytes(b"{not json")
    with pytest.raises(CorruptSnapshotError, match=r"working-state chain v2 of .* is damaged"):
        _reopen(store, "v2")
    Path(store.local_dir, "v2.chain").write_bytes(_read(store, "v1.chain"))  # another's
    with pytest.raises(CorruptSnapshotError, match="not the chain of version v2"):
        _reopen(store, "v2")
    Path(store.local_dir, "v2.chain").write_bytes(chain_v2)

    delta = bytearray(_read(store, "v2.delta"))
    delta[-1] ^= 1
    Path(store.local_dir, "v2.delta").write_bytes(bytes(delta))
    with pytest.raises(CorruptSnapshotError) as info:
        _reopen(store, "v2")
    assert str(info.value) == (
        f"{os.path.join(store.local_dir, 'v2.delta')} is not a valid working-state delta: "
        "the body's CRC-32 does not match (altered)"
    )

    os.remove(os.path.join(store.local_dir, "v1.base"))
    with pytest.raises(CorruptSnapshotError, match=r"working-state file v1\.base of version v2"):
        _reopen(store, "v2")


def test_a_version_opened_with_another_max_parallelism_is_refused(
    store: MemoryVersionStore,
) -> None:
    filled_hashmap(5).save_version(store, "v1", None)
    changelog._LIVE.clear()
    with pytest.raises(ConfigurationError, match="taken with max_parallelism 128"):
        HashMapKeyedStateBackend.open_version(store, "v1", 256, KeyGroupRange(0, 255))


def test_a_version_holds_the_registered_states_without_entries(store: MemoryVersionStore) -> None:
    backend = HashMapKeyedStateBackend(128, FULL)
    backend.get_state(COUNT)
    backend.save_version(store, "v1", None)
    backend.get_state(PAYLOAD)  # registered in the next epoch, still empty
    backend.save_version(store, "v2", "v1")
    assert "v2.delta" in _files(store)
    assert _reopen(store, "v2").state_infos == {
        "count": StateInfo("count", "value", "pickle"),
        "payload": StateInfo("payload", "value", "bytes"),
    }


# ----------------------------------------------------------------------------- cost


def test_a_version_costs_what_the_epoch_changed(store: MemoryVersionStore) -> None:
    n = 200_000
    backend = HashMapKeyedStateBackend(128, FULL)
    backend.get_state(PAYLOAD)
    table = backend.table("payload")
    keys = list(range(n))
    table.put_many(keys, [i.to_bytes(4, "little") * 25 for i in keys])  # 100 bytes each
    first = backend.save_version(store, "v1", None)
    assert first.bytes_written > 20_000_000
    changed = keys[::100]  # 1% of the keys
    table.put_many(changed, [b"\xff" * 100] * len(changed))
    second = backend.save_version(store, "v2", "v1")
    assert second.bytes_written < 0.05 * first.bytes_written
    reopened = _reopen(store, "v2")
    assert reopened.table("payload")[100] == b"\xff" * 100
    assert reopened.table("payload")[101] == (101).to_bytes(4, "little") * 25
    assert len(reopened.table("payload")) == n


def test_snapshot_blob_of_a_reopened_version_equals_the_live_one(
    store: MemoryVersionStore,
) -> None:
    backend = filled_hashmap(100)
    backend.save_version(store, "v1", None)
    _epoch(backend, "e2", range(10))
    backend.save_version(store, "v2", "v1")
    assert snapshot_blob(_reopen(store, "v2")) == snapshot_blob(backend)  # canonical: equal bytes


@pytest.mark.parametrize("refused", ["every copy", "the chain's copy"])
def test_a_durable_copy_the_storage_cannot_take_keeps_the_version_local_then_a_base_follows(
    tmp_path: Path, refused: str
) -> None:
    # The real store and storage. The storage refuses every copy while a regular file stands
    # where the subtask's durable directory goes (as a full or read-only storage does), or
    # only the chain's while a directory stands where the chain's copy goes.
    storage = FileSystemCheckpointStorage(f"file://{tmp_path / 'chk'}")
    here = SubtaskVersionStore(str(tmp_path / "executor-1"), storage, "job", "pv-0", True)
    backend = filled_hashmap(300)
    v1 = backend.save_version(here, "v1", None)
    assert v1.durable_url is not None
    durable_dir = tmp_path / "chk" / "job" / "working" / "pv-0"
    if refused == "every copy":
        shutil.rmtree(durable_dir)
        durable_dir.write_text("not a directory")
    else:
        (durable_dir / "v2.chain.state").mkdir()

    # Step 1: the epoch's version is saved here only, and says it has no durable copy.
    _epoch(backend, "e2", range(10))
    here.durable_url = v1.durable_url
    v2 = backend.save_version(here, "v2", "v1")
    assert v2.durable_url is None
    changelog._LIVE.clear()
    assert copy_of_tables(_reopen(here, "v2")) == copy_of_tables(backend)  # this executor

    # Step 2: once the storage takes copies again, the next version is a whole base (its
    # chain must name no file of a version without a durable chain: the driver may have
    # deleted their copies), and another executor opens it from its copies alone.
    if refused == "every copy":
        durable_dir.unlink()
    else:
        (durable_dir / "v2.chain.state").rmdir()
    _epoch(backend, "e3", range(10, 20))
    here.durable_url = v2.durable_url  # as the driver passes it: none
    v3 = backend.save_version(here, "v3", "v2")
    assert v3.durable_url is not None
    assert [os.path.basename(u) for u in v3.durable_files] == ["v3.base.state", "v3.chain.state"]
    changelog._LIVE.clear()
    there = SubtaskVersionStore(
        str(tmp_path / "executor-2"), storage, "job", "pv-0", True, v3.durable_url
    )
    assert copy_of_tables(_reopen(there, "v3")) == copy_of_tables(backend)
