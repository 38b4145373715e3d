"""``sparkpoint savepoint inspect | dispose``: on savepoints written by the real filesystem
checkpoint storage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparkpoint import cli
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.checkpointing.storage_base import format_size
from sparkpoint.protocol import SnapshotCompleted, StateDescriptorModel, StateHandleModel
from sparkpoint.state import canonical, changelog_delta
from sparkpoint.state.backend import StateInfo
from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import KeyGroupRange, key_group_for
from sparkpoint.testing import snapshot_blob

JOB = "orders"
MP = 8
COMPLETED_MS = 1_764_158_400_000  # 2025-11-26 12:00:00 UTC
STATES = {
    "count": StateInfo("count", "value", "int64"),
    "events": StateInfo("events", "list", "json"),
}


def with_format(handle: StateHandleModel, fmt: str) -> StateHandleModel:
    """The handle recording ``fmt`` (when this version of the protocol has the field)."""
    if "format" not in StateHandleModel.model_fields:
        return handle
    return handle.model_copy(update={"format": fmt})


def ack(
    operator_id: str,
    subtask: int,
    handles: list[StateHandleModel],
    positions: dict[str, int] | None = None,
) -> dict[str, Any]:
    return SnapshotCompleted(
        checkpoint_id=3,
        operator_id=operator_id,
        subtask=subtask,
        epoch=3,
        ack_timestamp=COMPLETED_MS,
        start_delay_ms=0,
        alignment_duration_ms=0,
        alignment_buffered_bytes=0,
        sync_duration_ms=1,
        async_duration_ms=2,
        state_size=sum(h.size for h in handles),
        checkpointed_size=sum(h.size for h in handles),
        handles=handles,
        source_positions=positions or {},
    ).model_dump(mode="json")


@pytest.fixture
def savepoint(tmp_path: Path) -> dict[str, Any]:
    """A savepoint of job ``orders``: counter[0] canonical, counter[1] a legacy hashmap
    snapshot, enrich[0] a RocksDB native handle, source[0] without state."""
    storage = FileSystemCheckpointStorage(str(tmp_path))
    low = KeyGroupRange(0, 3)
    keys = [
        k for k in ("alice", "bob", "carol", "dave", "erin", "frank") if key_group_for(k, MP) <= 3
    ]
    entries: list[tuple[int, str, str, Any]] = [
        (key_group_for(k, MP), "count", k, i + 1) for i, k in enumerate(keys)
    ]
    entries.append((key_group_for(keys[0], MP), "events", keys[0], ["signup", {"n": 1}]))
    blob = canonical.encode_snapshot(
        STATES,
        entries,
        max_parallelism=MP,
        key_group_range=low,
        watermarks={0: 99},
        backend="hashmap",
    )
    canonical_handle = with_format(
        storage.write_state(JOB, 3, "counter-0", blob, key_group_range=low), canonical.FORMAT_ID
    )
    legacy = storage.write_state(
        JOB, 3, "counter-1", b"SPKS\x01legacy", key_group_range=KeyGroupRange(4, 7)
    )
    shared_file = tmp_path / JOB / "shared" / "enrich-0-c2-000012.sst"
    shared_file.parent.mkdir(parents=True)
    shared_file.write_bytes(b"sst")
    manifest = storage.write_state(JOB, 3, "enrich-0", b'{"files": {}}', key_group_range=low)
    native = with_format(manifest, "rocksdb-native-v1")
    if "states" in StateHandleModel.model_fields:
        declared = StateDescriptorModel(name="enriched", kind="map", serializer="pickle")
        native = native.model_copy(update={"states": [declared]})
    if "shared" in StateHandleModel.model_fields:
        ref = {"path": shared_file.as_uri(), "size": 3, "checksum": "sha256:00"}
        native = StateHandleModel.model_validate({**native.model_dump(), "shared": [ref]})
    acks = [
        ack("source", 0, []),
        ack("source", 1, [], {"orders#1/2": 1_204_557, "orders#0/2": 88}),
        ack("counter", 1, [legacy]),
        ack("enrich", 0, [native]),
        ack("counter", 0, [canonical_handle]),
    ]
    metadata = {
        "format": "sparkpoint-checkpoint/1",
        "job_id": JOB,
        "checkpoint_id": 3,
        "kind": "savepoint",
        "attempt": 1,
        "is_final": False,
        "trigger_timestamp": COMPLETED_MS - 5,
        "completion_timestamp": COMPLETED_MS,
        "acks": acks,
    }
    url = storage.write_metadata(JOB, 3, metadata)
    return {
        "dir": tmp_path / JOB / "chk-3",
        "url": url,
        "keys": keys,
        "handles": (canonical_handle, legacy, native),
        "shared_file": shared_file,
    }


@pytest.fixture(autouse=True)
def _no_control_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    """These commands run where the files are: a shell with ``make demo``'s exports would
    send ``dispose`` to that control plane (tests/e2e/test_cli_client.py covers that)."""
    monkeypatch.delenv("SPARKPOINT_API_URL", raising=False)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- inspect


def test_inspect_lists_operators_handles_states_and_a_sample(
    savepoint: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["savepoint", "inspect", str(savepoint["dir"]), "--sample", "2"], capsys)

    canonical_handle, legacy, native = savepoint["handles"]
    total = canonical_handle.size + legacy.size + native.size
    first, second = sorted(savepoint["keys"], key=lambda k: (key_group_for(k, MP), k))[:2]
    value = {k: i + 1 for i, k in enumerate(savepoint["keys"])}
    recorded = "format" in StateHandleModel.model_fields
    assert (code, err) == (0, "")
    assert out == "\n".join(
        [
            "savepoint 3 of job orders",
            f"  path: {savepoint['url']}",
            "  metadata sparkpoint-checkpoint/1, attempt 1, completed 2025-11-26 12:00:00 UTC, "
            f"3 state handles, {total} bytes",
            "operator counter, subtask 0: sparkpoint-keyed-state-v1"
            + ("" if recorded else " (no format recorded)")
            + f", key groups [0, 3], {canonical_handle.size} bytes",
            "  file counter-0",
            f"  backend hashmap, max parallelism 8, {len(savepoint['keys']) + 1} entries in "
            f"{len({key_group_for(k, MP) for k in savepoint['keys']})} key groups",
            "  channel watermarks {0: 99}",
            "    state   kind   serializer  entries  bytes",
            f"    count   value  int64             {len(savepoint['keys'])}     "
            f"{sum(len(k) + 1 + 8 for k in savepoint['keys'])}",
            "    events  list   json              1     29",
            f"  sample (2 of {len(savepoint['keys']) + 1}):",
            f"    [key group {key_group_for(first, MP)}] count {first!r} = {value[first]}",
            f"    [key group {key_group_for(second, MP)}] count {second!r} = {value[second]}",
            "operator counter, subtask 1: legacy hashmap snapshot (no format recorded), "
            f"key groups [4, 7], {legacy.size} bytes",
            "  file counter-1",
            "operator enrich, subtask 0: "
            + ("rocksdb-native-v1" if recorded else "unknown (no format recorded)")
            + f", key groups [0, 3], {native.size} bytes",
            "  file enrich-0",
            *(["  shared files referenced: 1"] if recorded else []),
            # A native snapshot's files are not read: what _metadata says of it.
            *(
                [
                    f"  RocksDB's own files, {native.size} bytes in all, not read here (a "
                    "savepoint of the job shows entries)",
                    "    state     kind  serializer",
                    "    enriched  map   pickle",
                ]
                if recorded
                else []
            ),
            # Where the source resumes: a subtask holding positions has no keyed state.
            "operator source, subtask 1: source split orders#0/2 resumes at offset 88",
            "operator source, subtask 1: source split orders#1/2 resumes at offset 1,204,557",
            "operator source, subtask 0: no state",
            "",
        ]
    )


def test_inspect_prints_the_same_as_json(
    savepoint: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["savepoint", "inspect", savepoint["url"], "--output", "json"], capsys)

    assert (code, err) == (0, "")
    data = json.loads(out)
    counter = data["handles"][0]
    keys = savepoint["keys"]
    assert {k: data[k] for k in ("path", "job_id", "checkpoint_id", "kind", "attempt")} == {
        "path": savepoint["url"],
        "job_id": JOB,
        "checkpoint_id": 3,
        "kind": "savepoint",
        "attempt": 1,
    }
    assert [(h["operator_id"], h["subtask"], h["layout"]) for h in data["handles"]] == [
        ("counter", 0, "canonical"),
        ("counter", 1, "legacy-hashmap"),
        ("enrich", 0, "native" if "format" in StateHandleModel.model_fields else "unknown"),
    ]
    assert data["stateless"] == [["source", 0]]
    assert data["source_positions"] == [
        ["source", 1, "orders#0/2", 88],
        ["source", 1, "orders#1/2", 1_204_557],
    ]
    assert counter["location"] == savepoint["handles"][0].path
    assert (counter["key_group_range"], counter["entries"], counter["watermarks"]) == (
        [0, 3],
        len(keys) + 1,
        {"0": 99},
    )
    assert counter["states"] == [
        {
            "name": "count",
            "kind": "value",
            "serializer": "int64",
            "entries": len(keys),
            "bytes": sum(len(k) + 1 + 8 for k in keys),
        },
        {"name": "events", "kind": "list", "serializer": "json", "entries": 1, "bytes": 29},
    ]
    sample = {(e["state"], e["key"]): e["value"] for e in counter["sample"]}
    assert sample == {
        **{("count", repr(k)): repr(i + 1) for i, k in enumerate(keys)},
        ("events", repr(keys[0])): repr(["signup", {"n": 1}]),
    }


def test_a_moved_savepoint_is_read_where_it_is_now(
    savepoint: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Savepoints are relocatable, as Flink's: moved to another directory (nothing left where
    it was written), its files are read where they are now."""
    original = FileSystemCheckpointStorage(str(savepoint["dir"])).base_url
    _, before, _ = run(["savepoint", "inspect", original, "--output", "json"], capsys)
    moved = tmp_path / "backups" / "orders-3"
    moved.parent.mkdir()
    savepoint["dir"].rename(moved)

    code, after, err = run(["savepoint", "inspect", str(moved), "--output", "json"], capsys)

    assert (code, err) == (0, "")
    now = FileSystemCheckpointStorage(str(moved)).base_url
    assert json.loads(after) == json.loads(before.replace(original, now))


