"""Restoring checkpoints: from its path in a new driver, rescaled, inline, and corrupt."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.errors import ConfigurationError
from sparkpoint.events import InMemoryEventSink
from sparkpoint.protocol import JobRestored, JobStatus, SnapshotCompleted, TaskFailed
from sparkpoint.runtime.driver import JobFailedError
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range
from sparkpoint.testing import FailureInjection, line_counts

from .pv_harness import (
    completed_checkpoint_dirs,
    expected_every_lines,
    hidden_files,
    run_pv,
    true_counts,
)

pytestmark = pytest.mark.spark


def test_final_checkpoint_state_restores_to_the_true_counts_at_any_parallelism(
    spark: Any, tmp_path: Path
) -> None:
    result, _ = run_pv(spark, tmp_path, "final")
    final = completed_checkpoint_dirs(tmp_path, "final")[-1]
    assert int(final.name.split("-")[1]) == result.completed_checkpoints[-1]
    meta = json.loads((final / "_metadata").read_text())
    acks = [SnapshotCompleted.model_validate(a) for a in meta["acks"]]
    handles = [h for a in acks if a.operator_id == "pv" for h in a.handles]
    assert len(handles) == 2
    storage = FileSystemCheckpointStorage(f"file://{tmp_path / 'final' / 'chk'}")
    blobs = [storage.read_state(h) for h in handles]
    for parallelism in (1, 2, 3):
        merged: dict[str, int] = {}
        for sub in range(parallelism):
            backend = HashMapKeyedStateBackend.restore(
                blobs, 128, key_group_range(sub, parallelism, 128)
            )
            table = backend.table("count")
            assert not set(table) & set(merged)  # every key on exactly one subtask
            merged.update(table)
        assert merged == true_counts()
    sources = {k: v for a in acks for k, v in a.source_positions.items()}
    assert sources == {"generator-0": 6000, "generator-1": 6000}


@pytest.mark.parametrize("in_memory", [False, True], ids=["own-directory", "in-memory"])
def test_restore_from_checkpoint_path_in_a_new_driver_with_new_parallelism(
    spark: Any, tmp_path: Path, in_memory: bool
) -> None:
    """The second driver reads the checkpoint where it is, also when it keeps its own
    checkpoints in memory (jobmanager storage without a directory, as ``--standalone``
    without ``--checkpoint-dir``)."""
    # Run 1 fails for good (no restart) late in its input, after several checkpoints.
    out = str(tmp_path / "out")
    with pytest.raises(JobFailedError, match="injected failure"):
        run_pv(
            spark,
            tmp_path,
            "first",
            restart="none",
            out=out,
            failure=FailureInjection("source", subtask=1, offset=4500),
        )
    first_lines = sum(line_counts(out).values())
    assert 0 < first_lines < 12_000
    left_by_first = hidden_files(out)
    assert left_by_first  # its open transactions were left behind
    latest = completed_checkpoint_dirs(tmp_path, "first")[-1]
    # Run 2: a new driver, three keyed subtasks, restored from the checkpoint's path.
    result, _ = run_pv(
        spark,
        tmp_path,
        "second",
        out=out,
        parallelism=3,
        storage="jobmanager" if in_memory else "filesystem",
        checkpoint_dir=not in_memory,
        from_checkpoint=f"file://{latest}",
    )
    assert result.status is JobStatus.FINISHED
    assert result.restores == [int(latest.name.split("-")[1])]
    assert line_counts(out) == expected_every_lines()
    # A job aborts only its own parts (another job restored from the same checkpoint may still
    # be running): the first job's uncommitted parts stay hidden, the second left none.
    assert set(hidden_files(out)) <= set(left_by_first)


@pytest.mark.parametrize(
    ("backend", "metadata_dir"),
    [("hashmap", True), ("rocksdb", False)],
    ids=["hashmap-metadata-in-a-directory", "rocksdb-in-memory"],
)
def test_inline_jobmanager_storage_is_exactly_once(
    spark: Any, tmp_path: Path, backend: str, metadata_dir: bool
) -> None:
    """State inline in the metadata, written to a directory or kept in memory. RocksDB's
    checkpoints are then canonical snapshots, as its native files need a filesystem (Flink's
    RocksDB full snapshots into the JobManager)."""
    result, out = run_pv(
        spark,
        tmp_path,
        "inline",
        storage="jobmanager",
        checkpoint_dir=metadata_dir,
        backend=(backend, False),
        failure=FailureInjection("keyed", subtask=0, records=100, at_epoch=2),
    )
    assert result.restores and result.restores[0] is not None
    assert line_counts(out) == expected_every_lines()


def test_state_above_the_inline_limit_declines_with_the_reason(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(JobFailedError, match="tolerable failure threshold"):
        run_pv(spark, tmp_path, "big", storage="jobmanager", max_inline=64, restart="none")
    _, out = tmp_path / "big", str(tmp_path / "big" / "out")
    assert line_counts(out) == {}  # nothing committed: no checkpoint ever completed


def test_corrupt_snapshot_is_refused_naming_the_file(spark: Any, tmp_path: Path) -> None:
    _, out = run_pv(spark, tmp_path, "good")
    latest = completed_checkpoint_dirs(tmp_path, "good")[-1]
    (victim,) = latest.glob("pv-1-a1-t*")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(JobFailedError) as err:
        run_pv(
            spark, tmp_path, "restored", restart="none", out=out, from_checkpoint=f"file://{latest}"
        )
    message = str(err.value)
    assert "CorruptSnapshotError" in message
    assert urlparse(f"file://{victim}").path in message or os.fspath(victim) in message


def test_a_checkpoint_that_does_not_fit_the_job_is_refused_before_spark_runs(
    spark: Any, tmp_path: Path
) -> None:
    _, src_out = run_pv(spark, tmp_path, "src")
    latest = completed_checkpoint_dirs(tmp_path, "src")[-1]
    with pytest.raises(ConfigurationError, match=r"positions of source splits \['generator-0'"):
        run_pv(spark, tmp_path, "three", splits=3, from_checkpoint=f"file://{latest}")
    # Key groups are the key's hash modulo the max parallelism: another one is refused at
    # once, naming the operator and the value to run with (it failed every restore in a task).
    meta = json.loads((latest / "_metadata").read_text())
    keyed = [h for a in meta["acks"] if a["operator_id"] == "pv" for h in a["handles"]]
    assert [h["max_parallelism"] for h in keyed] == [128, 128]
    with pytest.raises(
        ConfigurationError,
        match=r"keyed state of pv with max parallelism 128, and this job's is 64: every key "
        r"would change key group. Run with --max-parallelism 128",
    ):
        run_pv(spark, tmp_path, "max64", max_parallelism=64, from_checkpoint=f"file://{latest}")
    # A checkpoint whose handles do not record it (written before they did) is refused by the
    # keyed task: a restart would meet the same refusal, so the job fails without one (Flink's
    # SuppressRestartsException), whatever restarts its strategy allows.
    for handle in keyed:
        del handle["max_parallelism"]
    (latest / "_metadata").write_text(json.dumps(meta))
    events = InMemoryEventSink()
    with pytest.raises(
        JobFailedError,
        match=r"ConfigurationError: snapshot \d was taken with max_parallelism 128; it cannot "
        r"be restored with max_parallelism 64.*\(a configuration error, which every restart "
        r"would meet again: the job fails\)",
    ):
        run_pv(
            spark,
            tmp_path,
            "unrecorded",
            max_parallelism=64,
            from_checkpoint=f"file://{latest}",
            event_sink=events,
        )
    decoded = [e.decoded() for e in events.events]
    [failed] = [ev for ev in decoded if isinstance(ev, TaskFailed)]
    assert (failed.operator_id, failed.recoverable) == ("pv", False)
    assert not [ev for ev in decoded[decoded.index(failed) :] if isinstance(ev, JobRestored)]
    for ack in meta["acks"]:
        ack["operator_id"] = ack["operator_id"].replace("pv", "views")
    (latest / "_metadata").write_text(json.dumps(meta))
    with pytest.raises(ConfigurationError, match=r"state of operators \['views'\]"):
        run_pv(spark, tmp_path, "renamed", from_checkpoint=f"file://{latest}")
    # Flink's --allowNonRestoredState: the state of 'views' is dropped, the rest restored.
    result, _ = run_pv(
        spark,
        tmp_path,
        "dropped",
        out=src_out,
        from_checkpoint=f"file://{latest}",
        allow_non_restored_state=True,
    )
    assert result.status is JobStatus.FINISHED
    assert result.restores == [int(latest.name.split("-")[1])]
    # The sources restored at their end: nothing more to read, nothing written twice.
    assert line_counts(src_out) == expected_every_lines()
