"""Region failover on Spark: a failure in one of two independent pipelines restarts only that
one. The failure crosses from a Python worker to the driver as Spark's error text, which must
still name the failed subtask; the other pipeline's tasks of the failed epoch ran in parallel
and wrote parts that nothing commits (they are aborted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkpoint.protocol import JobStatus
from sparkpoint.testing import FailureInjection, line_counts

from .keyed_stages_job import restored_before_failure
from .pv_harness import hidden_files
from .two_pipelines_job import A_RECORDS, B_RECORDS, committed_attempts, oracle, run_two_pipelines

pytestmark = pytest.mark.spark


def test_region_failover_on_spark_restarts_only_the_failed_pipeline(
    spark: Any, tmp_path: Path
) -> None:
    failure = FailureInjection("keyed", subtask=1, records=60, at_epoch=2, vertex="a-count")
    result, out_a, out_b = run_two_pipelines(spark, tmp_path, "spark", failure)
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    assert result.region_restores == [("a-events", restored_before_failure(result))]
    assert result.events is not None
    [failed] = [e.payload for e in result.events.events if e.type == "task_failed"]
    assert (failed["operator_id"], failed["subtask"]) == ("a-count", 1)
    assert failed["region_vertices"] == ["a-events", "a-count"]
    assert line_counts(out_a) == oracle(A_RECORDS)
    assert line_counts(out_b) == oracle(B_RECORDS)
    assert committed_attempts(out_b) == {1}
    assert hidden_files(out_a) == [] and hidden_files(out_b) == []
