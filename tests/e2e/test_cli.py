"""`sparkpoint run` end to end: a separate process, a failure, recovery, committed output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.testing import line_counts

from ..runtime.pv_harness import expected_every_lines

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.long]  # make test-long, not CI


def _sparkpoint(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("sparkpoint")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [str(exe), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _run_pv(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``sparkpoint run`` of the PV job: 12,000 events, 7 apps, small epochs, 0.2 s checkpoints."""
    return _sparkpoint(
        "run",
        "jobs/examples/pv_count.py",
        "--standalone",
        "--checkpoint-dir",
        f"file://{tmp_path / 'chk'}",
        "--checkpoint-interval",
        "0.2",
        "--max-epoch-records",
        "1000",
        "--local-dir",
        str(tmp_path / "local"),
        "--restart-delay",
        "0",
        "--events",
        "12000",
        "--apps",
        "7",
        "--rate",
        "0",
        "--output",
        str(tmp_path / "out"),
        *extra,
    )


def test_run_with_fail_after_recovers_and_commits_exactly_once(tmp_path: Path) -> None:
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    proc = _run_pv(tmp_path, "--events-log", str(events), "--fail-after", "2500")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"committed output in {out}" in proc.stdout
    assert line_counts(str(out)) == expected_every_lines()
    # What the user reads: one line per thing that happened, no stack traces (Spark's own
    # log, with the task failure's traceback, is in the file the failure line names).
    lines = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr and "\tat org.apache" not in proc.stderr, proc.stderr
    [failure] = [line for line in lines if "ERROR: attempt 1 failed in epoch" in line]
    assert "InjectedFailure: injected failure in source events[0] at offset 2500" in failure
    spark_log = failure.split("Spark's log: ")[1].rstrip(")")
    assert spark_log.startswith(str(tmp_path / "local" / "logs"))
    assert "InjectedFailure" in Path(spark_log).read_text()
    assert any("starting; checkpoints every 0.2 s" in line for line in lines)
    assert any("attempt 2 restored from checkpoint" in line for line in lines)
    [end] = [line for line in lines if ": FINISHED: " in line]  # records read, replays included
    assert "1 restores" in end
    types = [json.loads(line)["type"] for line in events.read_text().splitlines()]
    for kind in (
        "job_registered",
        "checkpoint_triggered",
        "barrier_injected",
        "barrier_received",
        "alignment_completed",
        "snapshot_completed",
        "sink_pre_committed",
        "checkpoint_completed",
        "sink_committed",
        "task_failed",
        "job_restored",
        "heartbeat",
        "job_status",
    ):
        assert kind in types, kind
    statuses = [
        json.loads(line)["payload"]["status"]
        for line in events.read_text().splitlines()
        if json.loads(line)["type"] == "job_status"
    ]
    assert statuses == ["RUNNING", "RESTARTING", "RUNNING", "FINISHED"]


def test_invalid_option_exits_2_naming_it(tmp_path: Path) -> None:
    proc = _sparkpoint(
        "run",
        "jobs/examples/pv_count.py",
        "--standalone",
        "--checkpoint-interval",
        "-1",
        "--output",
        str(tmp_path),
    )
    assert proc.returncode == 2
    assert "--checkpoint-interval must be >= 0 seconds, got -1.0" in proc.stderr


def test_missing_job_file_exits_2(tmp_path: Path) -> None:
    proc = _sparkpoint("run", str(tmp_path / "nope.py"))
    assert proc.returncode == 2
    assert "no such job file" in proc.stderr


def test_a_killed_driver_is_restarted_from_its_latest_checkpoint(tmp_path: Path) -> None:
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    proc = _run_pv(
        tmp_path,
        "--job-id",
        "crashy",
        "--events-log",
        str(events),
        "--crash-after-checkpoint",
        "3",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "driver of job crashy died (killed by SIGKILL); restarting from file://" in proc.stderr
    assert "chk-3" in proc.stderr
    # Checkpoint 3 completed but its sink never committed before the crash: the new driver
    # committed it on restore, and the output is exactly the source's.
    assert line_counts(str(out)) == expected_every_lines()
    restored = [
        json.loads(line)
        for line in events.read_text().splitlines()
        if json.loads(line)["type"] == "job_restored"
    ]
    assert [r["payload"]["checkpoint_id"] for r in restored] == [3]
    assert restored[0]["attempt"] == 2
    assert restored[0]["payload"]["committed_transactions"] == 2


def test_two_executor_jvms_recover_exactly_once(tmp_path: Path) -> None:
    """``local-cluster`` starts two executor JVMs: subtasks land on either, epoch by epoch."""
    out = tmp_path / "out"
    proc = _run_pv(tmp_path, "--master", "local-cluster[2,1,1024]", "--fail-after", "2500")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [end] = [line for line in proc.stderr.splitlines() if ": FINISHED: " in line]
    assert "1 restores" in end
    assert line_counts(str(out)) == expected_every_lines()
