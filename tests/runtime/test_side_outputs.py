"""Side outputs: ``ctx.output(tag, value)`` in a KeyedProcessFunction goes to the sinks of
``get_side_output(tag)``, each with its own transactions. Exactly-once on Spark: a first
stage counts per user and sends every fifth visit to a side output; its main output is
re-keyed by region and counted. Failed mid-epoch and while aligning at the second stage, and
after the side output's sink pre-committed, both outputs equal a failure-free run's and a
plain-Python oracle's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.errors import ConfigurationError
from sparkpoint.functions import KeyedContext, KeyedProcessFunction, OutputTag
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import CheckpointingMode, JobStatus
from sparkpoint.runtime.driver import JobResult
from sparkpoint.state.descriptors import ValueStateDescriptor
from sparkpoint.testing import FailureInjection, ListSource, line_counts

from .keyed_stages_job import events, region_of, restored_before_failure
from .pv_harness import drive, hidden_files

EVENTS = 6_000
EPOCH_RECORDS = 500
MILESTONES = OutputTag("milestones")


class Visits(KeyedProcessFunction):
    """Per user: every visit goes on with its region; every fifth goes to a side output."""

    def open(self, ctx: KeyedContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("visits", 0))

    def process_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        if n % 5 == 0:
            ctx.output(MILESTONES, {"user": ctx.current_key, "visits": n})
        yield {"region": region_of(ctx.current_key)}


def build(env: StreamExecutionEnvironment, records: tuple[Any, ...], out: str) -> None:
    visits = (
        env.from_source(ListSource(records, splits=2), uid="events")
        .key_by("user")
        .process(Visits(), uid="visits")
    )
    visits.get_side_output(MILESTONES).sink_to(FileSink(f"{out}/milestones"), uid="milestones")
    (
        visits.key_by("region")
        .count(uid="per-region", output="visits")
        .sink_to(FileSink(f"{out}/regions"), uid="regions")
    )


def oracle(records: tuple[Any, ...]) -> dict[str, Counter[str]]:
    users = Counter(r["user"] for r in records)
    regions = Counter(region_of(r["user"]) for r in records)
    return {
        "milestones": Counter(
            f'{{"user": "{u}", "visits": {k}}}'
            for u, n in users.items()
            for k in range(5, n + 1, 5)
        ),
        "regions": Counter(
            f'{{"region": "{r}", "visits": {k}}}'
            for r, n in regions.items()
            for k in range(1, n + 1)
        ),
    }


def test_a_side_output_is_a_sink_of_its_vertex_and_needs_a_keyed_function(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment(JobOptions(job_id="side", parallelism=2))
    build(env, events(10), str(tmp_path))
    graph = env.graph
    assert [(n.uid, n.vertex, n.tag) for n in graph.sinks] == [
        ("milestones", "visits", "milestones"),
        ("regions", "per-region", None),
    ]
    assert graph.vertices()[1].operators == ["visits", "milestones"]
    source = env.from_source(ListSource(({"k": 1},)), uid="other")
    with pytest.raises(ConfigurationError, match="only a keyed function emits side outputs"):
        source.get_side_output(MILESTONES)


def _run(
    spark: Any, base: Path, name: str, failure: FailureInjection | None = None
) -> tuple[JobResult, str]:
    out = str(base / name / "out")
    options = JobOptions(
        job_id=f"side-{name}",
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
    build(env, events(EVENTS), out)
    env.graph.name = "side-outputs"
    return drive(env.graph, options, spark, failure), out


def _outputs(out: str) -> dict[str, Counter[str]]:
    for name in ("milestones", "regions"):
        assert hidden_files(f"{out}/{name}") == []
    return {name: line_counts(f"{out}/{name}") for name in ("milestones", "regions")}


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Counter[str]]:
    result, out = _run(spark, tmp_path_factory.mktemp("side"), "baseline")
    assert result.status is JobStatus.FINISHED
    assert result.restores == []
    return _outputs(out)


@pytest.mark.spark
def test_failure_free_side_outputs_equal_the_oracle(baseline: dict[str, Counter[str]]) -> None:
    assert baseline == oracle(events(EVENTS))


@pytest.mark.spark
@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            FailureInjection("keyed", subtask=1, records=60, at_epoch=3, vertex="per-region"),
            id="mid-epoch-second-stage",
        ),
        pytest.param(
            FailureInjection("alignment", subtask=0, checkpoint_id=2, vertex="per-region"),
            id="during-alignment-second-stage",
        ),
        pytest.param(
            FailureInjection("after_pre_commit", subtask=1, checkpoint_id=3, vertex="visits"),
            id="after-pre-commit-side-output-sink",
        ),
    ],
)
def test_side_outputs_are_exactly_once_after_a_failure(
    engine: Any, tmp_path: Path, baseline: dict[str, Counter[str]], failure: FailureInjection
) -> None:
    result, out = _run(engine, tmp_path, "failed", failure)
    assert result.status is JobStatus.FINISHED
    assert result.attempt == 2
    restored = restored_before_failure(result)
    assert restored is not None
    if failure.checkpoint_id:
        assert restored == failure.checkpoint_id - 1
    assert result.restores == [restored]
    assert _outputs(out) == baseline
