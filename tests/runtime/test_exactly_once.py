"""Exactly-once, proven: fail the PV job at several points, let it restore, compare output.

Every run's committed output (as a multiset of lines) must equal the failure-free run's, and
both must equal what the source implies (pv 1..n for an app with n events), with every state
backend: hashmap, rocksdb with full and with incremental checkpoints. At-least-once mode with
the same failure must show duplicates.

Each failure point runs on Spark once (hashmap) and, for every backend, in this process
(:class:`~sparkpoint.runtime.local.LocalEpochRunner`: the same tasks without Spark, in
milliseconds); the tests of working state that moves between Python workers stay on Spark.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.protocol import JobStatus
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection, line_counts

from .pv_harness import (
    BACKENDS,
    EVENTS,
    IN_PROCESS,
    expected_every_lines,
    hidden_files,
    latest_pv,
    run_pv,
    true_counts,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    result, out = run_pv(spark, tmp_path_factory.mktemp("baseline"), "baseline")
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    assert len(result.completed_checkpoints) >= 5
    assert hidden_files(out) == []
    return line_counts(out)


def test_failure_free_run_commits_exactly_the_source(baseline: Counter[str]) -> None:
    assert baseline == expected_every_lines()
    assert sum(baseline.values()) == EVENTS


def latest_completed_before_failure(result: JobResult) -> int | None:
    """The id of the last checkpoint that completed before the first task failure."""
    assert result.events is not None
    latest = None
    for env in result.events.events:
        if env.type == "checkpoint_completed":
            latest = env.payload["checkpoint_id"]
        if env.type == "task_failed":
            return latest
    raise AssertionError("the job never failed")


@pytest.mark.parametrize(
    ("failure", "restores_a_checkpoint"),
    [
        pytest.param(
            FailureInjection("source", subtask=0, offset=300), False, id="before-first-checkpoint"
        ),
        pytest.param(
            FailureInjection("keyed", subtask=1, records=200, at_epoch=3), True, id="mid-epoch"
        ),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=0, checkpoint_id=3),
            True,
            id="after-pre-commit-before-commit",
        ),
        pytest.param(
            FailureInjection("before_commit", checkpoint_id=3),
            True,
            id="checkpoint-completed-before-sink-commit",
        ),
        pytest.param(
            FailureInjection("alignment", subtask=1, checkpoint_id=2), True, id="during-alignment"
        ),
    ],
)
@pytest.mark.parametrize(
    ("backend", "on_spark"),
    [
        pytest.param(("hashmap", False), True, id="hashmap-spark"),
        pytest.param(("hashmap", False), False, id="hashmap-in-process"),
        pytest.param(("rocksdb", False), False, id="rocksdb-full-in-process"),
        pytest.param(("rocksdb", True), False, id="rocksdb-incremental-in-process"),
    ],
)
def test_exactly_once_after_failure(
    spark: Any,
    tmp_path: Path,
    baseline: Counter[str],
    failure: FailureInjection,
    restores_a_checkpoint: bool,
    backend: tuple[str, bool],
    on_spark: bool,
) -> None:
    engine = spark if on_spark else IN_PROCESS
    result, out = run_pv(engine, tmp_path, "failed", failure=failure, backend=backend)
    assert result.status is JobStatus.FINISHED
    restored = latest_completed_before_failure(result)
    assert (restored is not None) is restores_a_checkpoint
    if failure.where == "before_commit":
        assert restored == failure.checkpoint_id  # completed, then re-committed on restore
    elif failure.checkpoint_id:
        assert restored == failure.checkpoint_id - 1  # that checkpoint never completed
    assert result.restores == [restored]
    assert result.attempt == 2
    assert line_counts(out) == baseline
    assert hidden_files(out) == []


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(FailureInjection("keyed", subtask=1, records=700, at_epoch=3), id="keyed"),
        pytest.param(FailureInjection("alignment", subtask=0, checkpoint_id=3), id="alignment"),
    ],
)
def test_exactly_once_when_alignment_buffers_spill_to_disk(
    tmp_path: Path,
    baseline: Counter[str],
    failure: FailureInjection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--alignment-buffer 0: everything a subtask holds back while aligning goes through its
    spill file, and the output after a failure and a restore is still the baseline's."""
    with caplog.at_level(logging.WARNING, logger="sparkpoint.runtime.tasks"):
        result, out = run_pv(IN_PROCESS, tmp_path, "spilled", failure=failure, alignment_buffer=0)
    assert result.status is JobStatus.FINISHED and result.attempt == 2
    assert "spilled to local disk past --alignment-buffer 0" in caplog.text
    assert line_counts(out) == baseline
    assert hidden_files(out) == []


