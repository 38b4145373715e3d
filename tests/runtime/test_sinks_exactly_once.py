"""Exactly-once with several sinks on Spark: the two-stage job writes stage 1's output to one
sink and stage 2's to two (a stream that sinks twice). Each sink commits its own
transactions; failed mid-epoch and while aligning at the second stage, and after the first
stage's sink pre-committed, every sink's committed output equals a failure-free run's and a
plain-Python oracle's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.protocol import JobStatus
from sparkpoint.testing import FailureInjection, line_counts

from .keyed_stages_job import (
    EVENTS,
    events,
    oracle,
    restored_before_failure,
    run_stages,
    users_oracle,
)
from .pv_harness import hidden_files

pytestmark = pytest.mark.spark


def _outputs(out: str) -> dict[str, Counter[str]]:
    more = Path(out).parent / "more"
    outputs = {"sink": out, "users-sink": str(more / "users"), "copy-sink": str(more / "copy")}
    for path in outputs.values():
        assert hidden_files(path) == []  # nothing uncommitted left behind
    return {uid: line_counts(path) for uid, path in outputs.items()}


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Counter[str]]:
    base = tmp_path_factory.mktemp("sinks")
    result, out = run_stages(spark, base, "baseline", more_sinks=True)
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    assert result.events is not None
    # Every transaction names its sink; each vertex pre-commits one per sink it carries.
    named: dict[str, set[str]] = {}
    for env in result.events.events:
        if env.type == "snapshot_completed":
            for txn in env.payload["sink_transactions"]:
                named.setdefault(env.payload["operator_id"], set()).add(txn["sink"])
    assert named == {"per-user": {"users-sink"}, "per-region": {"sink", "copy-sink"}}
    return _outputs(out)


def test_failure_free_run_commits_every_sink_as_the_oracle_says(
    baseline: dict[str, Counter[str]],
) -> None:
    records = events(EVENTS)
    assert baseline["sink"] == baseline["copy-sink"] == oracle(records)
    assert baseline["users-sink"] == users_oracle(records)


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            FailureInjection("keyed", subtask=1, records=60, at_epoch=3, vertex="per-region"),
            id="mid-epoch-second-stage",
        ),
        pytest.param(
            FailureInjection("alignment", subtask=0, checkpoint_id=3, vertex="per-region"),
            id="during-alignment-second-stage",
        ),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=0, checkpoint_id=2, vertex="per-user"),
            id="after-pre-commit-first-stage-sink",
        ),
    ],
)
def test_every_sink_is_exactly_once_after_a_failure(
    engine: Any, tmp_path: Path, baseline: dict[str, Counter[str]], failure: FailureInjection
) -> None:
    result, out = run_stages(engine, tmp_path, "failed", failure, more_sinks=True)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2
    restored = restored_before_failure(result)
    assert restored is not None
    if failure.checkpoint_id:
        assert restored == failure.checkpoint_id - 1
    assert result.restores == [restored]
    assert _outputs(out) == baseline
