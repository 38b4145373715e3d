"""The state backends on Spark: incremental checkpoints, and restores across backends.

A job's checkpoints restore into either backend at any parallelism: a hashmap checkpoint
(the tables' columns, its own format) into rocksdb, a rocksdb incremental checkpoint (native
files, shared between checkpoints) into hashmap. The committed output of the three runs
chained by those restores equals that of a run that never failed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.protocol import JobStatus, SnapshotCompleted
from sparkpoint.runtime.driver import JobFailedError
from sparkpoint.testing import FailureInjection, line_counts

from .pv_harness import completed_checkpoint_dirs, expected_every_lines, run_pv

pytestmark = pytest.mark.spark


def _latest(base: Path, job: str) -> Path:
    return completed_checkpoint_dirs(base, job)[-1]


def _pv_acks(chk: Path) -> list[SnapshotCompleted]:
    meta = json.loads((chk / "_metadata").read_text())
    acks = [SnapshotCompleted.model_validate(a) for a in meta["acks"]]
    return [a for a in acks if a.operator_id == "pv"]


def test_restore_across_backends_and_parallelism_commits_exactly_the_source(
    spark: Any, tmp_path: Path
) -> None:
    out = str(tmp_path / "out")
    # Run 1: hashmap at parallelism 2, fails for good a third of the way in.
    with pytest.raises(JobFailedError, match="injected failure"):
        run_pv(
            spark,
            tmp_path,
            "heap",
            out=out,
            restart="none",
            failure=FailureInjection("source", subtask=0, offset=2500),
        )
    heap = _latest(tmp_path, "heap")
    assert {h.format for a in _pv_acks(heap) for h in a.handles} == {"hashmap-columns-v1"}
    # Run 2: rocksdb, incremental, at parallelism 3, from that checkpoint; fails again later
    # (its first attempt is 2: attempts continue from the restored checkpoint's).
    with pytest.raises(JobFailedError, match="injected failure"):
        run_pv(
            spark,
            tmp_path,
            "rocks",
            out=out,
            parallelism=3,
            backend=("rocksdb", True),
            restart="none",
            from_checkpoint=f"file://{heap}",
            failure=FailureInjection("source", subtask=1, offset=4800, attempt=2),
        )
    rocks = _latest(tmp_path, "rocks")
    assert int(rocks.name.split("-")[1]) > int(heap.name.split("-")[1])
    handles = [h for a in _pv_acks(rocks) for h in a.handles]
    assert len(handles) == 3 and {h.format for h in handles} == {"rocksdb-native-v1"}
    # Run 3: hashmap at parallelism 1 from the rocksdb checkpoint, to the end.
    result, _ = run_pv(
        spark, tmp_path, "back", out=out, parallelism=1, from_checkpoint=f"file://{rocks}"
    )
    assert result.status is JobStatus.FINISHED
    assert line_counts(out) == expected_every_lines()


def test_incremental_checkpoints_reference_earlier_files_and_keep_only_needed_ones(
    spark: Any, tmp_path: Path
) -> None:
    result, out = run_pv(spark, tmp_path, "inc", backend=("rocksdb", True), retained=100)
    assert result.status is JobStatus.FINISHED
    assert line_counts(out) == expected_every_lines()
    root = tmp_path / "inc" / "chk" / "pv-inc"
    retained = completed_checkpoint_dirs(tmp_path, "inc")
    assert len(retained) == len(result.completed_checkpoints) >= 5
    files = [{f.path for a in _pv_acks(d) for h in a.handles for f in h.shared} for d in retained]
    assert all(files)
    # RocksDB compacts its few small files every other epoch or so here (every key of the PV
    # job changes every epoch); between compactions a checkpoint references files that an
    # earlier one uploaded (their names carry the uploader's id), and its checkpointed size
    # is below its full size.
    reusing = [
        i
        for i, d in enumerate(retained)
        if any(_uploader(path) < int(d.name.split("-")[1]) for path in files[i])
    ]
    assert reusing
    for i in reusing:
        acks = _pv_acks(retained[i])
        assert sum(a.checkpointed_size for a in acks) < sum(a.state_size for a in acks)
    # Every shared file on disk is one a retained checkpoint references, and all of those exist.
    on_disk = {f"file://{p}" for p in (root / "shared").iterdir()}
    assert on_disk == set().union(*files)


def _uploader(path: str) -> int:
    """The id of the checkpoint that uploaded a shared file (``<name>-c<id>-<file>``)."""
    return int(re.search(r"-c(\d+)-[^/]*$", path).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "backend", [("hashmap", False), ("rocksdb", True)], ids=["hashmap", "rocksdb"]
)
def test_a_standalone_job_ends_with_a_canonical_savepoint_that_restores(
    spark: Any, tmp_path: Path, backend: tuple[str, bool]
) -> None:
    target = tmp_path / "savepoints"
    result, out = run_pv(
        spark, tmp_path, "sp", backend=backend, savepoint_on_finish=f"file://{target}"
    )
    assert result.status is JobStatus.FINISHED
    assert line_counts(out) == expected_every_lines()
    (savepoint,) = target.iterdir()
    assert savepoint.name == f"savepoint-pv-sp-{result.completed_checkpoints[-1]}"
    acks = _pv_acks(savepoint)
    assert {h.format for a in acks for h in a.handles} == {"sparkpoint-keyed-state-v1"}
    assert all(not h.shared for a in acks for h in a.handles)  # self-contained
    # The states' names, kinds and serializers are in _metadata, beside each handle.
    assert {(d.name, d.kind, d.serializer) for a in acks for h in a.handles for d in h.states} == {
        ("count", "value", "int64")
    }
    chk = tmp_path / "sp" / "chk" / "pv-sp" / f"chk-{result.completed_checkpoints[-1]}"
    assert not chk.exists()  # copied, then dropped from checkpoint storage
    # Moved elsewhere (savepoints are relocatable), the savepoint restores into the other
    # backend at another parallelism (the sources are at their end: nothing is written twice).
    moved = tmp_path / "backups" / savepoint.name
    moved.parent.mkdir()
    savepoint.rename(moved)
    other = ("hashmap", False) if backend[0] == "rocksdb" else ("rocksdb", False)
    again, _ = run_pv(
        spark,
        tmp_path,
        "from-sp",
        out=out,
        parallelism=3,
        backend=other,
        from_checkpoint=f"file://{moved}",
    )
    assert again.status is JobStatus.FINISHED
    assert line_counts(out) == expected_every_lines()
