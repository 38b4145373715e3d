"""connect + KeyedCoProcessFunction: the graph, and exactly-once on Spark. Orders and
profiles are connected and keyed by user; failed while the co-process vertex aligns across
its two inputs, mid-epoch and while aligning at the second stage, and after the sink
pre-committed, the committed output equals a failure-free run's and a plain-Python oracle's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.errors import ConfigurationError
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode, JobStatus
from sparkpoint.runtime.driver import JobResult
from sparkpoint.testing import FailureInjection, ListSource, line_counts

from .connect_job import build, oracle
from .keyed_stages_job import restored_before_failure
from .pv_harness import drive, hidden_files

ORDERS = 6_000  # 2,000 per split; profiles: 1,000 per split
EPOCH_RECORDS = 500


def test_connect_makes_one_keyed_vertex_of_two_inputs(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment(JobOptions(job_id="c", parallelism=2))
    build(env, 30, str(tmp_path))
    graph = env.graph
    assert graph.edges() == [("orders", "enrich"), ("profiles", "enrich"), ("enrich", "per-region")]
    enrich = graph.keyed_vertices[0]
    assert enrich.operator.selector_for(0) == "user"
    assert enrich.operator.selector_for(1) == "id"
    assert graph.channels(enrich) == 5
    a = env.from_source(ListSource(({"k": 1},)), uid="a")
    with pytest.raises(ConfigurationError, match="two distinct streams"):
        a.connect(a)


def _run(
    spark: Any, base: Path, name: str, failure: FailureInjection | None = None
) -> tuple[JobResult, str]:
    out = str(base / name / "out")
    options = JobOptions(
        job_id=f"connect-{name}",
        checkpoint=CheckpointConfig(mode=CheckpointingMode.EXACTLY_ONCE, interval_ms=1),
        checkpoint_dir=f"file://{base / name / 'chk'}",
        local_dir=str(base / name / "local"),
        parallelism=2,
        max_epoch_records=EPOCH_RECORDS,
        min_epoch_records=EPOCH_RECORDS,
        restart_strategy={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": "2",
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
    )
    env = StreamExecutionEnvironment(options)
    build(env, ORDERS, out)
    env.graph.name = "enrich-orders"
    return drive(env.graph, options, spark, failure), out


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Counter[str]:
    result, out = _run(spark, tmp_path_factory.mktemp("connect"), "baseline")
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    assert len(result.completed_checkpoints) >= 3
    assert hidden_files(out) == []
    return line_counts(out)


@pytest.mark.spark
def test_failure_free_connect_commits_what_the_oracle_computes(baseline: Counter[str]) -> None:
    assert baseline == oracle(ORDERS)


@pytest.mark.spark
@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            FailureInjection("alignment", subtask=0, checkpoint_id=2, vertex="enrich"),
            id="during-alignment-across-both-inputs",
        ),
        pytest.param(
            FailureInjection("keyed", subtask=1, records=50, at_epoch=2, vertex="per-region"),
            id="mid-epoch-second-stage",
        ),
        pytest.param(
            FailureInjection("alignment", subtask=1, checkpoint_id=3, vertex="per-region"),
            id="during-alignment-second-stage",
        ),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=0, checkpoint_id=2),
            id="after-pre-commit",
        ),
    ],
)
def test_connect_is_exactly_once_after_a_failure(
    engine: Any, tmp_path: Path, baseline: Counter[str], failure: FailureInjection
) -> None:
    result, out = _run(engine, tmp_path, "failed", failure)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2
    restored = restored_before_failure(result)
    assert restored is not None
    if failure.checkpoint_id:
        assert restored == failure.checkpoint_id - 1
    assert result.restores == [restored]
    assert line_counts(out) == baseline
    assert hidden_files(out) == []
