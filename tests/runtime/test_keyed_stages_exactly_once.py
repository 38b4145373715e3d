"""Exactly-once through two chained keyed stages on Spark: count per user, re-key by region,
count per region. Failed mid-epoch at the second stage, while the second stage aligns, and
after the sink pre-committed, the committed output equals a failure-free run's and a
plain-Python oracle's; every checkpoint holds each keyed stage's own state."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.protocol import JobStatus
from sparkpoint.runtime.driver import JobResult
from sparkpoint.state.key_groups import key_group_for
from sparkpoint.testing import FailureInjection, line_counts

from .keyed_stages_job import EVENTS, REGIONS, events, oracle, restored_before_failure, run_stages
from .pv_harness import hidden_files

pytestmark = pytest.mark.spark


def _acks(result: JobResult) -> list[dict[str, Any]]:
    assert result.events is not None
    return [e.payload for e in result.events.events if e.type == "snapshot_completed"]


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    result, out = run_stages(spark, tmp_path_factory.mktemp("stages"), "baseline")
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    assert len(result.completed_checkpoints) >= 5
    # Each checkpoint: every subtask of both keyed stages acknowledged with its own handles.
    acks = _acks(result)
    for cid in result.completed_checkpoints:
        keyed = {(a["operator_id"], a["subtask"]) for a in acks if a["checkpoint_id"] == cid}
        assert {("per-user", 0), ("per-user", 1), ("per-region", 0), ("per-region", 1)} <= keyed
    assert all(a["handles"] for a in acks if a["operator_id"] != "events")
    assert hidden_files(out) == []
    return line_counts(out)


def test_failure_free_run_commits_what_the_oracle_computes(baseline: Counter[str]) -> None:
    expected = oracle(events(EVENTS))
    assert baseline == expected
    assert {json.loads(line)["region"] for line in baseline} == {f"r{i}" for i in range(REGIONS)}


def test_both_second_stage_subtasks_hold_a_region() -> None:
    """The failures below hit subtask 1 and 0 of the second stage: both have keys."""
    subtasks = {key_group_for(f"r{i}", 128) * 2 // 128 for i in range(REGIONS)}
    assert subtasks == {0, 1}


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            FailureInjection("keyed", subtask=1, records=60, at_epoch=3, vertex="per-region"),
            id="mid-epoch-second-stage",
        ),
        pytest.param(
            FailureInjection("alignment", subtask=1, checkpoint_id=2, vertex="per-region"),
            id="during-alignment-second-stage",
        ),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=0, checkpoint_id=3),
            id="after-pre-commit",
        ),
    ],
)
def test_exactly_once_through_two_keyed_stages_after_a_failure(
    engine: Any, tmp_path: Path, baseline: Counter[str], failure: FailureInjection
) -> None:
    result, out = run_stages(engine, tmp_path, "failed", failure)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2
    restored = restored_before_failure(result)
    assert restored is not None
    if failure.checkpoint_id:
        assert restored == failure.checkpoint_id - 1  # that checkpoint never completed
    assert result.restores == [restored]
    assert result.events is not None
    causes = [e.payload for e in result.events.events if e.type == "task_failed"]
    assert causes and "per-region" in json.dumps(causes[0])
    assert line_counts(out) == baseline
    assert hidden_files(out) == []
