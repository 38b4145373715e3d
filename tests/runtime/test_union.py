"""Several sources and ``union`` without Spark: the graph, the split ids, and the tasks run by
hand (one barrier handler aligns the channels of two different inputs)."""

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
from sparkpoint.protocol import AlignmentCompleted, BarrierReceived, CheckpointingMode
from sparkpoint.runtime.plan import EpochPlan, FailureInjection, SplitRange, StateInput
from sparkpoint.runtime.planner import planned_source
from sparkpoint.runtime.tasks import TaskInfo, run_keyed_task, run_source_task
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range
from sparkpoint.testing import ListSource

from .keyed_stages_job import build, clicks, events

N_EVENTS = 60  # 30 in each of 2 splits
N_CLICKS = 45  # 15 in each of 3 splits
BARRIER = 6


def _graph(tmp_path: Path) -> JobGraph:
    env = StreamExecutionEnvironment(JobOptions(job_id="union", parallelism=2))
    build(env, events(N_EVENTS), str(tmp_path / "out"), clicks=clicks(N_CLICKS))
    return env.graph


def test_a_union_of_two_sources_feeds_one_keyed_vertex(tmp_path: Path) -> None:
    graph = _graph(tmp_path)
    assert graph.edges() == [
        ("events", "per-user"),
        ("clicks", "per-user"),
        ("per-user", "per-region"),
    ]
    assert graph.tasks() == {"events": 2, "clicks": 3, "per-user": 2, "per-region": 2}
    per_user = graph.keyed_vertices[0]
    assert graph.channels(per_user) == 5
    assert graph.channel_offset(per_user, "clicks") == 2
    # Split ids stay unique across sources; the planner reads every source's splits.
    ids = [f"events/list-{i}" for i in range(2)] + [f"clicks/list-{i}" for i in range(3)]
    assert graph.split_ids() == planned_source(graph).split_ids() == ids
    assert planned_source(graph).read(3, 0, 2).rows == list(clicks(N_CLICKS)[1::3][:2])


def test_a_single_source_keeps_its_own_split_ids(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment(JobOptions(job_id="one", parallelism=1))
    build(env, events(4), str(tmp_path / "out"))
    assert env.graph.split_ids() == ["list-0", "list-1"]
    assert planned_source(env.graph) is env.graph.source.source


def test_union_refuses_a_stream_twice_and_a_stream_already_keyed(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment(JobOptions(job_id="u", parallelism=1))
    a = env.from_source(ListSource(({"k": 1},)), uid="a")
    b = env.from_source(ListSource(({"k": 2},)), uid="b")
    with pytest.raises(ConfigurationError, match="distinct streams"):
        a.union(a)
    b.key_by("k").count(uid="c")
    with pytest.raises(ConfigurationError, match="'b' is keyed twice"):
        a.union(b)


def _run(
    tmp_path: Path, failure: FailureInjection | None = None
) -> tuple[EpochPlan, list[Any], list[list[Any]]]:
    graph = _graph(tmp_path)
    sizes = [N_EVENTS // 2] * 2 + [N_CLICKS // 3] * 3
    plan = EpochPlan(
        job_id="union",
        job_name="t",
        attempt=1,
        epoch=0,
        mode=CheckpointingMode.EXACTLY_ONCE,
        ranges=tuple(
            SplitRange(i, sid, 0, n, BARRIER)
            for i, (sid, n) in enumerate(zip(graph.split_ids(), sizes, strict=True))
        ),
        barrier=CheckpointBarrier(1, 0),
        state_inputs={uid: (StateInput(),) * n for uid, n in graph.stateful().items()},
        committed_up_to=0,
        storage=FileSystemCheckpointStorage(str(tmp_path / "chk")),
        local_dir=str(tmp_path / "local"),
        failure=failure,
        chunk_records=4,
    )
    sources = [
        list(run_source_task(graph, plan, s, TaskInfo(s, s), vertex=uid))
        for uid, n in (("events", 2), ("clicks", 3))
        for s in range(n)
    ]

    def to(target: int, outputs: list[list[Any]]) -> list[Any]:
        return [e for out in outputs for e in out if e[0] == target]

    first = [
        list(run_keyed_task(graph, plan, t, to(t, sources), TaskInfo(t, 10 + t), vertex="per-user"))
        for t in (0, 1)
    ]
    reports = [
        r
        for t in (0, 1)
        for r in run_keyed_task(
            graph, plan, t, to(t, first), TaskInfo(t, 20 + t), vertex="per-region"
        )
    ]
    return plan, reports, sources


def test_the_keyed_vertex_aligns_the_channels_of_both_inputs(tmp_path: Path) -> None:
    plan, reports, sources = _run(tmp_path)
    by_task = {(r.operator_id, r.subtask): r for r in reports}
    assert len(by_task) == 2 + 3 + 2 + 2
    # Sources send on their channel at the keyed vertex: events 0-1, clicks 2-4.
    channels = {e[1][0] for out in sources for e in out}
    assert channels == {0, 1, 2, 3, 4}
    for t in (0, 1):
        report = by_task["per-user", t]
        # One barrier_received per input (the first of its channels to deliver the barrier:
        # the local runner hands them over in order), one alignment over all five channels.
        got = [e.channel for e in report.events if isinstance(e, BarrierReceived)]
        assert got == [0, 2]
        assert [type(e) for e in report.events].count(AlignmentCompleted) == 1
    positions = {
        k: v
        for (uid, _), r in by_task.items()
        if uid in ("events", "clicks")
        for a in r.acks
        for k, v in a.source_positions.items()
    }
    assert positions == {sid: BARRIER for sid in _graph(tmp_path).split_ids()}
    # Stage 1's snapshot holds exactly the records of both sources before their barriers.
    e, c = events(N_EVENTS), clicks(N_CLICKS)
    before = [r for s in range(2) for r in e[s::2][:BARRIER]]
    before += [r for s in range(3) for r in c[s::3][:BARRIER]]
    state: dict[str, int] = {}
    for t in (0, 1):
        (ack,) = by_task["per-user", t].acks
        blobs = [plan.storage.read_state(h) for h in ack.handles]
        backend = HashMapKeyedStateBackend.restore(blobs, 128, key_group_range(t, 2, 128))
        state |= dict(backend.table("count"))
    assert state == dict(Counter(r["user"] for r in before))


def test_an_alignment_failure_across_two_inputs_fails_the_first_stage(tmp_path: Path) -> None:
    failure = FailureInjection("alignment", subtask=0, checkpoint_id=1, vertex="per-user")
    with pytest.raises(InjectedFailure, match=r"per-user\[0\] while aligning checkpoint 1"):
        _run(tmp_path, failure)


def test_a_source_whose_stream_goes_nowhere_is_refused(tmp_path: Path) -> None:
    env = StreamExecutionEnvironment(JobOptions(job_id="nowhere", parallelism=1))
    env.from_source(ListSource(({"k": 1},)), uid="a").sink_to(FileSink(str(tmp_path)), uid="s")
    env.from_source(ListSource(({"k": 2},)), uid="b")
    with pytest.raises(ConfigurationError, match="stream of b goes to no sink"):
        env.execute("nowhere")
