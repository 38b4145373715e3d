"""Chained keyed stages without Spark: the graph a second ``key_by`` builds, and the tasks of
two keyed stages run by hand (barriers aligned again at the second stage, each stage's own
snapshot and acknowledgement)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.errors import ConfigurationError, InjectedFailure
from sparkpoint.graph import JobGraph, StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import AlignmentCompleted, CheckpointingMode
from sparkpoint.runtime.plan import EpochPlan, FailureInjection, SplitRange, StateInput
from sparkpoint.runtime.tasks import TaskInfo, run_keyed_task, run_source_task
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range
from sparkpoint.testing import ListSource

from .keyed_stages_job import EVERY, build, events, region_of

N = 60  # 30 per split
BARRIER = 12  # offset of the barrier in each split


def _graph(tmp_path: Path) -> JobGraph:
    env = StreamExecutionEnvironment(JobOptions(job_id="stages", parallelism=2))
    build(env, events(N), str(tmp_path / "out"))
    return env.graph


def test_a_second_key_by_builds_a_second_keyed_vertex_behind_its_own_exchange(
    tmp_path: Path,
) -> None:
    graph = _graph(tmp_path)
    assert [(v.id, v.operators) for v in graph.vertices()] == [
        ("events", ["events"]),
        ("per-user", ["per-user", "every-third", "to-region"]),
        ("per-region", ["per-region", "sink"]),
    ]
    assert graph.edges() == [("events", "per-user"), ("per-user", "per-region")]
    assert graph.tasks() == {"events": 2, "per-user": 2, "per-region": 2}
    # Working state: every keyed vertex; the source has no sink, so none.
    assert graph.stateful() == {"per-user": 2, "per-region": 2}


def test_a_stream_feeds_one_keyed_vertex_and_operators_go_before_its_sink(
    tmp_path: Path,
) -> None:
    env = StreamExecutionEnvironment(JobOptions(job_id="shape", parallelism=1))
    counted = env.from_source(ListSource(({"k": 1},)), uid="src").key_by("k").count(uid="c")
    counted.key_by("k").count(uid="c2")
    with pytest.raises(ConfigurationError, match="'c' is keyed twice"):
        counted.key_by("k")
    tail = StreamExecutionEnvironment(JobOptions(job_id="tail", parallelism=1))
    stream = tail.from_source(ListSource(({"k": 1},)), uid="src")
    stream.sink_to(FileSink(str(tmp_path)), uid="out")
    with pytest.raises(ConfigurationError, match="after its stream was keyed or sunk"):
        stream.map(lambda r: r, uid="late")


def _plan(tmp_path: Path, graph: JobGraph, failure: FailureInjection | None = None) -> EpochPlan:
    half = N // 2
    return EpochPlan(
        job_id="stages",
        job_name="t",
        attempt=1,
        epoch=0,
        mode=CheckpointingMode.EXACTLY_ONCE,
        ranges=(
            SplitRange(0, "list-0", 0, half, BARRIER),
            SplitRange(1, "list-1", 0, half, BARRIER),
        ),
        barrier=CheckpointBarrier(1, 0),
        state_inputs={uid: (StateInput(),) * n for uid, n in graph.stateful().items()},
        committed_up_to=0,
        storage=FileSystemCheckpointStorage(str(tmp_path / "chk")),
        local_dir=str(tmp_path / "local"),
        failure=failure,
        chunk_records=4,
    )


def _to(target: int, outputs: list[list[Any]]) -> list[Any]:
    """What subtask ``target`` of the next stage reads: each upstream channel whole, in order
    (as Spark's shuffle reader delivers them)."""
    return [e for out in outputs for e in out if e[0] == target]


def _run(tmp_path: Path, failure: FailureInjection | None = None) -> tuple[EpochPlan, list[Any]]:
    graph = _graph(tmp_path)
    plan = _plan(tmp_path, graph, failure)
    sources = [list(run_source_task(graph, plan, s, TaskInfo(s, s))) for s in (0, 1)]
    first = [
        list(
            run_keyed_task(graph, plan, t, _to(t, sources), TaskInfo(t, 10 + t), vertex="per-user")
        )
        for t in (0, 1)
    ]
    reports = [
        r
        for t in (0, 1)
        for r in run_keyed_task(
            graph, plan, t, _to(t, first), TaskInfo(t, 20 + t), vertex="per-region"
        )
    ]
    return plan, reports


def _snapshot(plan: EpochPlan, report: Any, subtask: int) -> dict[str, int]:
    (ack,) = report.acks
    blobs = [plan.storage.read_state(h) for h in ack.handles]
    backend = HashMapKeyedStateBackend.restore(blobs, 128, key_group_range(subtask, 2, 128))
    return dict(backend.table("count"))


def test_each_stage_aligns_snapshots_and_acknowledges_with_its_own_state(tmp_path: Path) -> None:
    plan, reports = _run(tmp_path)
    by_task = {(r.operator_id, r.subtask): r for r in reports}
    assert sorted(by_task) == [
        (uid, i) for uid in ("events", "per-region", "per-user") for i in (0, 1)
    ]
    records = events(N)
    before = records[0::2][:BARRIER] + records[1::2][:BARRIER]
    users = Counter(r["user"] for r in before)
    regions: Counter[str] = Counter()
    for user, n in users.items():
        regions[region_of(user)] += n // EVERY
    # Stage 1 holds exactly the records before the barrier; so does stage 2, one exchange on.
    user_state = {**_snapshot(plan, by_task["per-user", 0], 0)}
    user_state |= _snapshot(plan, by_task["per-user", 1], 1)
    assert user_state == dict(users)
    region_state = {**_snapshot(plan, by_task["per-region", 0], 0)}
    region_state |= _snapshot(plan, by_task["per-region", 1], 1)
    assert region_state == {r: n for r, n in regions.items() if n}
    # The second stage aligned its own inputs: records of an early channel waited.
    aligned = [
        e
        for i in (0, 1)
        for e in by_task["per-region", i].events
        if isinstance(e, AlignmentCompleted)
    ]
    assert len(aligned) == 2
    assert sum(e.buffered_records for e in aligned) > 0
    for uid in ("per-user", "per-region"):
        for i in (0, 1):
            (ack,) = by_task[uid, i].acks
            assert ack.operator_id == uid and ack.handles
            assert all(f"{uid}-{i}-" in h.path for h in ack.handles)


def test_an_alignment_failure_at_the_second_stage_fails_there(tmp_path: Path) -> None:
    failure = FailureInjection("alignment", subtask=1, checkpoint_id=1, vertex="per-region")
    with pytest.raises(InjectedFailure, match=r"per-region\[1\] while aligning checkpoint 1"):
        _run(tmp_path, failure)
