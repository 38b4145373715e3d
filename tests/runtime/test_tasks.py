"""The task code without Spark: barriers split the input exactly where the snapshot is taken."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpointing.barriers import CheckpointBarrier
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.clock import ManualClock
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.errors import InjectedFailure
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.protocol import AlignmentCompleted, CheckpointingMode, SinkPreCommitted
from sparkpoint.runtime.plan import EpochPlan, FailureInjection, SplitRange, StateInput
from sparkpoint.runtime.tasks import TaskInfo, run_keyed_task, run_source_task
from sparkpoint.runtime.working_state import WorkingStateLostError
from sparkpoint.state.hashmap import HashMapKeyedStateBackend
from sparkpoint.state.key_groups import key_group_range
from sparkpoint.testing import ListSource


def _graph(tmp_path: Path, records: list[dict[str, Any]], emit: str = "every") -> Any:
    env = StreamExecutionEnvironment(JobOptions(job_id="tasks", parallelism=1))
    (
        env.from_source(ListSource(tuple(records), splits=2), uid="src")
        .key_by("k")
        .count(uid="cnt", output="n", emit=emit)
        .sink_to(FileSink(str(tmp_path / "out")), uid="sink")
    )
    return env.graph


def _plan(
    tmp_path: Path,
    mode: CheckpointingMode,
    barrier_offset: int = 2,
    failure: FailureInjection | None = None,
    state: StateInput | None = None,
) -> EpochPlan:
    return EpochPlan(
        job_id="tasks",
        job_name="t",
        attempt=1,
        epoch=0,
        mode=mode,
        ranges=(
            SplitRange(0, "list-0", 0, 4, barrier_offset),
            SplitRange(1, "list-1", 0, 4, barrier_offset),
        ),
        barrier=CheckpointBarrier(1, 0),
        state_inputs={"cnt": (state or StateInput(),)},
        committed_up_to=0,
        storage=FileSystemCheckpointStorage(str(tmp_path / "chk")),
        local_dir=str(tmp_path / "local"),
        failure=failure,
    )


def _run(
    tmp_path: Path,
    mode: CheckpointingMode,
    order: tuple[int, int] = (0, 1),
    records: list[dict[str, Any]] | None = None,
    emit: str = "every",
    **kw: Any,
) -> tuple[Any, Any]:
    # Channel 0 holds keys a,a,a,a; channel 1 holds b,b,b,b (round-robin over 2 splits).
    if records is None:
        records = [{"k": k} for pair in zip("aaaa", "bbbb", strict=True) for k in pair]
    graph = _graph(tmp_path, records, emit)
    plan = _plan(tmp_path, mode, **kw)
    per_channel = [list(run_source_task(graph, plan, s, TaskInfo(s, s))) for s in (0, 1)]
    # Deliver whole channels one after the other, as Spark's shuffle reader does.
    elements = [e for ch in order for e in per_channel[ch]]
    reports = list(run_keyed_task(graph, plan, 0, iter(elements), TaskInfo(0, 9)))
    return plan, reports


def _snapshot_counts(plan: EpochPlan, report: Any) -> dict[str, int]:
    (ack,) = report.acks
    blobs = [plan.storage.read_state(h) for h in ack.handles]
    backend = HashMapKeyedStateBackend.restore(blobs, 128, key_group_range(0, 1, 128))
    return dict(backend.table("count"))


def test_exactly_once_snapshot_holds_only_records_before_the_barrier(tmp_path: Path) -> None:
    plan, (keyed, *sources) = _run(tmp_path, CheckpointingMode.EXACTLY_ONCE)
    assert _snapshot_counts(plan, keyed) == {"a": 2, "b": 2}
    (alignment,) = [e for e in keyed.events if isinstance(e, AlignmentCompleted)]
    assert alignment.buffered_records == 2  # a's records after its barrier waited for b's
    assert keyed.acks[0].alignment_buffered_bytes == alignment.buffered_bytes > 0
    assert keyed.records_in == 8
    positions = {k: v for r in sources for a in r.acks for k, v in a.source_positions.items()}
    assert positions == {"list-0": 2, "list-1": 2}


def test_at_least_once_snapshot_includes_records_after_an_early_barrier(tmp_path: Path) -> None:
    plan, (keyed, *_) = _run(tmp_path, CheckpointingMode.AT_LEAST_ONCE)
    # Channel 0 was read whole (barrier, then 2 more a's) before channel 1's barrier arrived.
    assert _snapshot_counts(plan, keyed) == {"a": 4, "b": 2}
    (alignment,) = [e for e in keyed.events if isinstance(e, AlignmentCompleted)]
    assert alignment.buffered_records == 0


def test_the_order_of_channels_does_not_change_an_aligned_snapshot(tmp_path: Path) -> None:
    plan, (keyed, *_) = _run(tmp_path, CheckpointingMode.EXACTLY_ONCE, order=(1, 0))
    assert _snapshot_counts(plan, keyed) == {"a": 2, "b": 2}


def test_sink_pre_commits_the_lines_before_the_barrier(tmp_path: Path) -> None:
    _, (keyed, *_) = _run(tmp_path, CheckpointingMode.EXACTLY_ONCE)
    (pre,) = [e for e in keyed.events if isinstance(e, SinkPreCommitted)]
    assert pre.transaction.records == 4
    assert keyed.acks[0].sink_transactions == [pre.transaction]
    part = tmp_path / "out" / pre.transaction.parts[0]
    assert sorted(part.read_text().splitlines()) == sorted(
        ['{"k": "a", "n": 1}', '{"k": "a", "n": 2}', '{"k": "b", "n": 1}', '{"k": "b", "n": 2}']
    )


def test_alignment_failure_is_raised_while_aligning(tmp_path: Path) -> None:
    with pytest.raises(InjectedFailure, match="while aligning checkpoint 1"):
        _run(
            tmp_path,
            CheckpointingMode.EXACTLY_ONCE,
            failure=FailureInjection("alignment", subtask=0, checkpoint_id=1),
        )


def test_a_working_state_version_that_is_not_on_disk_is_never_reused(tmp_path: Path) -> None:
    missing = StateInput(version="a1-e0-t3")
    with pytest.raises(
        WorkingStateLostError, match=r"a1-e0-t3 of cnt\[0\] is not on this executor"
    ):
        _run(tmp_path, CheckpointingMode.EXACTLY_ONCE, state=missing)


def test_emit_epoch_flushes_updates_before_the_barrier_into_its_transaction(
    tmp_path: Path,
) -> None:
    # Key "a" changes only before the barrier, "c" only after it.
    records = [{"k": k} for pair in zip("aacc", "bbbb", strict=True) for k in pair]
    _, (keyed, *_) = _run(tmp_path, CheckpointingMode.EXACTLY_ONCE, records=records, emit="epoch")
    (pre,) = [e for e in keyed.events if isinstance(e, SinkPreCommitted)]
    part = tmp_path / "out" / pre.transaction.parts[0]
    # What checkpoint 1 commits holds a's latest value: a restore from it loses nothing.
    assert sorted(part.read_text().splitlines()) == ['{"k": "a", "n": 2}', '{"k": "b", "n": 2}']


def test_an_injected_failure_says_when_the_task_raised_it(tmp_path: Path) -> None:
    graph = _graph(tmp_path, [{"k": "a"}] * 8)
    plan = _plan(
        tmp_path, CheckpointingMode.EXACTLY_ONCE, failure=FailureInjection("source", offset=3)
    )
    clock = ManualClock(1_700_000_000_123)
    with pytest.raises(InjectedFailure) as raised:
        list(run_source_task(graph, plan, 0, TaskInfo(0, 0), clock))
    assert str(raised.value) == (
        "injected failure in source src[0] at offset 3 of list-0 (job attempt 1, epoch 0) "
        "at unix time 1700000000.123"
    )
    assert raised.value.raised_at_ms == 1_700_000_000_123


class _SlowReads(FileSystemCheckpointStorage):
    """Checkpoint storage whose every state read takes 250 ms of ``clock``."""

    def __init__(self, root: str, clock: ManualClock) -> None:
        super().__init__(root)
        self.clock = clock

    def read_state(self, handle: Any) -> bytes:
        self.clock.advance(250)
        return super().read_state(handle)


def test_a_keyed_subtask_reports_how_long_its_restore_took_and_its_first_records(
    tmp_path: Path,
) -> None:
    plan, (keyed, *_) = _run(tmp_path, CheckpointingMode.EXACTLY_ONCE)
    assert keyed.restore_ms is None  # it opened empty state: nothing was restored
    (ack,) = keyed.acks
    clock = ManualClock(1_700_000_000_000)
    restoring = replace(
        plan,
        epoch=1,
        barrier=None,
        ranges=(SplitRange(0, "list-0", 2, 4), SplitRange(1, "list-1", 2, 4)),
        state_inputs={"cnt": (StateInput(handles=tuple(ack.handles), restored_from=1),)},
        restore_storage=_SlowReads(str(tmp_path / "chk"), clock),
    )
    graph = _graph(tmp_path, [{"k": k} for pair in zip("aaaa", "bbbb", strict=True) for k in pair])
    elements = [e for s in (0, 1) for e in run_source_task(graph, restoring, s, TaskInfo(s, s))]
    report, *_ = run_keyed_task(graph, restoring, 0, iter(elements), TaskInfo(0, 10), clock)
    assert report.restore_ms == 250.0 * len(ack.handles)
    assert report.first_record_wall_ms == 1_700_000_000_000 + 250 * len(ack.handles)
    assert report.records_in == 4
