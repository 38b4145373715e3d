"""The sinks' side of ``JobExecution.restore``, without Spark, on every sink (DESIGN §1).

A restore commits the restored checkpoint's transactions again and aborts every other part its
job wrote: the pre-committed parts of a later checkpoint that completed but was not committed,
and the open ones. What a later checkpoint committed stays (a sink cannot un-commit: replay
produces it again). Another job's parts stay.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint import protocol as p
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.clock import ManualClock
from sparkpoint.connectors.sinks import WriterContext
from sparkpoint.events import InMemoryEventSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.records import Batch
from sparkpoint.runtime.execution import JobExecution
from sparkpoint.runtime.planner import EpochPlanner
from sparkpoint.runtime.recovery import RestorePoint
from sparkpoint.testing import ListSource

from .conftest import Output

JOB, OTHER = "job-j", "job-k"


def _job(tmp_path: Path, output: Output) -> tuple[JobExecution, InMemoryEventSink]:
    options = JobOptions(
        job_id=JOB, checkpoint_dir=f"file://{tmp_path / 'chk'}", local_dir=str(tmp_path / "local")
    )
    env = StreamExecutionEnvironment(options)
    env.from_source(ListSource(tuple(range(8)), splits=1), uid="src").sink_to(
        output.sink, uid="sink"
    )
    clock, events = ManualClock(), InMemoryEventSink()
    assert options.checkpoint_dir is not None
    storage = FileSystemCheckpointStorage(options.checkpoint_dir)
    planner = EpochPlanner(
        env.graph.source.source, clock, target_ms=100, min_records=1, max_records=8
    )
    job = JobExecution(
        env.graph, options, clock, events, storage, planner, failure=None, durable=False
    )
    return job, events


def _ack(checkpoint_id: int, txn: p.SinkTransactionModel) -> p.SnapshotCompleted:
    return p.SnapshotCompleted(
        checkpoint_id=checkpoint_id,
        operator_id="src",
        subtask=0,
        epoch=0,
        ack_timestamp=0,
        start_delay_ms=0,
        alignment_duration_ms=0,
        alignment_buffered_bytes=0,
        sync_duration_ms=0,
        async_duration_ms=0,
        state_size=0,
        checkpointed_size=0,
        source_positions={"list-0": checkpoint_id},
        sink_transactions=[txn],
    )


def _rows(app: str, pv: int) -> Batch:
    return Batch.of_rows([{"app_id": app, "pv": pv}])


@pytest.mark.parametrize(("restored", "aborted"), [(1, 2), (3, 1)])
def test_a_restore_commits_its_checkpoint_and_aborts_the_rest_of_its_own_job(
    tmp_path: Path, output: Output, restored: int, aborted: int
) -> None:
    job, events = _job(tmp_path, output)
    # Checkpoints 1 and 2 completed and committed, 3 completed only; then an open transaction.
    writer = output.sink.writer(WriterContext(JOB, "sink", 0, 1, 0, 0), None)
    acks = {}
    for cid in (1, 2, 3):
        writer.write(_rows("j", cid))
        acks[cid] = _ack(cid, writer.pre_commit(cid))
    writer.write(_rows("j", 4))
    writer.close_epoch()
    job.commit(1, [acks[1]])
    job.commit(2, [acks[2]])
    # Another job, same output and sink uid: a pre-committed and an open part.
    other = output.sink.writer(WriterContext(OTHER, "sink", 0, 1, 0, 0), None)
    other.write(_rows("k", 1))
    other.pre_commit(1)
    other.write(_rows("k", 2))
    other.close_epoch()

    job.restore(RestorePoint(restored, 1, (acks[restored],)), None)

    (event,) = events.of_type(p.JobRestored)
    assert isinstance(event, p.JobRestored)
    assert (event.committed_transactions, event.aborted_parts) == (1, aborted)
    committed = [("j", 1), ("j", 2)] if restored == 1 else [("j", 1), ("j", 2), ("j", 3)]
    assert output.committed() == committed  # checkpoint 2's output stays when 1 is restored
    assert output.uncommitted() == 2  # the other job's
    assert job.committed_up_to == max(2, restored)


def test_commits_after_a_restore_sweep_the_parts_a_killed_task_of_an_earlier_attempt_wrote_late(
    tmp_path: Path, output: Output
) -> None:
    """A failed epoch's sibling task keeps running for up to ``spark.python.task.killTimeout``
    after Spark killed it: its part can appear after the restore aborted. The commits of the
    next minute sweep it up; the current attempt's own uncommitted parts stay."""
    job, _ = _job(tmp_path, output)
    clock = job.clock
    assert isinstance(clock, ManualClock)
    job.attempt = 2
    job.restore(None, None)
    # A zombie of attempt 1 writes after the restore; attempt 2 has an open and a sealed part.
    zombie = output.sink.writer(WriterContext(JOB, "sink", 1, 1, 3, 7), None)
    zombie.write(_rows("zombie", 1))
    zombie.close_epoch()
    writer = output.sink.writer(WriterContext(JOB, "sink", 0, 2, 1, 9), None)
    writer.write(_rows("j", 1))
    sealed = writer.pre_commit(1)
    writer.write(_rows("j", 2))
    writer.close_epoch()
    assert output.uncommitted() == 3

    job.commit(1, [_ack(1, sealed)])

    assert output.committed() == [("j", 1)]
    assert output.uncommitted() == 1  # attempt 2's open part, never the current attempt's
    # A minute later, one more sweep; after it the commits stop sweeping.
    late = output.sink.writer(WriterContext(JOB, "sink", 1, 1, 3, 8), None)
    late.write(_rows("zombie", 2))
    late.close_epoch()
    clock.advance(60_000)
    job.commit(2, [])
    assert output.uncommitted() == 1
    again = output.sink.writer(WriterContext(JOB, "sink", 1, 1, 3, 10), None)
    again.write(_rows("zombie", 3))
    again.close_epoch()
    job.commit(3, [])
    assert output.uncommitted() == 2  # past the window: no listing on every checkpoint
