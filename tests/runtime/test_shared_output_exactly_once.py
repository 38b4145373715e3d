"""Two PV jobs into one output directory, same sink uid: one's restore loses none of the other's.

Job ids share their first 8 characters. Job B fails mid-run and restores while job A holds
pre-committed and open parts: A stopped (its driver failed after checkpoint 3 completed,
before the sink committed it; then it restarts from checkpoint 3 as its supervisor would), or
A runs at the same time (held before it commits checkpoint 2 until B finished). Both outputs
must be exact: the directory holds every line twice.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.connectors.sinks import job_tag
from sparkpoint.protocol import JobStatus, SnapshotCompleted
from sparkpoint.runtime.driver import JobFailedError
from sparkpoint.runtime.execution import JobExecution
from sparkpoint.testing import FailureInjection, line_counts

from .pv_harness import expected_every_lines, hidden_files, run_pv

pytestmark = pytest.mark.spark
B_FAILURE = FailureInjection("keyed", subtask=1, records=200, at_epoch=3)


def _fails_before_committing_3(spark: Any, base: Path, name: str, out: str) -> None:
    """Job ``name`` fails for good after checkpoint 3 completed, before its sink commit."""
    with pytest.raises(JobFailedError, match="injected failure"):
        run_pv(
            spark,
            base,
            name,
            out=out,
            restart="none",
            failure=FailureInjection("before_commit", checkpoint_id=3),
        )


def test_a_restore_of_one_job_keeps_the_pre_committed_output_of_another(
    spark: Any, tmp_path: Path
) -> None:
    out = str(tmp_path / "shared-out")
    _fails_before_committing_3(spark, tmp_path, "shared-a", out)
    left_by_a = hidden_files(out)
    assert left_by_a  # checkpoint 3's pre-committed parts and the open transactions' parts
    assert all(job_tag("pv-shared-a") in name for name in left_by_a)
    # Job B: same uid, same directory; fails mid-run, restores, finishes.
    b, _ = run_pv(spark, tmp_path, "shared-b", out=out, failure=B_FAILURE)
    assert b.status is JobStatus.FINISHED
    assert len(b.restores) == 1 and b.restores[0] is not None
    assert hidden_files(out) == left_by_a  # B's restore aborted its own parts only
    # Job A restarts from its checkpoint 3: commits it, goes on to the end.
    chk3 = tmp_path / "shared-a" / "chk" / "pv-shared-a" / "chk-3"
    a, _ = run_pv(spark, tmp_path, "shared-a", out=out, from_checkpoint=f"file://{chk3}")
    assert (a.status, a.restores) == (JobStatus.FINISHED, [3])
    expected = expected_every_lines()
    assert line_counts(out) == expected + expected
    assert hidden_files(out) == []


def test_a_job_running_beside_one_that_restores_commits_its_output_exactly(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(tmp_path / "live-out")
    a_holds, b_done = threading.Event(), threading.Event()
    commit = JobExecution.commit

    def commit_once_b_is_done(
        job: JobExecution, checkpoint_id: int, acks: list[SnapshotCompleted]
    ) -> None:
        if job.job_id == "pv-live-a" and checkpoint_id == 2:
            a_holds.set()
            b_done.wait()
        commit(job, checkpoint_id, acks)

    monkeypatch.setattr(JobExecution, "commit", commit_once_b_is_done)
    with ThreadPoolExecutor(max_workers=1) as pool:
        running_a = pool.submit(run_pv, spark, tmp_path, "live-a", out=out)
        try:
            assert a_holds.wait(timeout=600), running_a.exception(timeout=0)
            left_by_a = hidden_files(out)
            b, _ = run_pv(spark, tmp_path, "live-b", out=out, failure=B_FAILURE)
            assert len(b.restores) == 1 and b.restores[0] is not None
            assert set(left_by_a) <= set(hidden_files(out))  # B's restore aborted its own
        finally:
            b_done.set()
        a, _ = running_a.result(timeout=600)
    assert (a.status, a.restores) == (JobStatus.FINISHED, [])
    expected = expected_every_lines()
    assert line_counts(out) == expected + expected
    assert hidden_files(out) == []


def test_a_job_started_from_another_jobs_checkpoint_into_its_own_output_commits_it_there(
    spark: Any, tmp_path: Path
) -> None:
    """A fork into another directory: the restored checkpoint's pre-committed transactions
    are job A's, written into A's output; B commits them there (as Flink's file sink commits
    the pending files its committables name), and writes what follows into its own. Before,
    B looked for A's parts in its own directory and failed every restore."""
    out_a, out_b = str(tmp_path / "out-a"), str(tmp_path / "out-b")
    _fails_before_committing_3(spark, tmp_path, "fork-a", out_a)
    pre_committed = hidden_files(out_a)
    assert pre_committed  # checkpoint 3's parts, and the open transactions' parts
    chk3 = tmp_path / "fork-a" / "chk" / "pv-fork-a" / "chk-3"
    b, _ = run_pv(
        spark, tmp_path, "fork-b", out=out_b, from_checkpoint=f"file://{chk3}", failure=B_FAILURE
    )
    assert b.status is JobStatus.FINISHED
    # Its failure came before a checkpoint of its own: it restored A's checkpoint 3 again.
    assert (b.attempt, b.restores) == (2, [3])
    # A's output up to checkpoint 3 and B's after it: one failure-free run's lines.
    assert line_counts(out_a) + line_counts(out_b) == expected_every_lines()
    assert set(hidden_files(out_a)) < set(pre_committed)  # checkpoint 3's parts went public
    assert hidden_files(out_b) == []