def test_at_least_once_mode_duplicates_after_the_same_failure(
    spark: Any, tmp_path: Path, baseline: Counter[str]
) -> None:
    failure = FailureInjection("keyed", subtask=1, records=200, at_epoch=3)
    result, out = run_pv(spark, tmp_path, "alo", mode="at_least_once", failure=failure)
    assert result.restores == [latest_completed_before_failure(result)]
    assert result.restores[0] is not None
    lines = line_counts(out)
    assert lines != baseline
    assert sum(lines.values()) > EVENTS  # replayed records were counted twice
    final_pv = {}
    for line in lines:
        app = line.split('"')[3]
        final_pv[app] = max(final_pv.get(app, 0), int(line.rsplit(" ", 1)[1].rstrip("}")))
    truth = true_counts()
    assert any(final_pv[a] > truth[a] for a in truth)


def test_at_least_once_mode_without_failure_is_exact(
    spark: Any, tmp_path: Path, baseline: Counter[str]
) -> None:
    result, out = run_pv(spark, tmp_path, "alo-ok", mode="at_least_once")
    assert result.restores == []
    assert line_counts(out) == baseline


@pytest.mark.parametrize("backend", BACKENDS)
def test_subtasks_that_move_between_workers_read_the_durable_working_state(
    spark: Any, tmp_path: Path, baseline: Counter[str], backend: tuple[str, bool]
) -> None:
    """Every Python worker acts as its own executor: the local copy of the last epoch's state
    is almost never where the next epoch's task runs, so the durable copy must be read."""
    failure = FailureInjection("keyed", subtask=0, records=300, at_epoch=4)
    result, out = run_pv(
        spark, tmp_path, "moving", isolate_workers=True, failure=failure, backend=backend
    )
    assert result.restores == [latest_completed_before_failure(result)]  # only the injected one
    assert line_counts(out) == baseline
    chk = tmp_path / "moving" / "chk" / "pv-moving"
    assert not (chk / "working").exists()  # durable copies are removed once the job finished


def test_without_periodic_checkpoints_the_final_checkpoint_commits_everything(
    spark: Any, tmp_path: Path, baseline: Counter[str]
) -> None:
    result, out = run_pv(spark, tmp_path, "final-only", interval_ms=0)
    assert result.completed_checkpoints == [1]
    assert line_counts(out) == baseline


@pytest.mark.parametrize("backend", BACKENDS)
def test_emit_epoch_with_thousands_of_keys_counts_every_key_once_after_a_failure(
    tmp_path: Path, backend: tuple[str, bool]
) -> None:
    """Thousands of str keys per flush: grouped by hash where their dictionaries are,
    counted in numpy columns (hashmap) or read and written in key order (rocksdb). After a
    mid-epoch failure and a restore, every key ends at its true count and no count of a key
    is committed twice (a replay committed again would repeat one): the same final counts as
    a run that never failed. Where the flushes fall follows the barriers, so the lines in
    between may differ from that run's."""
    events, apps = 60_000, 30_000
    many: dict[str, Any] = {
        "emit": "epoch",
        "backend": backend,
        "events": events,
        "apps": apps,
        "epoch_records": 10_000,
    }
    clean, clean_out = run_pv(IN_PROCESS, tmp_path, "clean", **many)
    failure = FailureInjection("keyed", subtask=0, records=4000, at_epoch=2)
    result, out = run_pv(IN_PROCESS, tmp_path, "failed", failure=failure, **many)
    assert clean.restores == [] and len(result.restores) == 1
    lines, clean_lines = line_counts(out), line_counts(clean_out)
    assert set(lines.values()) == {1}
    assert latest_pv(lines) == latest_pv(clean_lines) == true_counts(events, apps)
    assert len(true_counts(events, apps)) > 10_000


def test_emit_epoch_ends_with_the_true_count_of_every_app_after_a_failure(
    spark: Any, tmp_path: Path
) -> None:
    failure = FailureInjection("keyed", subtask=0, records=150, at_epoch=2)
    result, out = run_pv(spark, tmp_path, "epoch-emit", emit="epoch", failure=failure)
    assert len(result.restores) == 1
    lines = line_counts(out)
    assert latest_pv(lines) == true_counts()
    assert len(lines) < EVENTS // 10  # a line per key and epoch, not per event
