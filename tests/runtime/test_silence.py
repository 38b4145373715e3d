"""A connected job that hears no command from its control plane says so once, and says when
commands come again (the control plane's restart while a job runs)."""

from __future__ import annotations

import io
from pathlib import Path

from sparkpoint import protocol as p
from sparkpoint.checkpointing.config import CheckpointConfig
from sparkpoint.checkpointing.storage import FileSystemCheckpointStorage
from sparkpoint.clock import ManualClock
from sparkpoint.connectors.sinks import FileSink
from sparkpoint.console import Console
from sparkpoint.events import InMemoryEventSink
from sparkpoint.graph import StreamExecutionEnvironment
from sparkpoint.options import JobOptions
from sparkpoint.runtime.execution import JobExecution
from sparkpoint.runtime.planner import EpochPlanner
from sparkpoint.runtime.silence import Silence
from sparkpoint.testing import ListSource

TRIGGER = p.TriggerCheckpoint(checkpoint_id=7, trigger_timestamp=0)


def _job(tmp_path: Path, **config: int) -> tuple[JobExecution, ManualClock, io.StringIO]:
    options = JobOptions(
        job_id="job-s",
        standalone=False,
        checkpoint=CheckpointConfig(**config),
        checkpoint_dir=f"file://{tmp_path / 'chk'}",
        local_dir=str(tmp_path / "local"),
    )
    env = StreamExecutionEnvironment(options)
    env.from_source(ListSource((1, 2, 3), splits=1), uid="src").sink_to(
        FileSink(str(tmp_path / "out")), uid="sink"
    )
    clock = ManualClock()
    planner = EpochPlanner(
        env.graph.source.source, clock, target_ms=100, min_records=1, max_records=3
    )
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))
    job = JobExecution(
        env.graph,
        options,
        clock,
        InMemoryEventSink(),
        storage,
        planner,
        failure=None,
        durable=False,
    )
    out = io.StringIO()
    job.console = Console("job-s", stream=out)
    return job, clock, out


def test_ten_intervals_without_a_command_are_said_once_and_the_return_too(
    tmp_path: Path,
) -> None:
    job, clock, out = _job(tmp_path, interval_ms=5_000)
    silence = Silence(job)
    clock.advance(49_999)
    silence.check()
    assert out.getvalue() == ""  # ten intervals of 5 s: 50 s
    clock.advance(1)
    silence.check()
    clock.advance(30_000)
    silence.check()
    assert out.getvalue().splitlines() == [
        "sparkpoint job-s: WARNING: no command from the control plane for 50 s (checkpoints "
        "every 5 s): the job runs on, but its sinks commit nothing until checkpoints complete "
        "again; is `sparkpoint server` running on this Redis?"
    ]
    silence.heard(TRIGGER)
    silence.heard(TRIGGER)
    assert out.getvalue().splitlines()[1:] == [
        "sparkpoint job-s: WARNING: the control plane's commands come again, after 80 s without one"
    ]


def test_the_wait_is_at_least_30_s_and_follows_configuration_changes(tmp_path: Path) -> None:
    job, _clock, _out = _job(tmp_path, interval_ms=1_000)
    silence = Silence(job)
    assert silence.quiet_ms() == 30_000
    silence.heard(p.ConfigurationChanged(changes={"interval_ms": 10_000, "min_pause_ms": 2_000}))
    assert silence.quiet_ms() == 120_000
    silence.heard(p.ConfigurationChanged(changes={"interval_ms": 0}))
    assert silence.quiet_ms() is None  # periodic checkpoints off: none expected


def test_a_job_without_periodic_checkpoints_expects_no_command(tmp_path: Path) -> None:
    job, clock, out = _job(tmp_path)
    silence = Silence(job)
    clock.advance(3_600_000)
    silence.check()
    assert out.getvalue() == ""


def test_the_wait_for_a_restart_decision_is_no_silence(tmp_path: Path) -> None:
    """After a failure the control plane sends nothing until the restart strategy's delay
    ends (exponential-delay reaches a minute): that wait is not counted."""
    job, clock, out = _job(tmp_path, interval_ms=1_000)
    silence = Silence(job)
    for _ in range(12):  # two minutes, waiting for the decision
        clock.advance(10_000)
        silence.check(paused=True)
    clock.advance(29_000)
    silence.check()
    assert out.getvalue() == ""
    clock.advance(1_000)
    silence.check()
    assert "no command from the control plane for 30 s" in out.getvalue()
