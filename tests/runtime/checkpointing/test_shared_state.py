"""Native (incremental) snapshots in filesystem checkpoint storage, and shared files' lifetime.

Round trips of ``write_native``/``fetch_native``, files uploaded once and referenced again,
corrupt or missing files named, and shared files deleted by ``discard`` once no checkpoint on
disk needs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkpoint import protocol as p
from sparkpoint.checkpointing.shared_state import split_shared_name, sweepable
from sparkpoint.checkpointing.storage import (
    FileSystemCheckpointStorage,
    JobManagerCheckpointStorage,
    StateTooLargeError,
)
from sparkpoint.checkpointing.storage_base import NativeSnapshotUnsupportedError
from sparkpoint.errors import ConfigurationError, CorruptSnapshotError, StorageLocationError
from sparkpoint.protocol import SharedFileModel, StateHandleModel
from sparkpoint.state.key_groups import KeyGroupRange

from .shared_state_support import (
    FMT,
    JOB,
    LocalFiles,
    complete,
    fs_path,
    sha,
    shared_names,
    snapshot,
)

# ----------------------------------------------------------------------------- protocol


def test_old_handles_and_events_still_parse() -> None:
    legacy = {"path": "file:///c/job/chk-1/pv-0", "size": 3, "checksum": "sha256:00"}
    handle = StateHandleModel.model_validate(legacy)
    assert (handle.format, handle.shared) == (None, [])
    new = StateHandleModel.model_validate(
        {**legacy, "format": FMT, "shared": [{"path": "a", "size": 1, "checksum": "c"}]}
    )
    assert new.shared == [SharedFileModel(path="a", size=1, checksum="c")]
    assert StateHandleModel.model_validate(new.model_dump(mode="json")) == new
    assert p.StateHandleModel is StateHandleModel


# ----------------------------------------------------------------------------- round trip


def test_write_native_then_fetch_native_round_trip(
    storage: FileSystemCheckpointStorage, files: LocalFiles, tmp_path: Path
) -> None:
    contents = {
        "CURRENT": b"MANIFEST-000005\n",
        "MANIFEST-000005": b"m" * 300,
        "000007.sst": b"s" * 5000,
    }
    private = {n: files.make(contents[n]) for n in ("CURRENT", "MANIFEST-000005")}
    shared = {"000007.sst": files.make(contents["000007.sst"])}
    handle = storage.write_native(
        JOB, 3, "pv-0", private, shared, [], key_group_range=KeyGroupRange(0, 63), fmt=FMT
    )
    base = storage.checkpoint_path(JOB, 3)
    assert handle.path == f"{base}/pv-0/_manifest.json"
    assert handle.format == FMT
    assert (handle.key_group_start, handle.key_group_end) == (0, 63)
    sst_url = f"{storage.shared_path(JOB)}/pv-0-c3-000007.sst"
    assert handle.shared == [SharedFileModel(path=sst_url, size=5000, checksum=sha(b"s" * 5000))]
    raw = storage.fs.cat_file(fs_path(storage, handle.path))
    assert (handle.size, handle.checksum) == (len(raw), sha(raw))
    manifest = json.loads(raw)["files"]
    assert manifest["CURRENT"] == {
        "path": f"{base}/pv-0/CURRENT",
        "size": len(contents["CURRENT"]),
        "checksum": sha(contents["CURRENT"]),
        "shared": False,
    }
    assert manifest["000007.sst"]["shared"] is True
    dest = tmp_path / "restored"
    storage.fetch_native(handle, str(dest))
    assert {f.name: f.read_bytes() for f in dest.iterdir()} == contents
    storage.verify_handles([handle])


def test_a_reused_file_is_not_uploaded_again(
    storage: FileSystemCheckpointStorage, files: LocalFiles, tmp_path: Path
) -> None:
    first = storage.write_native(
        JOB,
        1,
        "pv-0",
        {"CURRENT": files.make()},
        {"1.sst": files.make(b"one"), "2.sst": files.make()},
        [],
        key_group_range=None,
        fmt=FMT,
    )
    one = next(ref for ref in first.shared if ref.path.endswith("-1.sst"))
    shared_file = fs_path(storage, one.path)
    storage.fs.pipe_file(shared_file, b"ONE")  # same size: an upload would write "one" again
    second = storage.write_native(
        JOB,
        2,
        "pv-0",
        {"CURRENT": files.make()},
        {"3.sst": files.make(b"three")},
        [one],
        key_group_range=None,
        fmt=FMT,
    )
    assert storage.fs.cat_file(shared_file) == b"ONE"
    assert shared_names(storage) == ["pv-0-c1-1.sst", "pv-0-c1-2.sst", "pv-0-c2-3.sst"]
    assert [r.path.rsplit("/", 1)[1] for r in second.shared] == ["pv-0-c1-1.sst", "pv-0-c2-3.sst"]
    storage.fs.pipe_file(shared_file, b"one")
    dest = tmp_path / "second"
    storage.fetch_native(second, str(dest))
    assert (dest / "1.sst").read_bytes() == b"one"
    assert (dest / "3.sst").read_bytes() == b"three"
    assert not (dest / "2.sst").exists()


def test_reused_files_must_be_this_jobs_shared_files(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> None:
    first = storage.write_native(
        JOB,
        1,
        "pv-0",
        {"CURRENT": files.make()},
        {"1.sst": files.make()},
        [],
        key_group_range=None,
        fmt=FMT,
    )
    ref = first.shared[0]
    elsewhere = [
        ref.model_copy(update={"path": ref.path.replace(f"/{JOB}/", "/job-b/")}),
        ref.model_copy(update={"path": first.path}),  # in a checkpoint directory
        ref.model_copy(update={"path": "file:///etc/passwd"}),
    ]
    for bad in elsewhere:
        with pytest.raises(StorageLocationError, match=r"outside|not on this|not a shared file"):
            storage.write_native(JOB, 2, "pv-0", {}, {}, [bad], key_group_range=None, fmt=FMT)


def test_names_that_would_hide_the_uploader_are_refused(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> None:
    with pytest.raises(StorageLocationError, match="-c<digits>"):
        storage.write_native(
            JOB, 1, "op-c7-x", {}, {"1.sst": files.make()}, [], key_group_range=None, fmt=FMT
        )
    with pytest.raises(StorageLocationError, match="more than once"):
        storage.write_native(
            JOB,
            1,
            "pv-0",
            {"a": files.make()},
            {"a": files.make()},
            [],
            key_group_range=None,
            fmt=FMT,
        )
    assert split_shared_name("pv-0-c12-000001.sst") == (12, "000001.sst")
    assert split_shared_name("stray.tmp") is None


# ----------------------------------------------------------------------------- corruption


def test_a_missing_shared_file_is_named(
    storage: FileSystemCheckpointStorage, files: LocalFiles, tmp_path: Path
) -> None:
    handle, url = snapshot(storage, files)
    storage.fs.rm(fs_path(storage, url))
    for check in (
        lambda: storage.fetch_native(handle, str(tmp_path / "d")),
        lambda: storage.verify_handles([handle]),
    ):
        with pytest.raises(CorruptSnapshotError) as err:
            check()
        assert str(err.value) == (
            f"state file {url} of native snapshot {handle.path} is missing "
            f"(expected 100 bytes, {sha(b'x' * 100)})"
        )


def test_an_altered_shared_file_is_named(
    storage: FileSystemCheckpointStorage, files: LocalFiles, tmp_path: Path
) -> None:
    handle, url = snapshot(storage, files)
    storage.fs.pipe_file(fs_path(storage, url), b"y" * 100)  # same size
    storage.verify_handles([handle])  # shared files: size only, the download checks the rest
    with pytest.raises(
        CorruptSnapshotError,
        match=f"state file {url} of native snapshot .* checksum {sha(b'y' * 100)}, expected 100",
    ):
        storage.fetch_native(handle, str(tmp_path / "d"))
    assert not (tmp_path / "d" / "1.sst").exists()
    storage.fs.pipe_file(fs_path(storage, url), b"x" * 99)  # truncated
    with pytest.raises(
        CorruptSnapshotError, match=f"state file {url} of native snapshot .* is 99 bytes"
    ):
        storage.verify_handles([handle])


def test_an_altered_private_file_or_manifest_is_named(
    storage: FileSystemCheckpointStorage, files: LocalFiles, tmp_path: Path
) -> None:
    handle, _ = snapshot(storage, files)
    current = fs_path(storage, handle.path).replace("_manifest.json", "CURRENT")
    current = f"{storage.base_url.split('://')[0]}://{current}"
    storage.fs.pipe_file(fs_path(storage, current), b"CUR")  # same size: small files are hashed
    with pytest.raises(CorruptSnapshotError, match=f"state file {current} of native snapshot"):
        storage.verify_handles([handle])
    storage.fs.pipe_file(fs_path(storage, handle.path), b"{}")
    with pytest.raises(CorruptSnapshotError, match=f"state file {handle.path} is 2 bytes"):
        storage.fetch_native(handle, str(tmp_path / "d"))


def test_a_crafted_manifest_cannot_write_outside_the_destination(
    storage: FileSystemCheckpointStorage, files: LocalFiles, tmp_path: Path
) -> None:
    handle, url = snapshot(storage, files)
    raw = json.dumps(
        {
            "format": "sparkpoint-native-manifest/1",
            "files": {"../escape": {"path": url, "size": 100, "checksum": "x", "shared": True}},
        }
    ).encode()
    storage.fs.pipe_file(fs_path(storage, handle.path), raw)
    crafted = handle.model_copy(update={"size": len(raw), "checksum": sha(raw)})
    with pytest.raises(StorageLocationError, match="path separator"):
        storage.fetch_native(crafted, str(tmp_path / "d"))
    assert not (tmp_path / "escape").exists()


def test_jobmanager_storage_refuses_native_snapshots(files: LocalFiles) -> None:
    storage = JobManagerCheckpointStorage()
    with pytest.raises(NativeSnapshotUnsupportedError) as err:
        storage.write_native(
            JOB, 1, "pv-0", {}, {"1.sst": files.make()}, [], key_group_range=None, fmt=FMT
        )
    assert isinstance(err.value, ConfigurationError) and isinstance(err.value, StateTooLargeError)
    assert "--checkpoint-storage filesystem --checkpoint-dir" in str(err.value)
    handle = StateHandleModel(path="file:///x/_manifest.json", size=1, checksum="c", format=FMT)
    with pytest.raises(NativeSnapshotUnsupportedError):
        storage.fetch_native(handle, "/tmp/never")


# ----------------------------------------------------------------------------- lifetime


def test_discard_deletes_shared_files_no_remaining_checkpoint_needs(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> None:
    one = storage.write_native(
        JOB,
        1,
        "pv-0",
        {},
        {"a.sst": files.make(), "b.sst": files.make()},
        [],
        key_group_range=None,
        fmt=FMT,
    )
    complete(storage, 1, one)
    a = [r for r in one.shared if r.path.endswith("a.sst")]
    two = storage.write_native(
        JOB, 2, "pv-0", {}, {"c.sst": files.make()}, a, key_group_range=None, fmt=FMT
    )
    complete(storage, 2, two)
    storage.write_native(
        JOB, 3, "pv-0", {}, {"d.sst": files.make()}, a, key_group_range=None, fmt=FMT
    )  # in flight
    storage.discard(JOB, 1)
    assert shared_names(storage) == ["pv-0-c1-a.sst", "pv-0-c2-c.sst", "pv-0-c3-d.sst"]
    # A restarted authority (a new storage object) counts from what is on disk.
    again = FileSystemCheckpointStorage(storage.base_url)
    assert again.cleanup_incomplete(JOB) == [3]
    assert shared_names(again) == ["pv-0-c1-a.sst", "pv-0-c2-c.sst", "pv-0-c3-d.sst"]
    four = again.write_native(
        JOB, 4, "pv-0", {}, {"e.sst": files.make()}, [], key_group_range=None, fmt=FMT
    )
    complete(again, 4, four)
    again.discard(JOB, 2)  # 3 was aborted: its upload goes once 4 completed
    assert shared_names(again) == ["pv-0-c4-e.sst"]
    again.discard(JOB, 4)  # no completed checkpoint left: nothing is known to be garbage
    assert shared_names(again) == ["pv-0-c4-e.sst"]


def test_an_unreadable_metadata_stops_the_sweep(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> None:
    one = storage.write_native(
        JOB, 1, "pv-0", {}, {"a.sst": files.make()}, [], key_group_range=None, fmt=FMT
    )
    complete(storage, 1, one)
    two = storage.write_native(
        JOB, 2, "pv-0", {}, {"b.sst": files.make()}, [], key_group_range=None, fmt=FMT
    )
    complete(storage, 2, two)
    storage.fs.pipe_file(
        fs_path(storage, storage.checkpoint_path(JOB, 2)) + "/_metadata", b"{not json"
    )
    storage.discard(JOB, 1)
    assert shared_names(storage) == ["pv-0-c1-a.sst", "pv-0-c2-b.sst"]


def test_verify_checkpoint_reads_its_metadata(
    storage: FileSystemCheckpointStorage, files: LocalFiles
) -> None:
    handle, url = snapshot(storage, files)
    complete(storage, 1, handle)
    storage.verify_checkpoint(JOB, 1)
    storage.fs.rm(fs_path(storage, url))
    with pytest.raises(CorruptSnapshotError, match=f"checkpoint 1 of job {JOB}: state file {url}"):
        storage.verify_checkpoint(JOB, 1)


def test_sweepable_keeps_referenced_foreign_and_in_flight_files() -> None:
    files = ["/s/pv-0-c1-a", "/s/pv-0-c2-b", "/s/pv-0-c5-c", "/s/stray", "/s/pv-0-c3-d"]
    assert sweepable(files, {"/s/pv-0-c1-a"}, 3) == ["/s/pv-0-c2-b", "/s/pv-0-c3-d"]
    assert sweepable(files, set(), 0) == []
