"""A job catching up on a backlog keeps completing checkpoints: the planner never grows an
epoch past what the checkpoint timeout allows.

Before, a paced job far behind grew its epochs toward the whole backlog. Once one epoch ran
longer than the checkpoint timeout, the checkpoint it carried expired; with no tolerable
failures the job failed over to its last checkpoint, found the same backlog, grew the same
epochs, and never got past it (a 12 M backlog with a 3 s timeout: 16 restores in 10 minutes,
one checkpoint completed). The epochs here run in process on a manual clock that each epoch
advances by a fixed overhead and a cost per record, as Spark's would take on this machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples import pv_count
from sparkpoint import protocol as p
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.clock import ManualClock
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime import driver
from sparkpoint.runtime.local import LocalEpochRunner
from sparkpoint.runtime.plan import EpochPlan, TaskReport
from sparkpoint.runtime.planner import CHECKPOINT_TIMEOUT_SHARE
from sparkpoint.testing import line_counts

EVENTS = 1_500_000  # all of them behind at the start (the backlog)
APPS = 100
OVERHEAD_MS = 300.0
PER_RECORD_MS = 0.005  # 200 k records/s
TIMEOUT_MS = 3_000


class CostlyEpochs(LocalEpochRunner):
    """In-process epochs that take ``OVERHEAD_MS`` plus ``PER_RECORD_MS`` a record on the
    job's manual clock."""

    clock = ManualClock()
    per_record_ms = PER_RECORD_MS

    def run(self, plan: EpochPlan) -> list[TaskReport]:
        reports = super().run(plan)
        records = sum(r.records for r in plan.ranges)
        self.clock.advance(OVERHEAD_MS + self.per_record_ms * records)
        return reports


def _run(
    tmp_path: Path, timeout_ms: int, rate: int = 1000, events: int = EVENTS, start_up_ms: int = 0
) -> tuple[driver.JobDriver, dict[str, int]]:
    """The PV job over a backlog of ``events`` on the manual clock (with ``rate`` 0: unpaced),
    ``start_up_ms`` passing between the driver's creation and its first epoch (Spark starting);
    its driver and each app's last committed count."""
    clock = ManualClock()
    CostlyEpochs.clock = clock
    options = JobOptions(
        job_id="behind",
        checkpoint=CheckpointConfig(interval_ms=1_000, timeout_ms=timeout_ms),
        checkpoint_dir=f"file://{tmp_path / 'chk'}",
        checkpoint_storage="filesystem",
        local_dir=str(tmp_path / "local"),
        min_epoch_records=1_000,
        restart_strategy={"restart-strategy.type": "none"},  # an expiry would end the job
    )
    env = StreamExecutionEnvironment(options)
    out = str(tmp_path / "out")
    argv = ["--events", str(events), "--apps", str(APPS), "--rate", str(rate)]
    pv_count.build(env, [*argv, "--backlog", str(events), "--emit", "epoch", "--output", out])
    job = driver.JobDriver(env.graph, options, clock=clock, in_process=True)
    clock.advance(start_up_ms)
    job.run()
    last: dict[str, int] = {}
    for line in line_counts(out):
        row = json.loads(line)
        last[row["app_id"]] = max(last.get(row["app_id"], 0), row["pv"])
    return job, last


def test_a_job_far_behind_completes_its_checkpoints_while_it_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver, "LocalEpochRunner", CostlyEpochs)
    # Flink's default timeout (10 min): the catch-up epochs grow as large as they like.
    free, expected = _run(tmp_path / "free", 600_000)
    assert max(_durations(free)) > TIMEOUT_MS  # what would expire the checkpoints below

    job, counts = _run(tmp_path / "behind", TIMEOUT_MS)

    assert not job.memory.of_type(p.CheckpointAborted)
    assert not job.memory.of_type(p.JobRestored)
    # The first epoch reads min_records per split (start-up); every later one is sized
    # within the budget from what the epochs before it cost.
    assert max(_durations(job)) <= CHECKPOINT_TIMEOUT_SHARE * TIMEOUT_MS * 1.1
    assert counts == expected and sum(counts.values()) == EVENTS
    # Its heartbeats say which epochs were held back, and by how much (the dashboard shows it).
    beats = [b for b in job.memory.of_type(p.Heartbeat) if isinstance(b, p.Heartbeat)]
    held = {b.epoch_bound_ms for b in beats}
    assert held == {None, CHECKPOINT_TIMEOUT_SHARE * TIMEOUT_MS}
    assert all(b.epoch_bound_ms is None for b in free.memory.of_type(p.Heartbeat))


def _durations(job: driver.JobDriver) -> list[float]:
    """Each epoch's duration on the manual clock."""
    beats = [b for b in job.memory.of_type(p.Heartbeat) if isinstance(b, p.Heartbeat)]
    return [OVERHEAD_MS + CostlyEpochs.per_record_ms * b.records for b in beats]


def test_a_slow_function_does_not_expire_the_first_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 us a record, unpaced, a 3 s timeout, Spark 2 s in starting (so a checkpoint is due
    at once): the job's first epoch read FIRST_EPOCH_RECORDS per split (10 s) with checkpoint
    1 riding it, which expired and failed the job. Now that epoch reads min_records per split
    and carries no checkpoint, and the next is bounded."""
    monkeypatch.setattr(driver, "LocalEpochRunner", CostlyEpochs)
    monkeypatch.setattr(CostlyEpochs, "per_record_ms", 0.05)
    job, counts = _run(tmp_path, TIMEOUT_MS, rate=0, events=400_000, start_up_ms=2_000)

    assert not job.memory.of_type(p.CheckpointAborted)
    assert not job.memory.of_type(p.JobRestored)
    assert len(job.memory.of_type(p.CheckpointCompleted)) > 3
    assert max(_durations(job)) <= CHECKPOINT_TIMEOUT_SHARE * TIMEOUT_MS
    assert sum(counts.values()) == 400_000