def test_long_values_are_cut_to_80_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    info = {"blob": StateInfo("blob", "value", "pickle")}
    blob = canonical.encode_snapshot(
        info,
        [(key_group_for("k", MP), "blob", "k", "x" * 500)],
        max_parallelism=MP,
        key_group_range=KeyGroupRange(0, MP - 1),
        watermarks={},
        backend="rocksdb",
    )
    handle = storage.write_state(JOB, 4, "op-0", blob)
    metadata = {
        "format": "sparkpoint-checkpoint/1",
        "checkpoint_id": 4,
        "acks": [ack("op", 0, [handle])],
    }
    url = storage.write_metadata(JOB, 4, metadata)

    code, out, _ = run(["savepoint", "inspect", url, "--output", "json"], capsys)

    assert code == 0
    (entry,) = json.loads(out)["handles"][0]["sample"]
    assert entry["value"] == "'" + "x" * 76 + "..."
    assert json.loads(out)["kind"] is None


def test_a_corrupt_state_file_is_named_and_refused(
    savepoint: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    state_file = savepoint["dir"] / "counter-0"
    data = bytearray(state_file.read_bytes())
    data[-2] ^= 0xFF
    state_file.write_bytes(bytes(data))

    code, out, err = run(["savepoint", "inspect", str(savepoint["dir"])], capsys)

    assert (code, out) == (2, "")
    assert err.startswith(f"sparkpoint savepoint inspect: state file {state_file.as_uri()} has ")
    assert "(altered)" in err
    assert err.count("\n") == 1


def test_a_directory_without_metadata_is_refused_by_inspect_in_a_subprocess(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sparkpoint.cli", "savepoint", "inspect", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )

    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"sparkpoint savepoint inspect: no checkpoint at {tmp_path}: "
        f"{tmp_path.as_uri()}/_metadata does not exist\n"
    )


# ----------------------------------------------------------------------------- dispose


def test_dispose_deletes_the_savepoint_and_keeps_shared_files(
    savepoint: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    files = sorted(p for p in savepoint["dir"].rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)

    code, out, err = run(["savepoint", "dispose", savepoint["url"]], capsys)

    assert (code, err) == (0, "")
    assert not savepoint["dir"].exists()
    assert savepoint["shared_file"].read_bytes() == b"sst"
    deleted = f"{len(files)} files, {format_size(size)}"
    lines = [f"disposed savepoint 3: deleted {savepoint['url']} ({deleted})"]
    if "shared" in StateHandleModel.model_fields:
        lines.append("kept 1 referenced shared file in the job's shared/")
    assert out == "\n".join(lines) + "\n"


@pytest.mark.parametrize("which", ["job", "shared", "missing"])
def test_dispose_refuses_a_directory_without_metadata(
    savepoint: dict[str, Any], which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job_dir = savepoint["dir"].parent
    target = {"job": job_dir, "shared": job_dir / "shared", "missing": job_dir / "chk-9"}[which]

    code, out, err = run(["savepoint", "dispose", str(target)], capsys)

    assert (code, out) == (2, "")
    assert err.startswith(f"sparkpoint savepoint dispose: refusing to delete {target}: ")
    assert "_metadata does not exist" in err and err.count("\n") == 1
    assert savepoint["dir"].is_dir() and savepoint["shared_file"].is_file()


def test_dispose_refuses_unreadable_metadata_and_a_job_directory(
    savepoint: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    job_dir = savepoint["dir"].parent
    (job_dir / "_metadata").write_text('{"format": "sparkpoint-checkpoint/1", "acks": []}')

    code, out, err = run(["savepoint", "dispose", str(job_dir)], capsys)

    assert (code, out) == (2, "")
    assert err == (
        f"sparkpoint savepoint dispose: refusing to delete {job_dir.as_uri()}: it is or holds "
        f"a shared/ directory ({job_dir.name}/shared/enrich-0-c2-000012.sst), a job's shared "
        "state, which no savepoint has\n"
    )
    (savepoint["dir"] / "_metadata").write_text("not json")

    code, out, err = run(["savepoint", "dispose", str(savepoint["dir"])], capsys)

    assert code == 2
    assert err.startswith(f"sparkpoint savepoint dispose: refusing to delete {savepoint['dir']}: ")
    assert "_metadata is not valid JSON" in err
    assert savepoint["dir"].is_dir() and savepoint["shared_file"].is_file()


# ----------------------------------------------------------------------------- wiring


def test_savepoint_of_a_job_still_triggers_one(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def client_command(ns: Any) -> int:
        seen.append(ns)
        return 0

    monkeypatch.setattr(cli, "_client_command", client_command)

    assert cli.main(["savepoint", "orders", "/tmp/sp"]) == 0
    assert cli.main(["savepoint", "--", "inspect", "/tmp/sp"]) == 0

    assert [(ns.command, ns.job_id, ns.target_directory) for ns in seen] == [
        ("savepoint", "orders", "/tmp/sp"),
        ("savepoint", "inspect", "/tmp/sp"),
    ]


def test_inspect_reads_a_hashmap_checkpoint_in_its_columns_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = HashMapKeyedStateBackend(MP, KeyGroupRange(0, MP - 1))
    count = backend.get_state(ValueStateDescriptor("count", 0, serializer="int64"))
    for i, key in enumerate(["alice", "bob", "carol"]):
        backend.set_current_key(key)
        count.update(i + 1)
    backend.channel_watermarks = {0: 7}
    blob = snapshot_blob(backend, native=True)
    storage = FileSystemCheckpointStorage(str(tmp_path))
    handle = with_format(
        storage.write_state(JOB, 3, "counter-0", blob, key_group_range=KeyGroupRange(0, MP - 1)),
        changelog_delta.FORMAT_ID,
    )
    metadata = {
        "format": "sparkpoint-checkpoint/1",
        "job_id": JOB,
        "checkpoint_id": 3,
        "kind": "checkpoint",
        "attempt": 1,
        "is_final": False,
        "trigger_timestamp": COMPLETED_MS - 5,
        "completion_timestamp": COMPLETED_MS,
        "acks": [ack("counter", 0, [handle])],
    }
    storage.write_metadata(JOB, 3, metadata)

    code, out, err = run(["savepoint", "inspect", str(tmp_path / JOB / "chk-3")], capsys)

    assert (code, err) == (0, "")
    assert f"operator counter, subtask 0: hashmap-columns-v1, key groups [0, {MP - 1}]" in out
    assert "  backend hashmap, max parallelism 8, 3 entries\n" in out
    assert "  channel watermarks {0: 7}" in out
    assert "    count  value  int64             3     37" in out  # keys of 13 chars, 3 x 8 bytes
    assert f"    [key group {key_group_for('alice', MP)}] count 'alice' = 1" in out
    assert f"    [key group {key_group_for('carol', MP)}] count 'carol' = 3" in out
