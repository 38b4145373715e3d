"""Exactly-once for a union of two sources on Spark: events (2 splits) and clicks (3 splits,
ending halfway through the job) united, counted per user, re-keyed by region, counted per
region. Failed mid-epoch and while aligning at the second stage, and after the sink
pre-committed, the committed output equals a failure-free run's and a plain-Python oracle's;
checkpoints hold the positions of every split of both sources."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.protocol import JobStatus
from sparkpoint.testing import FailureInjection, line_counts

from .keyed_stages_job import EVENTS, clicks, events, oracle, restored_before_failure, run_stages
from .pv_harness import hidden_files

pytestmark = pytest.mark.spark

CLICKS = 4_500  # 1,500 per split: read in the first 3 of 6 epochs
SPLITS = {f"events/list-{i}" for i in range(2)} | {f"clicks/list-{i}" for i in range(3)}


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    base = tmp_path_factory.mktemp("union")
    result, out = run_stages(spark, base, "baseline", clicks=clicks(CLICKS))
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    assert len(result.completed_checkpoints) >= 5
    assert result.records == EVENTS + CLICKS
    assert result.events is not None
    acks = [e.payload for e in result.events.events if e.type == "snapshot_completed"]
    last = max(result.completed_checkpoints)
    positions = {
        k: v for a in acks if a["checkpoint_id"] == last for k, v in a["source_positions"].items()
    }
    assert positions == {s: 1_500 if s.startswith("clicks") else 3_000 for s in SPLITS}
    assert hidden_files(out) == []
    return line_counts(out)


def test_failure_free_union_commits_what_the_oracle_computes(baseline: Counter[str]) -> None:
    assert baseline == oracle(events(EVENTS) + clicks(CLICKS))


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            FailureInjection("keyed", subtask=0, records=40, at_epoch=2, vertex="per-region"),
            id="mid-epoch-second-stage",
        ),
        pytest.param(
            FailureInjection("alignment", subtask=1, checkpoint_id=2, vertex="per-region"),
            id="during-alignment-second-stage",
        ),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=1, checkpoint_id=2),
            id="after-pre-commit",
        ),
    ],
)
def test_exactly_once_for_a_union_after_a_failure(
    engine: Any, tmp_path: Path, baseline: Counter[str], failure: FailureInjection
) -> None:
    result, out = run_stages(engine, tmp_path, "failed", failure, clicks=clicks(CLICKS))
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2
    restored = restored_before_failure(result)
    assert restored is not None
    if failure.checkpoint_id:
        assert restored == failure.checkpoint_id - 1
    assert result.restores == [restored]
    assert line_counts(out) == baseline
    assert hidden_files(out) == []
